"""Holistic Trace Analysis' own Kineto traces (``examples/data/kineto-hta``) through the real ``aaco`` CLI.

Every file replays with exactly its GPU events: per kind (kernel, memcpy, memset) the lake holds as
many rows as the file has ``ph: "X"`` events of ``cat`` ``kernel`` / ``gpu_memcpy`` / ``gpu_memset``,
and their summed ``end_ns - start_ns`` is the sum of their ``dur`` in nanoseconds exactly as the
trace states it. The reference is computed here from the file with ``gzip`` and ``json`` alone, the
numbers read as decimals (the trace's own text, no float rounding). Start times are checked too:
``baseTimeNanoseconds + ts * 1000`` when the trace has a base, else ``ts * 1000`` (epoch
microseconds), within the rounding of a double holding ``ts`` (125 ns for the epoch microseconds
with a nanosecond fraction of ``ns_resolution_*``, see ``agent/sources/kineto.py``). CPU-only ranks
replay with no kernels and no error.

The control/test pair gives a regression verdict with ``aaco diff``; ``docs/kineto_hta.md`` explains
it, and the last tests pin what that explanation rests on, from the traces themselves.
"""

from __future__ import annotations

import functools
import gzip
import json
import statistics
import subprocess
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import numpy as np
import orjson
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from aaco.agent.sources.traces.kineto import parse_kineto

HTA = "kineto-hta"
KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
FILES = (
    "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "critical_path_cuda_event_sync_event_sync_trace.json.gz",
    "critical_path_cuda_event_sync_multi_stream_event_sync_trace.json.gz",
    "critical_path_simple_add_trace.json.gz",
    "cupti_profiler_trace.json.gz",
    "distributed_info_unavailable_distributed_info_not_found.json.gz",
    "mtia_inference_trace_mtia_inference_rank_0.json.gz",
    "nccl_parser_config_nccl_data.json.gz",
    "negative_queue_length_values_check_rank0.json.gz",
    "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "rank_non_gpu_rank_non_gpu.json.gz",
    "timeline_analysis_sampled_rank-0.json.gz",
    "trace_diff_control_control.json.gz",
    "trace_diff_test_test.json.gz",
    "triton_example_triton_example.json.gz",
)
# No GPU events: CPU-only ranks, CUPTI profiler ranges without kernels, an MTIA accelerator (not a GPU)
NO_GPU = {
    "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "cupti_profiler_trace.json.gz",
    "distributed_info_unavailable_distributed_info_not_found.json.gz",
    "mtia_inference_trace_mtia_inference_rank_0.json.gz",
    "rank_non_gpu_rank_non_gpu.json.gz",
}
CONTROL, TEST = "trace_diff_control_control.json.gz", "trace_diff_test_test.json.gz"


def load(path: Path, exact: bool = True) -> dict:
    """The trace, its numbers as decimals (``exact``) or as the parser's loader reads them (orjson)."""
    with gzip.open(path, "rt" if exact else "rb") as fh:
        return json.load(fh, parse_float=Decimal) if exact else orjson.loads(fh.read())


def stem(name: str) -> str:
    return name.removesuffix(".gz").removesuffix(".json")


@functools.cache
def reference(path: Path) -> tuple[dict[str, tuple[int, int]], list[int], int]:
    """Per kind (count, summed ns); the sorted epoch-ns starts; the start tolerance in ns."""
    doc = load(path)
    base = int(doc.get("baseTimeNanoseconds") or 0)
    totals: dict[str, list[int]] = {}
    starts: list[int] = []
    biggest = Decimal(0)
    for ev in doc["traceEvents"]:
        if ev.get("ph") == "X" and ev.get("cat") in KINDS:
            t = totals.setdefault(KINDS[ev["cat"]], [0, 0])
            t[0] += 1
            t[1] += int((Decimal(ev["dur"]) * 1000).to_integral_value())
            starts.append(base + int((Decimal(ev["ts"]) * 1000).to_integral_value()))
            biggest = max(biggest, abs(Decimal(ev["ts"])))
    # a double holding ts is off by at most half its spacing; 1 ns more for rounding to whole ns
    tolerance = int(np.spacing(float(biggest)) / 2 * 1000) + 1
    return {k: (v[0], v[1]) for k, v in totals.items()}, sorted(starts), tolerance


