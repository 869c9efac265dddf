"""Kernel trace sources end to end: exact replays, continuous tailing, exactly once across kill -9."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest
import yaml

from tests.conftest import get_free_port
from tests.support import tracegen
from tests.unit.test_rocprof_json import build, write

from .helpers import http_get, read_lake, run_aaco, run_aaco_each, start_aaco, wait_for

pytestmark = pytest.mark.integration


def lake_kernels(out: Path):
    return read_lake(out, "kernels")


def by_kind(t) -> dict[str, int]:
    return {r["kind"]: r["start_ns_count"] for r in t.group_by("kind").aggregate([("start_ns", "count")]).to_pylist()}


def summed(t, kind=None) -> int:
    if kind is not None:
        t = t.filter(pc.equal(t["kind"], kind))
    return pc.sum(pc.subtract(t["end_ns"], t["start_ns"])).as_py() or 0


KINETO_KINDS = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "memcpy": "memcpy",
    "memset": "memset",
}


def kineto_truth(path: Path) -> dict[str, tuple[int, int]]:
    """Counts and summed durations (ns, from the JSON's microseconds) per kind, computed here.

    Categories in any case: PyTorch 1.8 and 1.9 wrote ``Kernel``, ``Memcpy``, ``Memset``.
    """
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    out: dict[str, tuple[int, int]] = {}
    for e in events:
        kind = KINETO_KINDS.get(str(e.get("cat")).lower())
        if kind and e.get("ph") == "X":
            n, d = out.get(kind, (0, 0))
            out[kind] = (n + 1, d + round(e["dur"] * 1000))
    return out


def test_replay_of_every_sample_is_exact(tmp_path, aaco_bin, samples):
    csv_path = samples / "rocprofv3" / "kernel_trace.csv"
    kineto = {
        "mi250_minitoy_train_ROCm6_2_kineto.json.gz": {"kernel": 14, "memcpy": 2},
        "a100_alexnet_trace.json.gz": {"kernel": 79, "memcpy": 16, "memset": 3},
    }
    v1 = samples / "rocprof-v1" / "hip_trace_results.json"
    inputs = {"v3": csv_path, **{name: samples / "kineto" / name for name in kineto}, "v1": v1}
    # the replays are independent (a lake each): side by side
    for proc in run_aaco_each(aaco_bin, *(("replay", str(p), "--out", str(tmp_path / o)) for o, p in inputs.items())):
        assert proc.returncode == 0, proc.stderr

    # rocprofv3 CSV: 9 kernels; durations straight from the CSV
    k = lake_kernels(tmp_path / "v3")
    rows = list(csv.reader(io.StringIO(csv_path.read_text())))[1:]
    assert by_kind(k) == {"kernel": 9}
    assert summed(k) == sum(int(r[10]) - int(r[9]) for r in rows)

    # Kineto, MI250 (ROCm) and A100 (CUDA)
    for name, expected in kineto.items():
        k = lake_kernels(tmp_path / name)
        assert by_kind(k) == expected
        truth = kineto_truth(samples / "kineto" / name)
        for kind, (n, d) in truth.items():
            assert (expected[kind], summed(k, kind)) == (n, d), kind

    # rocprof v1 results.json: 6 copies (and the one kernel), the HIP calls as their launches
    k = lake_kernels(tmp_path / "v1")
    assert by_kind(k) == {"memcpy": 6, "kernel": 1}
    events = json.loads(v1.read_text())["traceEvents"]
    copies = [e for e in events if e.get("ph") == "X" and e.get("pid") == "1"]
    assert summed(k, "memcpy") == sum(int(e["args"]["EndNs"]) - int(e["args"]["BeginNs"]) for e in copies)
    assert k.column("launch_name").null_count == 0  # every GPU op got its HIP call
    assert set(k.column("launch_name").to_pylist()) == {"hipMemcpyWithStream", "hipLaunchKernel"}


KINETO_TB = Path(__file__).resolve().parents[1] / "data" / "kineto-tb"
# PyTorch 1.8 / 1.9 traces: (count, summed ns) per kind, as the files state them (tests/data/kineto-tb/README.md)
OLD_KINETO = {
    "samples_resnet50_num_workers_0_worker0.pt.trace.json.gz": {
        "kernel": (9564, 640_354_000),
        "memcpy": (12, 12_734_000),
        "memset": (439, 439_000),
    },
    "samples_resnet50_num_workers_0_worker0.1623143089861.pt.trace.json.gz": {
        "kernel": (8772, 591_532_000),
        "memcpy": (12, 11_492_000),
        "memset": (312, 534_000),
    },
    "test_gpu_metrics_input.json.gz": {"kernel": (30, 48_000), "memcpy": (2, 2_000)},
}


def test_pytorch_1_8_and_1_9_kineto_traces_replay_exactly(tmp_path, aaco_bin):
    """Capitalised categories (``Kernel``, ``Memcpy``, ``Memset``): every GPU event in the lake, none warned about."""
    names = sorted(OLD_KINETO)
    procs = run_aaco_each(aaco_bin, *(("replay", str(KINETO_TB / n), "--out", str(tmp_path / n)) for n in names))
    for name, proc in zip(names, procs, strict=True):
        assert proc.returncode == 0, proc.stderr
        assert "warning" not in proc.stderr.lower(), proc.stderr
        truth = kineto_truth(KINETO_TB / name)
        assert truth == OLD_KINETO[name]
        k = lake_kernels(tmp_path / name)
        assert {kind: (n, summed(k, kind)) for kind, n in by_kind(k).items()} == truth
        its = read_lake(tmp_path / name, "iterations")
        assert its.num_rows == (1 if name.startswith("test_") else 6)  # ProfilerStep#N, written as operators


ROCPROF_DIR = Path(__file__).resolve().parents[1] / "data" / "rocprofv3-dir"


def test_a_rocprofv3_directory_replays_and_names_the_files_it_does_not_read(tmp_path, aaco_bin, samples):
    """Statistics and counters beside the traces: named once each as warnings, the traces read, exit 0."""
    out = tmp_path / "host" / "4242"
    shutil.copytree(ROCPROF_DIR, out, ignore=shutil.ignore_patterns("README.md"))
    shutil.copy(samples / "rocprofv3" / "kernel_trace.csv", out / "kernel_trace.csv")
    proc = run_aaco(aaco_bin, "replay", str(tmp_path / "host"), "--out", str(tmp_path / "lake"))
    assert proc.returncode == 0, proc.stderr
    for name in ("counter_collection.csv", "hip_api_stats.csv", "kernel_names.csv"):
        lines = [line for line in proc.stderr.splitlines() if name in line]
        assert len(lines) == 1 and lines[0].startswith("warning:") and "not read" in lines[0], proc.stderr
    assert "not a recognised trace" not in proc.stderr and "error" not in proc.stderr.lower()
    k = lake_kernels(tmp_path / "lake")
    copies = list(csv.DictReader(io.StringIO((out / "memory_copy_trace.csv").read_text())))
    assert by_kind(k) == {"kernel": 9, "memcpy": len(copies)}
    assert summed(k, "memcpy") == sum(int(r["End_Timestamp"]) - int(r["Start_Timestamp"]) for r in copies)
    assert read_lake(tmp_path / "lake", "iterations").num_rows == 2  # the outermost rocTX ranges per thread
    read = {Path(r["subject"]).name for r in json.loads((tmp_path / "lake" / "sources.json").read_text())["sources"]}
    assert read == {"kernel_trace.csv", "memory_copy_trace.csv", "marker_api_trace.csv", "hsa_api_trace.csv"}


def test_rocprofv3_json_of_40k_dispatches_replays_exactly(tmp_path, aaco_bin):
    doc, truth = build(40_000)
    path = write(tmp_path / "results.json", doc)
    proc = run_aaco(aaco_bin, "replay", str(path), "--out", str(tmp_path / "D"))
    assert proc.returncode == 0, proc.stderr
    k = lake_kernels(tmp_path / "D")
    kernels = k.filter(pc.equal(k["kind"], "kernel"))
    assert kernels.num_rows == 40_000
    assert summed(kernels) == truth["total"]
    counts = {
        r["name"]: r["start_ns_count"] for r in kernels.group_by("name").aggregate([("start_ns", "count")]).to_pylist()
    }
    assert counts == truth["names"]  # names resolved from kernel_symbols, each as often as dispatched


def spool_config(path: Path, spool: Path, lake: Path, port: int | None = None) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "node": "spool-node",
                "sources": [{"type": "trace_dir", "path": str(spool), "poll_interval_s": 0.1, "settle_s": 0.5}],
                "exporters": {
                    "prometheus": {"enabled": port is not None, "port": port or 9464},
                    "lake": {"path": str(lake), "flush_interval_s": 0.3},
                },
                "pipeline": {"snapshot_interval_s": 0.5},
            }
        )
    )
    return path


def checkpoints(lake: Path) -> dict[str, dict]:
    p = lake / "checkpoints" / "offsets.json"
    try:
        return {v["meta"]["path"]: v for v in json.loads(p.read_text())["inputs"].values()}
    except (OSError, ValueError, KeyError):
        return {}


def committed_offsets(lake: Path) -> dict[str, int]:
    return {path: v["offset"] for path, v in checkpoints(lake).items()}


def all_committed(lake: Path, files: list[Path]) -> bool:
    """Tailed files: offsets in bytes up to their size; whole files: all their chunks."""
    got = checkpoints(lake)

    def done(f: Path) -> bool:
        v = got.get(os.fspath(f))
        if v is None:
            return False
        chunks = v["meta"].get("chunks")
        return v["offset"] >= (chunks if chunks is not None else f.stat().st_size)

    return all(done(f) for f in files)


class Writer(threading.Thread):
    """Appends rocprofv3 rows to a kernel trace in ragged pieces (half lines included)."""

    def __init__(self, samples: Path, path: Path, total: int, per_write: int, pause_s: float) -> None:
        super().__init__(daemon=True)
        self.samples, self.path, self.total, self.per_write, self.pause = samples, path, total, per_write, pause_s
        header, _ = tracegen.sample_rows(samples)
        path.write_text(header + "\n")
        self.durations = 0

    def run(self) -> None:
        written = 0
        with self.path.open("a") as fh:
            while written < self.total:
                n = min(self.per_write, self.total - written)
                pairs = tracegen.rocprofv3_lines(self.samples, n, written)
                self.durations += sum(d for _, d in pairs)
                text = "".join(line for line, _ in pairs)
                cut = len(text) // 2 + 7  # somewhere inside a line
                fh.write(text[:cut])
                fh.flush()
                time.sleep(self.pause / 2)
                fh.write(text[cut:])
                fh.flush()
                written += n
                time.sleep(self.pause / 2)


def test_tail_while_a_writer_appends(tmp_path, aaco_bin, samples):
    spool, lake = tmp_path / "spool", tmp_path / "lake"
    spool.mkdir()
    port = get_free_port()
    cfg = spool_config(tmp_path / "agent.yaml", spool, lake, port)
    log = tmp_path / "agent.log"
    agent = start_aaco(aaco_bin, "agent", "--config", str(cfg), log=log)
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 60, what="agent ready")
        writer = Writer(samples, spool / "4242_kernel_trace.csv", total=6000, per_write=250, pause_s=0.1)
        writer.start()
        writer.join(60)
        wait_for(lambda: all_committed(lake, [writer.path]), 60, what="the tailed file committed")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(20) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
    k = lake_kernels(lake)
    assert k.num_rows == 6000
    assert len(set(k.column("correlation_id").to_pylist())) == 6000  # no duplicates
    assert summed(k) == writer.durations
    assert not (lake / "quarantine").exists()  # nothing was bad: partial lines were held back, not broken
    assert "Traceback" not in log.read_text()


def test_kill_9_and_restart_lose_nothing_and_double_nothing(tmp_path, aaco_bin, samples):
    spool, lake = tmp_path / "spool", tmp_path / "lake"
    spool.mkdir()
    port = get_free_port()
    cfg = spool_config(tmp_path / "agent.yaml", spool, lake, port)
    tracegen.kineto(samples, spool / "step_trace.json", kernels=30_000)
    (spool / "run1").mkdir()
    (spool / "run1" / "77_kernel_trace.csv").write_text((samples / "rocprofv3" / "kernel_trace.csv").read_text())
    writer = Writer(samples, spool / "4242_kernel_trace.csv", total=60_000, per_write=3000, pause_s=0.15)
    writer.start()
    kills = 0
    deadline = time.monotonic() + 240
    while True:
        agent = start_aaco(aaco_bin, "agent", "--config", str(cfg), log=tmp_path / f"agent{kills}.log")
        if kills < 2:
            # let it commit part of the work, then kill it without warning
            before = sum(committed_offsets(lake).values())
            wait_for(lambda b=before: sum(committed_offsets(lake).values()) > b, 60, what="progress")
            time.sleep(0.3 + 0.4 * kills)
            agent.send_signal(signal.SIGKILL)
            agent.wait(10)
            kills += 1
            continue
        writer.join(120)
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 60, what="the last agent ready")
        files = [spool / "step_trace.json", spool / "run1" / "77_kernel_trace.csv", writer.path]
        wait_for(lambda f=files: all_committed(lake, f), max(1.0, deadline - time.monotonic()), what="all committed")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(20) == 0
        break
    k = lake_kernels(lake)
    key = pc.binary_join_element_wise(
        k["run_id"], pc.cast(k["correlation_id"], "string"), pc.cast(k["start_ns"], "string"), "|"
    )
    assert len(pc.unique(key)) == k.num_rows  # not one event twice
    counts = k.group_by("run_id").aggregate([("start_ns", "count")]).to_pylist()
    runs = {r["run_id"].split(":")[0]: r["start_ns_count"] for r in counts}
    assert len(runs) == len(counts)  # one capture identity per file, the growing one too, across restarts
    assert runs == {"step_trace": 30_000, "77_kernel_trace": 9, "4242_kernel_trace": 60_000}  # not one lost
    tailed = k.filter(pc.starts_with(k["run_id"], "4242_kernel_trace"))
    assert summed(tailed) == writer.durations
