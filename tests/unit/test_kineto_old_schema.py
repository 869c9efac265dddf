"""PyTorch 1.8 / 1.9 Kineto traces (``tests/data/kineto-tb``): capitalised categories, read like today's.

The reference figures are computed here from the JSON alone (``json`` with decimals, categories
compared without case), never through the parser; the expected counts are also written out, so a
changed sample fails loudly. Then: GPU work of a category nobody knows is counted and named, never a
silent empty lake.
"""

from __future__ import annotations

import copy
import functools
import gzip
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path
from unittest import mock

import orjson
import pyarrow.compute as pc
import pytest

from aaco.agent.pipeline.bus import Bus
from aaco.agent.sources.base import Journal, SourceContext
from aaco.agent.sources.replay import ReplaySource, ReplaySourceConfig
from aaco.agent.sources.traces import kineto, kineto_events
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.contract.stats import TRACE_EVENTS_UNRECOGNISED, Stats

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto-tb"
JAN = "samples_resnet50_num_workers_0_worker0.pt.trace.json.gz"  # PyTorch 1.8 pre-release, 2021-01-11
JUN = "samples_resnet50_num_workers_0_worker0.1623143089861.pt.trace.json.gz"  # PyTorch 1.9 era, 2021-06-08
MAY = "test_gpu_metrics_input.json.gz"  # 2021-05-19, computeProperties
KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset", "memset": "memset"}
# (count, summed ns) per kind, as the files state them (tests/data/kineto-tb/README.md)
EXPECTED = {
    JAN: {"kernel": (9564, 640_354_000), "memcpy": (12, 12_734_000), "memset": (439, 439_000)},
    JUN: {"kernel": (8772, 591_532_000), "memcpy": (12, 11_492_000), "memset": (312, 534_000)},
    MAY: {"kernel": (30, 48_000), "memcpy": (2, 2_000)},
}
V100 = {
    "0": {
        "type": "GPU",
        "name": "Tesla V100-DGXS-32GB",
        "product_name": "Tesla V100-DGXS-32GB",
        "compute_capability": "7.0",
        "total_memory_bytes": 34084028416,
    }
}


@functools.cache
def load(name: str) -> dict:
    with gzip.open(DATA / name, "rt") as fh:
        return json.load(fh, parse_float=Decimal)


def truth(doc: dict) -> dict[str, tuple[int, int]]:
    """GPU work per kind: complete events whose category, in any case, names it; count and summed dur in ns."""
    out: dict[str, tuple[int, int]] = {}
    for ev in doc["traceEvents"]:
        cat = ev.get("cat")
        if ev.get("ph") == "X" and isinstance(cat, str) and cat.lower() in KINDS:
            n, ns = out.get(KINDS[cat.lower()], (0, 0))
            out[KINDS[cat.lower()]] = (n + 1, ns + int(Decimal(ev["dur"]) * 1000))
    return out


@functools.cache
def read(path: Path):
    """The file as ``aaco replay`` reads it (``parse_any``, the streaming Kineto reader): one table of its chunks."""
    tf = identify(path)
    parts = list(parse_any(tf, context_for(tf, node="n", source="replay")))
    return tf, parts


def per_kind(kernels) -> dict[str, tuple[int, int]]:
    out = {}
    for kind in set(kernels["kind"].to_pylist()):
        k = kernels.filter(pc.equal(kernels["kind"], kind))
        out[kind] = (k.num_rows, pc.sum(pc.subtract(k["end_ns"], k["start_ns"])).as_py())
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_gpu_event_of_the_old_schema_is_read(name):
    doc = load(name)
    assert doc["schemaVersion"] == 1
    assert {e.get("cat") for e in doc["traceEvents"]} >= {"Kernel", "Memcpy", "Runtime", "Operator", "Trace"}
    assert truth(doc) == EXPECTED[name]
    tf, parts = read(DATA / name)
    assert tf.format == "kineto"
    kernels = parts[0].kernels
    assert len(parts) == 1  # fewer than CHUNK_ROWS kernels
    assert per_kind(kernels) == EXPECTED[name]
    assert parts[0].unrecognised == Counter()
    assert parts[0].skipped == Counter()
    # launched from the trace's host process (the Runtime events' pid), on the lanes the events name
    runtime_pids = {e["pid"] for e in doc["traceEvents"] if e.get("cat") == "Runtime"}
    assert set(kernels["pid"].to_pylist()) == runtime_pids
    gpu = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat", "").lower() in KINDS]
    assert Counter(kernels["stream"].to_pylist()) == Counter(e["args"]["stream"] for e in gpu)
    assert Counter(kernels["device"].to_pylist()) == Counter(str(e["args"]["device"]) for e in gpu)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_steps_ops_and_devices_of_the_old_schema(name):
    doc = load(name)
    events = doc["traceEvents"]
    _, parts = read(DATA / name)
    kernels, iterations = parts[0].kernels, parts[0].iterations
    # ProfilerStep#N is an operator in this schema: each one an iteration, at its own time
    steps = sorted((e["ts"], e["name"]) for e in events if e.get("cat") == "Operator" and "ProfilerStep#" in e["name"])
    assert steps and iterations["name"].to_pylist() == [n for _, n in steps]
    assert iterations["start_ns"].to_pylist() == [int(ts) * 1000 for ts, _ in steps]
    # the op of each GPU event: the Operator whose "External id" its lower-case "external id" names
    ops: dict[int, str] = {}
    for e in events:
        if e.get("cat") == "Operator":
            ops.setdefault(e["args"]["External id"], e["name"])
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat", "").lower() in KINDS]
    expected_ops = Counter(ops.get(e["args"]["external id"]) for e in gpu)
    assert Counter(kernels["op_name"].to_pylist()) == expected_ops
    assert sum(n for op, n in expected_ops.items() if op is not None) > len(gpu) // 2
    # launches: the Runtime call of the same correlation id
    launched = {e["args"]["correlation"]: e["name"] for e in events if e.get("cat") == "Runtime"}
    assert Counter(kernels["launch_name"].to_pylist()) == Counter(launched.get(e["args"]["correlation"]) for e in gpu)
    # deviceProperties (June), computeProperties with major/minor (May), none (January)
    assert parts[0].devices == ({} if name == JAN else V100)
    assert parts[0].model is None  # the process is "python": the iterations' model is the file's stem
    assert set(iterations["model"].to_pylist()) == {name.removesuffix(".json.gz")}


