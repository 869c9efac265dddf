"""Trace file recognition: sniff by content, gzip by content, identify errors, expand directories."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
from pathlib import Path

import pytest

from aaco.agent.sources.traces.detect import identify, recognise, sniff
from aaco.agent.sources.traces.files import expand, read_all, read_head
from aaco.contract.errors import TraceFormatError

ORT = (
    b'[\n{"cat" : "Session","pid" :1,"tid" :1,"dur" :5,"ts" :1,"ph" : "X","name" :"model_loading_uri","args" : {}}\n]\n'
)
ORT_NODE_FIRST = b'  [{"cat":"Node","name":"a_kernel_time","ts":1,"dur":1}]'
KINETO = b'{"schemaVersion": 1, "deviceProperties": [], "traceEvents": []}'


@pytest.mark.parametrize(
    ("head", "fmt"),
    [
        (ORT, "ort_profile"),
        (ORT_NODE_FIRST, "ort_profile"),
        (b'[{"cat":"Kernel","name":"k"}]', "ort_profile"),
        (KINETO, "kineto"),
        (b'\n  {"traceEvents": [', None),  # a bare Chrome trace head: not enough to call it Kineto
        (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k"}', "kineto"),
        (b'{"baseTimeNanoseconds": 1', "kineto"),
        (b'{"foo": 1}', None),
        (b'[{"cat":"Api","name":"x"}]', None),
        (b'[{"args": [1], "cat": "Session"}]', None),  # a list before the category: not ORT's layout
        (b"[1, 2, 3]", None),
        (b"Kind,Agent_Id,Queue_Id\n", None),
        (b"", None),
        (b"\x00\x01binary", None),
    ],
)
def test_sniff(head, fmt):
    assert sniff(head) == fmt


def test_sniff_real_samples(samples):
    for name in ("kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz", "kineto/a100_alexnet_trace.json.gz"):
        assert sniff(read_head(samples / name)) == "kineto"
    # real files of other formats are not mistaken for ours
    assert sniff(read_head(samples / "rocprofv3/kernel_trace.csv")) == "rocprofv3_kernel_csv"
    assert sniff(read_head(samples / "rocm-smi/mi100_rocm602.json")) is None
    assert sniff(read_head(samples / "amd-smi/amd-smi-metric.json")) is None


def test_rocprof_v1_chrome_trace_is_not_kineto(samples):
    assert sniff(read_head(samples / "rocprof-v1/hip_trace_results.json")) == "rocprof_v1_json"


def test_identify_real_kineto_sample(samples):
    tf = identify(samples / "kineto/a100_alexnet_trace.json.gz")
    assert tf.format == "kineto"
    st = (samples / "kineto/a100_alexnet_trace.json.gz").stat()
    assert tf.size == st.st_size
    assert tf.mtime_ns == st.st_mtime_ns
    assert len(tf.identity) == 24


def test_gzip_detected_by_content_not_name(tmp_path):
    disguised = tmp_path / "profile.json"  # actually gzip
    disguised.write_bytes(gzip.compress(ORT))
    plain_gz = tmp_path / "trace.json.gz"  # actually plain
    plain_gz.write_bytes(KINETO)
    assert read_head(disguised) == ORT
    assert read_all(disguised) == ORT
    assert read_head(plain_gz) == KINETO
    assert identify(disguised).format == "ort_profile"
    assert identify(plain_gz).format == "kineto"


def test_read_head_limits_bytes(tmp_path):
    p = tmp_path / "big.json"
    p.write_bytes(b"[" + b" " * 100_000 + b"]")
    assert len(read_head(p, 10)) == 10


def test_read_all_refuses_beyond_limit(tmp_path):
    content = KINETO + b" " * 10_000  # compresses well below its size
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(content))
    assert read_all(p, max_bytes=len(content)) == content
    with pytest.raises(TraceFormatError, match=r"decompressed content passed .* byte limit") as exc:
        read_all(p, max_bytes=len(content) - 1)
    assert "max_file_bytes" in exc.value.hint
    with pytest.raises(TraceFormatError, match=r"file is \d+ bytes, over the 10 byte limit \(max_file_bytes\)"):
        read_all(p, max_bytes=10)


def test_truncated_gzip_is_a_trace_format_error(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(KINETO * 100)[:40])
    with pytest.raises(TraceFormatError, match="cannot read"):
        read_all(p)


def test_identity_depends_on_content(tmp_path):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_bytes(KINETO)
    b.write_bytes(KINETO)
    c.write_bytes(KINETO.replace(b"1", b"2"))
    assert identify(a).identity == identify(b).identity
    assert identify(a).identity != identify(c).identity


def test_identify_missing(tmp_path):
    with pytest.raises(TraceFormatError, match="no such file") as exc:
        identify(tmp_path / "nope.json")
    assert exc.value.subject == os.fspath(tmp_path / "nope.json")


def test_identify_directory(tmp_path):
    with pytest.raises(TraceFormatError, match="is a directory"):
        identify(tmp_path)


def test_identify_empty(tmp_path):
    p = tmp_path / "empty.json"
    p.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty file"):
        identify(p)


def test_identify_unreadable(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode; the directory case above covers unreadable input")
    p = tmp_path / "secret.json"
    p.write_bytes(KINETO)
    p.chmod(0)
    try:
        with pytest.raises(TraceFormatError, match="not readable"):
            identify(p)
    finally:
        p.chmod(0o600)


def test_identify_junk(tmp_path):
    p = tmp_path / "junk.json"
    p.write_bytes(b'{"hello": "world"}')
    with pytest.raises(TraceFormatError, match="not a recognised trace"):
        identify(p)


def test_identify_junk_gzip(tmp_path):
    p = tmp_path / "junk.gz"
    p.write_bytes(gzip.compress(b"just text"))
    with pytest.raises(TraceFormatError, match="not a recognised trace"):
        identify(p)


def test_expand_files_and_directories(tmp_path):
    d = tmp_path / "traces"
    (d / "sub").mkdir(parents=True)
    (d / ".hidden").mkdir()
    for rel in ("b.json", "a.json.gz", "sub/c.json", ".dot.json", ".hidden/x.json"):
        (d / rel).write_bytes(KINETO)
    single = tmp_path / "single.json"
    single.write_bytes(KINETO)
    missing = tmp_path / "missing.json"
    out = expand([single, d, missing])
    assert out == [single, d / "a.json.gz", d / "b.json", d / "sub" / "c.json", missing]


def test_expand_relative_directory(tmp_path, monkeypatch):
    d = tmp_path / "traces"
    d.mkdir()
    (d / "a.json").write_bytes(KINETO)
    monkeypatch.chdir(tmp_path)
    assert expand([Path("traces")]) == [Path("traces/a.json")]


@pytest.mark.parametrize("how", ["hidden-parent", "dotdot"])
def test_expand_directory_below_a_hidden_one(tmp_path, monkeypatch, how):
    d = tmp_path / ".cache" / "traces"
    d.mkdir(parents=True)
    (d / "a.json").write_bytes(KINETO)
    if how == "hidden-parent":
        assert expand([d]) == [d / "a.json"]
    else:
        (tmp_path / "work").mkdir()
        shutil.copy(d / "a.json", tmp_path / "work" / "a.json")
        monkeypatch.chdir(tmp_path / "work")
        assert expand([Path("../work")]) == [Path("../work/a.json")]


def test_identity_is_the_whole_content(tmp_path):
    head = KINETO[:-1] + b', "pad": "' + b"x" * (70 * 1024) + b'", "v": '
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "sub" / "c.json"
    a.write_bytes(head + b"1}")
    b.write_bytes(head + b"2}")  # same size, same first 64 KiB and more: another file
    c.parent.mkdir()
    c.write_bytes(a.read_bytes())  # the same content elsewhere: the same file
    ia, ib, ic = identify(a), identify(b), identify(c)
    assert ia.size == ib.size
    assert read_head(a) == read_head(b)
    assert ia.identity != ib.identity
    assert ia.identity == ic.identity == hashlib.sha256(a.read_bytes()).hexdigest()[:24]


def test_recognise_gives_the_format_without_reading_it_all(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(KINETO)
    fmt, st = recognise(p)
    assert fmt == "kineto" and st.st_size == len(KINETO)


def test_special_files_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    with pytest.raises(TraceFormatError, match="not a regular file"):
        identify(fifo)
    loop = tmp_path / "loop.json"
    loop.symlink_to(tmp_path / "loop2.json")
    (tmp_path / "loop2.json").symlink_to(loop)
    with pytest.raises(TraceFormatError, match="cannot stat") as exc:
        identify(loop)
    assert exc.value.subject == os.fspath(loop)
