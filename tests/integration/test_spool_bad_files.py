"""Bad files in a spool never stop the agent (issue 13's acceptance), with the real ``aaco agent`` process.

Dropped in this order: a real Kineto trace with ``"correlation": 2**80`` in one kernel event, 200 KB of
unclosed ``[`` (after a Kineto header: a bare run of ``[`` is not recognised as a trace and never
reaches a parser), then the two real Kineto traces. Both good traces land, the bad ones are
quarantined and counted, the agent stays healthy and small, and a restart does not read the bad
files again.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import get_free_port

from .helpers import http_get, metric_value, read_lake, wait_for
from .test_trace_sources import all_committed, checkpoints, kineto_truth, spool_config

pytestmark = pytest.mark.integration

A100 = "a100_alexnet_trace.json.gz"
MI250 = "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
# The agent's address space is capped: on the machine running the suite, a parser that runs away
# meets a MemoryError (counted out_of_memory, which fails this test) instead of the OOM killer.
ADDRESS_SPACE_KIB = 4 << 20
GIB = 1 << 30


def overflow_trace(samples: Path) -> bytes:
    """The A100 trace, uncompressed, with one kernel's correlation beyond 64 bits."""
    doc = json.loads(gzip.decompress((samples / "kineto" / A100).read_bytes()))
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    kernel["args"]["correlation"] = 2**80
    return json.dumps(doc).encode()


def drop(spool: Path, name: str, data: bytes, mtime_ns: int) -> Path:
    """Write a file beside the spool's listing (hidden), then rename it in, with a set mtime (the read order)."""
    tmp = spool / f".{name}.tmp"
    tmp.write_bytes(data)
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    path = spool / name
    tmp.rename(path)
    return path


