"""Bad input: one clear error naming the file and what is wrong, exit 2, no traceback."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import zlib

import pyarrow.compute as pc
import pytest

from .helpers import read_lake, run_aaco, run_aaco_each

pytestmark = pytest.mark.integration


# ``aaco`` with a parser that raises at the end of files named bad*: what the CLI does with a file that
# fails part-way (a parser bug, not bad input the parser counts).
FAILING_PARSER = """
from aaco.agent.sources import ingest
real = ingest.parse_any
def parse_any(tf, tctx, max_bytes, read=None):
    yield from real(tf, tctx, max_bytes=max_bytes, read=read)
    if tf.path.name.startswith("bad"):
        raise KeyError("correlation")
ingest.parse_any = parse_any
from aaco.agent.cli import app
app(prog_name="aaco")
"""


def assert_clean_error(proc, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    text = " ".join(proc.stderr.split())  # rich may wrap long lines
    for needle in needles:
        assert needle in text, (needle, proc.stderr)


def test_missing_model(tmp_path, aaco_bin):
    missing = tmp_path / "nope.onnx"
    proc = run_aaco(aaco_bin, "run", "--model", str(missing), "--out", str(tmp_path / "D"), "--no-progress")
    assert_clean_error(proc, str(missing), "not found")


def test_corrupt_model(tmp_path, aaco_bin):
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x08\x07this is not a protobuf model\xff\xfe" * 50)
    proc = run_aaco(aaco_bin, "run", "--model", str(bad), "--out", str(tmp_path / "D"), "--no-progress")
    assert_clean_error(proc, str(bad), "not a valid ONNX model")


def test_truncated_model(tmp_path, aaco_bin, resnet50):
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(resnet50.read_bytes()[:5000])
    proc = run_aaco(aaco_bin, "run", "--model", str(bad), "--out", str(tmp_path / "D"), "--no-progress")
    assert_clean_error(proc, str(bad))


def test_unavailable_provider(tmp_path, aaco_bin):
    proc = run_aaco(aaco_bin, "run", "--provider", "migraphx", "--out", str(tmp_path / "D"), "--no-progress")
    assert_clean_error(proc, "--provider", "not available")


def test_unrecognised_trace(tmp_path, aaco_bin):
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": "world"}')
    proc = run_aaco(aaco_bin, "replay", str(junk), "--out", str(tmp_path / "D"))
    assert_clean_error(proc, str(junk), "not a recognised trace")


def test_missing_trace(tmp_path, aaco_bin):
    missing = tmp_path / "gone.json"
    proc = run_aaco(aaco_bin, "replay", str(missing), "--out", str(tmp_path / "D"))
    assert_clean_error(proc, str(missing), "no such file")


def test_truncated_trace_keeps_the_good_file(tmp_path, aaco_bin, samples):
    data = gzip.decompress((samples / "kineto" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz").read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) // 2])
    good = samples / "kineto" / "a100_alexnet_trace.json.gz"
    out = tmp_path / "D"
    proc = run_aaco(aaco_bin, "replay", str(good), str(cut), "--out", str(out))
    assert_clean_error(proc, str(cut), "truncated JSON at byte", "kept the events before the cut")
    assert f"truncated JSON at byte {len(data) // 2}:" in proc.stderr  # where the cut is
    kernels = read_lake(out, "kernels")
    assert (
        kernels.filter(
            pc.field("run_id").isin([r for r in set(kernels["run_id"].to_pylist()) if r.startswith("a100")])
        ).num_rows
        == 98
    )  # the good file made it
    assert (out / "quarantine" / "replay" / "cut.json").exists()  # the damaged file is kept for a look


def test_corrupt_gzip_trace(tmp_path, aaco_bin, samples):
    raw = (samples / "kineto" / "a100_alexnet_trace.json.gz").read_bytes()
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(raw[: len(raw) // 3])
    proc = run_aaco(aaco_bin, "replay", str(bad), "--out", str(tmp_path / "D"))
    assert_clean_error(proc, str(bad))


def test_bad_config_lists_every_error(tmp_path, aaco_bin):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "node: n1\n"
        "sources:\n"
        "  - type: ort\n"
        "    iterations: -3\n"
        "    colour: blue\n"
        "  - type: warp-drive\n"
        "exporters:\n"
        "  prometheus: {port: 99999}\n"
        "bogus: 1\n"
    )
    for args in (("config", "check", str(cfg)), ("agent", "--config", str(cfg))):
        proc = run_aaco(aaco_bin, *args)
        assert_clean_error(
            proc,
            str(cfg),
            "sources[0].iterations",
            "sources[0].colour: unknown key",
            "sources[1].type",
            "warp-drive",
            "exporters.prometheus.port",
            "bogus: unknown key",
        )


def test_config_yaml_syntax_error(tmp_path, aaco_bin):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("sources:\n  - type: ort\n   iterations: 3\n")
    proc = run_aaco(aaco_bin, "config", "check", str(cfg))
    assert_clean_error(proc, str(cfg), "line 3")


def test_config_missing_file(tmp_path, aaco_bin):
    proc = run_aaco(aaco_bin, "agent", "--config", str(tmp_path / "absent.yaml"))
    assert_clean_error(proc, "absent.yaml", "file not found")


def test_bad_usage_exits_2(aaco_bin):
    proc = run_aaco(aaco_bin, "run", "--iterations", "zero")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    proc = run_aaco(aaco_bin, "replay")
    assert proc.returncode == 2


def test_help_on_every_command(aaco_bin):
    commands = ((), ("run",), ("replay",), ("agent",), ("config",), ("config", "check"), ("graph",), ("version",))
    for args, proc in zip(commands, run_aaco_each(aaco_bin, *((*c, "--help") for c in commands)), strict=True):
        assert proc.returncode == 0, args
        assert "Usage" in proc.stdout


def test_damaged_json_is_named_for_what_it_is(tmp_path, aaco_bin, samples):
    data = gzip.decompress((samples / "kineto" / "a100_alexnet_trace.json.gz").read_bytes())
    at = data.index(b'"cat": "kernel"', len(data) // 2)
    broken = tmp_path / "broken.json"
    broken.write_bytes(data[:at] + b'"cat" "kernel"' + data[at + len(b'"cat": "kernel"') :])  # one event
    out = tmp_path / "D"
    proc = run_aaco(aaco_bin, "replay", str(broken), "--out", str(out))
    assert proc.returncode == 0, proc.stderr  # one event lost, the others kept: a warning, as a bad CSV row
    start = data.rindex(b"{", 0, at)  # the broken event
    assert f"warning: {broken}: invalid JSON at byte {start} (1 place(s))" in " ".join(proc.stderr.split())
    assert "truncated" not in proc.stderr
    assert read_lake(out, "kernels").num_rows == 98 - 1  # every GPU event but the broken one
    assert (out / "quarantine" / "replay" / broken.name).read_bytes() == broken.read_bytes()
    junk = tmp_path / "junk.json"
    head = b'{"schemaVersion": 1, "traceEvents": ['
    junk.write_bytes(head + b"not json at all]}")
    proc = run_aaco(aaco_bin, "replay", str(junk), "--out", str(tmp_path / "E"))
    assert_clean_error(proc, str(junk), f"invalid JSON at byte {len(head)}")
    assert "truncated" not in proc.stderr


def test_deep_nesting_names_the_limit(tmp_path, aaco_bin):
    deep = tmp_path / "deep.json"
    deep.write_bytes(b'{"schemaVersion": 1, "traceEvents": ' + b"[" * 200_000)
    proc = run_aaco(aaco_bin, "replay", str(deep), "--out", str(tmp_path / "D"))
    assert_clean_error(proc, str(deep), "nested deeper than 128 levels (max_json_depth) at byte 163")


def test_damaged_gzip_keeps_the_rows_before_the_damage(tmp_path, aaco_bin, samples):
    raw = (samples / "kineto" / "a100_alexnet_trace.json.gz").read_bytes()
    bad = tmp_path / "half.json.gz"
    bad.write_bytes(raw[: len(raw) // 2])
    out = tmp_path / "D"
    proc = run_aaco(aaco_bin, "replay", str(bad), "--out", str(out))
    decoded = len(zlib.decompressobj(31).decompress(raw[: len(raw) // 2]))  # what zlib gives before the cut
    assert_clean_error(
        proc,
        str(bad),
        "truncated JSON",
        f"damaged gzip stream at byte {decoded} of the decompressed content: kept what was decompressed before",
    )
    assert 0 < read_lake(out, "kernels").num_rows < 98
    assert (out / "quarantine" / "replay" / bad.name).read_bytes() == bad.read_bytes()


def test_nesting_past_the_limit_after_good_events_keeps_them(tmp_path, aaco_bin, samples):
    doc = json.loads(gzip.decompress((samples / "kineto" / "a100_alexnet_trace.json.gz").read_bytes()))
    doc["traceEvents"] = doc.pop("traceEvents")  # last, so the damage ends the document
    head = json.dumps(doc).encode().removesuffix(b"]}") + b", "
    deep = tmp_path / "deep.json"
    deep.write_bytes(head + b"[" * 200)
    out = tmp_path / "D"
    proc = run_aaco(aaco_bin, "replay", str(deep), "--out", str(out))
    assert_clean_error(proc, str(deep), "JSON nested deeper than max_json_depth at byte", "kept the events before it")
    at = int(re.search(r"max_json_depth at byte (\d+)", proc.stderr)[1])
    assert len(head) <= at < len(head) + 200
    assert read_lake(out, "kernels").num_rows == 98  # every GPU event before the damage
    assert (out / "quarantine" / "replay" / deep.name).exists()


def test_a_file_that_fails_part_way_fails_the_replay(tmp_path, samples):
    bad, good = tmp_path / "bad.json.gz", tmp_path / "good.json.gz"
    bad.write_bytes((samples / "kineto" / "a100_alexnet_trace.json.gz").read_bytes())
    good.write_bytes((samples / "kineto" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz").read_bytes())
    out = tmp_path / "D"
    proc = subprocess.run(
        [sys.executable, "-c", FAILING_PARSER, "replay", str(bad), str(good), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    # an error, not a warning (the file was not read completely), though its events before the failure are kept
    assert_clean_error(proc, f"error: {bad}: KeyError: 'correlation' (kept the 98 event(s) before it)")
    assert read_lake(out, "kernels").num_rows == 98 + 16  # both files' events