def replay(aaco_bin: str, path: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [aaco_bin, "replay", str(path), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def lake(samples: Path, aaco_bin: str, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One replay of the whole directory."""
    out = tmp_path_factory.mktemp("hta-lake")
    return out, replay(aaco_bin, samples / HTA, out)


@pytest.fixture(scope="module")
def lake_kernels(lake):
    return ds.dataset(lake[0] / "kernels", format="parquet", partitioning="hive").to_table()


def test_directory_replays_without_error(lake, samples):
    out, proc = lake
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (samples / HTA).iterdir()) == sorted(FILES)
    records = {Path(r["subject"]).name: r for r in json.loads((out / "sources.json").read_text())["sources"]}
    assert set(records) == set(FILES)
    for name, rec in records.items():
        assert rec["format"] == "kineto", name
        assert rec["skipped"] == {}, name
        assert rec["events"]["kernels"] == sum(n for n, _ in reference(samples / HTA / name)[0].values()), name


@pytest.mark.parametrize("name", FILES)
def test_gpu_events_exactly(lake_kernels, samples, name):
    truth, starts, tolerance = reference(samples / HTA / name)
    # replay names each file's run "<file stem>:<identity>"
    mine = lake_kernels.filter(pc.starts_with(lake_kernels["run_id"], stem(name) + ":"))
    got = {}
    for kind in set(mine["kind"].to_pylist()):
        k = mine.filter(pc.equal(mine["kind"], kind))
        got[kind] = (k.num_rows, pc.sum(pc.subtract(k["end_ns"], k["start_ns"])).as_py())
    assert got == truth
    assert (name in NO_GPU) == (not truth)
    diff = np.array(sorted(mine["start_ns"].to_pylist()), dtype=np.int64) - np.array(starts, dtype=np.int64)
    assert not diff.size or int(np.abs(diff).max()) <= tolerance
    assert mine["pid"].null_count == 0  # launched or not, GPU work belongs to the trace's process


HTA_MODELS = {
    "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": ("pyper:trainer", 1074),
    "mtia_inference_trace_mtia_inference_rank_0.json.gz": ("service", 865),
    "negative_queue_length_values_check_rank0.json.gz": ("pyper:trainer", 4515),
    "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz": (None, 1102),  # a packaged python
    "rank_non_gpu_rank_non_gpu.json.gz": (None, 3113936),  # no process metadata at all
    "trace_diff_test_test.json.gz": (None, 2568503),  # python3.8
}


@pytest.mark.parametrize("name", sorted(HTA_MODELS))
def test_model_and_process_the_traces_name(samples, name):
    p = parse_kineto(
        load(samples / HTA / name, exact=False), node="n", identity="i", run_id="r", model="m", file_mtime_ns=0
    )
    assert (p.model, HTA_MODELS[name][1] in p.pids) == (HTA_MODELS[name][0], True)


# --- the control/test pair: aaco diff's verdict (docs/kineto_hta.md) -----------------------------


@pytest.fixture(scope="module")
def verdict(samples: Path, aaco_bin: str, tmp_path_factory) -> tuple[int, dict, str]:
    """(exit code, verdict, stderr) of aaco diff: the test trace judged against the control's baseline."""
    tmp = tmp_path_factory.mktemp("hta-diff")
    # one job: named as one model (each file alone names itself by its stem, and aaco diff refuses two models);
    # the two replays (separate lakes) run side by side
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = pool.map(
            lambda job: replay(aaco_bin, samples / HTA / job[0], job[1], "--model-name", "hta-job"),
            ((CONTROL, tmp / "control"), (TEST, tmp / "test")),
        )
        for proc in procs:
            assert proc.returncode == 0, proc.stderr
    run = [aaco_bin, "baseline", "save", str(tmp / "control"), "--no-machine"]
    assert subprocess.run(run, capture_output=True, timeout=300, check=False).returncode == 0
    cmd = [aaco_bin, "diff", "-b", str(tmp / "control" / "baseline.json"), "-s", str(tmp / "test"), "--no-machine"]
    proc = subprocess.run(
        [*cmd, "--out", str(tmp / "v.json")], capture_output=True, text=True, timeout=300, check=False
    )
    return proc.returncode, json.loads((tmp / "v.json").read_text()), proc.stderr


def steps_and_gpu(path: Path) -> tuple[list[float], dict[str, float]]:
    """ProfilerStep durations (s) and GPU time per kind (s) of a trace, from the file."""
    doc = load(path, exact=False)
    steps = [
        e["dur"] / 1e6
        for e in doc["traceEvents"]
        if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#")
    ]
    gpu: dict[str, float] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in KINDS:
            gpu[KINDS[e["cat"]]] = gpu.get(KINDS[e["cat"]], 0.0) + e["dur"] / 1e6
    return steps, gpu


def test_pair_is_a_memory_bound_regression(verdict):
    code, v, _ = verdict
    assert code == 1
    assert (v["regression"], v["improvement"], v["severity"]) == (True, False, "high")
    assert v["suspected_cause"] == "memory-bound"
    parts = v["attribution_per_iteration_s"]
    grew = {k: parts[k] for k in ("compute_kernels_s", "memory_kernels_s", "other_kernels_s", "host_gap_s")}
    assert max(grew, key=grew.get) == "memory_kernels_s"
    fams = v["kernels"]["family_time_per_iteration_s"]
    assert max(fams, key=lambda f: fams[f]["delta_pct"]) == "memcpy"
    diffs = v["environment_differences"]
    assert {"key": "devices", "baseline": ["3"], "session": ["1"]} in diffs
    # the GPUs differ (deviceProperties); named once the parser's devices reach the lake (docs/kineto_hta.md)
    gpu = {"key": "gpu_model", "baseline": "NVIDIA A100-PG509-200", "session": "Tesla V100-SXM2-16GB"}
    assert [d for d in diffs if d["key"] == "gpu_model"] in ([], [gpu])


def test_pair_figures_come_from_the_traces(verdict, samples):
    _, v, _ = verdict
    base_steps, base_gpu = steps_and_gpu(samples / HTA / CONTROL)
    test_steps, test_gpu = steps_and_gpu(samples / HTA / TEST)
    assert (len(base_steps), len(test_steps)) == (6, 6)
    assert v["latency"]["baseline"]["p50_s"] == pytest.approx(statistics.median(base_steps))
    assert v["latency"]["session"]["p50_s"] == pytest.approx(statistics.median(test_steps))
    expected = 100 * (statistics.median(test_steps) / statistics.median(base_steps) - 1)
    assert v["latency_delta_pct"] == pytest.approx(expected, abs=0.01)
    # every step of the test is slower than every step of the control: the smallest one-sided
    # Mann-Whitney p-value 6 against 6 samples can give, 1 / C(12, 6)
    assert min(test_steps) > max(base_steps)
    assert v["p_value"] == pytest.approx(1 / 924)
    # every kernel and copy of both traces falls in a step
    per_it = v["kernels"]["per_iteration"]
    assert (per_it["baseline"], per_it["session"]) == (8568 / 6, 9876 / 6)
    memcpy = v["kernels"]["family_time_per_iteration_s"]["memcpy"]
    assert memcpy["baseline"] == pytest.approx(base_gpu["memcpy"] / 6)
    assert memcpy["session"] == pytest.approx(test_gpu["memcpy"] / 6)