def start_agent(aaco_bin: str, cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    """``aaco agent --config CFG`` (exec'd by the shell that caps its address space: the pid is the agent's)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            ["bash", "-c", f'ulimit -v {ADDRESS_SPACE_KIB} && exec "$0" "$@"', aaco_bin, "agent", "--config", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def peak_rss(pid: int) -> int:
    """VmHWM of a running process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def source_errors(metrics: str, source: str) -> dict[str, float]:
    """aaco_source_errors_total of one source, by reason."""
    out = {}
    for line in metrics.splitlines():
        if line.startswith("aaco_source_errors_total{") and f'source="{source}"' in line:
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


def files_read(base: str) -> float:
    """aaco_source_files_total of the spool: files it finished with, well or not."""
    return metric_value(http_get(base + "/metrics")[1], "aaco_source_files_total", source="trace_dir") or 0


def records(lake: Path) -> dict[str, int]:
    """Events the agent says it read from each file (sources.json)."""
    doc = json.loads((lake / "sources.json").read_text())
    return {Path(r["subject"]).name: r["events"]["kernels"] for r in doc["sources"]}


def stop(agent: subprocess.Popen[bytes]) -> int:
    """SIGTERM: the agent flushes and exits; its exit status."""
    agent.send_signal(signal.SIGTERM)
    return agent.wait(30)


def test_bad_files_are_quarantined_and_the_spool_goes_on(tmp_path, aaco_bin, samples):
    spool, lake = tmp_path / "spool", tmp_path / "lake"
    spool.mkdir()
    port = get_free_port()
    base = f"http://127.0.0.1:{port}"
    cfg = spool_config(tmp_path / "agent.yaml", spool, lake, port)
    log = tmp_path / "agent.log"
    agent = start_agent(aaco_bin, cfg, log)
    try:
        wait_for(lambda: http_get(base + "/readyz")[0] == 200, 60, what="agent ready")
        t0 = time.time_ns() - 60 * 10**9
        bad = [
            drop(spool, "1_overflow.json", overflow_trace(samples), t0),
            drop(spool, "2_open_brackets.json", b'{"schemaVersion": 1, "traceEvents": ' + b"[" * (200 << 10), t0 + 1),
        ]
        # 200 KB of bare `[`: no trace at all; kept aside as bad input, counted, not looked at again
        bare = drop(spool, "3_bare_brackets.json", b"[" * (200 << 10), t0 + 1)
        good = [
            drop(spool, A100, (samples / "kineto" / A100).read_bytes(), t0 + 2),
            drop(spool, MI250, (samples / "kineto" / MI250).read_bytes(), t0 + 3),
        ]
        wait_for(lambda: files_read(base) >= 4, 120, what="every file read")
        metrics = http_get(base + "/metrics")[1]
        errors = source_errors(metrics, "trace_dir")
        assert "out_of_memory" not in errors, errors  # the parsers bound their work: no MemoryError was needed
        wait_for(lambda: all_committed(lake, bad + good), 120, what="every file committed")
        wait_for(lambda: os.fspath(bare) in checkpoints(lake), 60, what="the bare brackets set aside")
        assert checkpoints(lake)[os.fspath(bare)]["meta"]["quarantined"] is True
        assert source_errors(http_get(base + "/metrics")[1], "trace_dir")["unrecognised"] == 1
        assert http_get(base + "/healthz") == (200, "ok\n")
        assert http_get(base + "/readyz") == (200, "ok\n")
        rss = peak_rss(agent.pid)
        assert stop(agent) == 0  # a daemon stopped cleanly exits 0: the bad input is counted, not an exit status
    finally:
        if agent.poll() is None:
            agent.kill()

    assert sum(errors.values()) >= 2, errors  # each bad file counted
    assert "aaco_source_restarts_total" not in metrics  # the source never died
    assert 'aaco_source_lag_seconds{source="trace_dir"}' not in metrics  # complete files of 2023-2024: no lag
    assert rss < GIB, f"peak RSS {rss / GIB:.2f} GiB"

    truth = {name: sum(n for n, _ in kineto_truth(samples / "kineto" / name).values()) for name in (A100, MI250)}
    read = records(lake)
    assert {name: read[name] for name in truth} == truth  # both good traces, every event
    kernels = read_lake(lake, "kernels")
    assert kernels.num_rows == sum(read.values())  # what landed is what was read, the bad files' kept rows too
    assert read["2_open_brackets.json"] == 0
    assert read["1_overflow.json"] in (0, truth[A100] - 1)  # nothing, or all but the bad event

    quarantined = sorted(p.name for p in (lake / "quarantine" / "trace_dir").iterdir())
    assert {q.removesuffix(".bad") for q in quarantined} == {p.name for p in [*bad, bare]}  # the file, or its bad lines
    text = log.read_text()
    assert all(str(p) in text for p in [*bad, bare]) and not any(str(p) in text for p in good)
    assert "Traceback" not in text

    # A restart reads only what is new: the bad files are not read (nor counted, nor logged) again.
    log2 = tmp_path / "agent2.log"
    agent = start_agent(aaco_bin, cfg, log2)
    try:
        wait_for(lambda: http_get(base + "/readyz")[0] == 200, 60, what="the restarted agent ready")
        again = drop(spool, "5_again.json.gz", (samples / "kineto" / MI250).read_bytes(), time.time_ns())
        wait_for(lambda: all_committed(lake, [again]), 120, what="the new file committed")
        metrics = http_get(base + "/metrics")[1]
        rss = peak_rss(agent.pid)
        assert stop(agent) == 0  # nothing bad met this time
    finally:
        if agent.poll() is None:
            agent.kill()
    assert not any(source_errors(metrics, "trace_dir").values())  # every reason at 0
    assert rss < GIB
    assert read_lake(lake, "kernels").num_rows == kernels.num_rows + truth[MI250]
    assert not any(str(p) in log2.read_text() for p in [*bad, bare])
    assert sorted(p.name for p in (lake / "quarantine" / "trace_dir").iterdir()) == quarantined