@pytest.mark.parametrize("name", [JAN, JUN])
def test_column_reader_and_event_reader_agree_on_the_old_schema(name):
    """The column-at-a-time path reads the old schema's string tids as the per-event rules do."""
    doc = orjson.loads(gzip.decompress((DATA / name).read_bytes()))
    kw = {"node": "n", "identity": "i", "run_id": "r", "model": "m", "file_mtime_ns": 0}
    fast = kineto.parse_kineto(doc, **kw)
    with mock.patch.object(kineto_events, "_fast", lambda *a: False):
        slow = kineto.parse_kineto(doc, **kw)
    assert fast.kernels.num_rows == sum(n for n, _ in EXPECTED[name].values())
    assert fast.kernels.equals(slow.kernels) and fast.iterations.equals(slow.iterations)
    assert fast.skipped == slow.skipped


def trace(events: list[dict], **keys) -> dict:
    meta = [
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "M", "name": "process_labels", "pid": 77, "tid": 0, "args": {"labels": "CPU"}},
    ]
    return {"schemaVersion": 1, "traceEvents": events + meta, **keys}


def x(cat, pid, tid, ts, args=None, name="k") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": 5, "args": args or {}}


def test_categories_in_any_case_and_unknown_gpu_work_counted_by_category():
    t0 = 1_623_142_623_460_000
    events = [
        x("KERNEL", 0, "stream 7", t0, {"device": 0, "stream": 7, "correlation": 1}),
        x("Gpu_Memset", 0, 7, t0 + 10, {"device": 0, "stream": 7}, name="Memset (Device)"),
        x("runtime", 77, "77", t0 - 5, {"correlation": 1}, name="cudaLaunchKernel"),
        x("GpuWork", 0, 7, t0 + 20),  # unknown, on a GPU lane (process_labels GPU 0)
        x("GpuWork", 5, 1, t0 + 30, {"stream": 3}),  # unknown, naming a stream
        x("DeviceOp", 9, "stream 2", t0 + 40),  # unknown, on a stream tid
        x("host_thing", 77, 77, t0 + 50),  # unknown, on the CPU: not GPU work
        x("other_runtime", 77, 77, t0 + 55, {"device": 0}),  # a host call naming its device: not its work
        x("gpu_user_annotation", 0, 7, t0 + 60),  # known: an annotation, not work
        x("cuda_sync", 0, 7, t0 + 70, {"device": 0, "stream": 7}),  # known: a sync
    ]
    p = kineto.parse_kineto(trace(events), node="n", identity="i", run_id="r", model="m", file_mtime_ns=0)
    assert sorted(p.kernels["kind"].to_pylist()) == ["kernel", "memset"]
    assert p.kernels["launch_name"].to_pylist()[0] == "cudaLaunchKernel"
    assert p.unrecognised == Counter({"GpuWork": 2, "DeviceOp": 1})
    assert kineto.sniff(json.dumps({"traceEvents": [x("Kernel", 0, 7, t0)]}).encode()) == "kineto"


def run_replay(tmp_path: Path, path: Path) -> SourceContext:
    stats = Stats()
    ctx = SourceContext("n", stats, Bus(stats), Journal(stats), quarantine=tmp_path / "q")
    ReplaySource(ReplaySourceConfig(paths=[path]), "replay").run(ctx)
    return ctx


def test_a_trace_whose_gpu_work_is_all_unknown_says_so_once(tmp_path):
    """The June trace with its GPU categories renamed: no kernels, and a warning naming the file and categories."""
    doc = copy.deepcopy(load(JUN))
    renamed = {"Kernel": "KernelV2", "Memcpy": "CopyV2", "Memset": "FillV2"}
    for ev in doc["traceEvents"]:
        ev["cat"] = renamed.get(ev.get("cat"), ev.get("cat"))
    path = tmp_path / "renamed.json"
    path.write_text(json.dumps(doc, default=str))
    ctx = run_replay(tmp_path, path)
    problems = [p for p in ctx.journal.problems if p.reason == "unrecognised_events"]
    assert len(problems) == 1
    p = problems[0]
    assert p.subject == str(path) and not p.fatal
    assert p.message == (
        "no GPU work read: 9096 event(s) that look like GPU work are of categories the kineto reader does not "
        "know: KernelV2 (8772), FillV2 (312), CopyV2 (12)"
    )
    assert ctx.stats.get(TRACE_EVENTS_UNRECOGNISED, source="replay", format="kineto") == 9096
    assert ctx.stats.total(TRACE_EVENTS_UNRECOGNISED) == 9096
    kernels = 0
    while (item := ctx.bus.get(0)) is not None:
        kernels += item.batch.num_rows if item.kind == "kernels" else 0
    assert kernels == 0


def test_known_traces_are_not_flagged(tmp_path):
    ctx = run_replay(tmp_path, DATA / JUN)
    assert [p for p in ctx.journal.problems if p.reason == "unrecognised_events"] == []
    assert ctx.stats.total(TRACE_EVENTS_UNRECOGNISED) == 0
