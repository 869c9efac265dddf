"""Kineto events read a column at a time (kineto_columns) give exactly what the per-event rules give."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest

from aaco.agent.sources.traces import kineto, kineto_columns, kineto_events
from aaco.agent.sources.traces.context import MAX_NAME_BYTES
from aaco.agent.sources.traces.kineto import parse_kineto

SAMPLES = (
    "kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "kineto/a100_alexnet_trace.json.gz",
    "kineto-h100/h100_conv_attn_train_cu130_kineto.json.gz",
)
MTIME = 1_700_000_000_123_456_789


def _parse(doc: dict) -> kineto.ParsedTrace:
    return parse_kineto(doc, node="n", identity="i", run_id="r", model="m", file_mtime_ns=MTIME)


def _dump(p: kineto.ParsedTrace) -> tuple:
    return (p.kernels.to_pydict(), p.kernels.schema, p.iterations.to_pydict(), p.clock, p.skipped, p.pids, p.model)


def _both(doc: dict, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple, tuple]:
    """(column at a time, event by event) for the same document."""
    fast = _dump(_parse(copy.deepcopy(doc)))
    with monkeypatch.context() as m:
        m.setattr(kineto_events, "_fast", lambda *_: False)
        slow = _dump(_parse(copy.deepcopy(doc)))
    return fast, slow


@pytest.mark.parametrize("name", SAMPLES)
def test_real_samples_read_a_column_at_a_time(samples: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = json.loads(gzip.decompress((samples / name).read_bytes()))
    used = []
    real = kineto_columns.gpu_columns
    monkeypatch.setattr(kineto_columns, "gpu_columns", lambda *a: used.append(real(*a)) or used[-1])
    fast, slow = _both(doc, monkeypatch)
    assert used and all(u is not None for u in used)  # the real GPU events pass the column checks
    assert fast == slow
    assert fast[0]["name"]


def _doc() -> dict:
    """Two kernels with their launches and ops, on a base time."""
    events = []
    for k in range(2):
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f"aten::op{k}",
                "pid": 7,
                "tid": 7,
                "ts": 10.0 * k,
                "dur": 5.0,
                "args": {"External id": k + 1},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 7,
                "tid": 8,
                "ts": 10.0 * k + 1,
                "dur": 2.0,
                "args": {"correlation": 100 + k, "External id": k + 1},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"k{k}",
                "pid": 0,
                "tid": 3,
                "ts": 10.0 * k + 4,
                "dur": 3.0,
                "args": {
                    "correlation": 100 + k,
                    "External id": k + 1,
                    "device": 0,
                    "stream": 3,
                    "grid": [1, 2, 3],
                    "block": [4, 5, 6],
                },
            }
        )
    return {"baseTimeNanoseconds": 1_735_632_360_000_000_000, "traceEvents": events}


@pytest.mark.parametrize(
    ("index", "path", "value"),
    [
        (1, ("args", "correlation"), "101"),  # a launch id written as a string: converted (now a repeat)
        (2, ("args", "correlation"), 2**63),  # a kernel's id beyond int64: the kernel is left out
        (2, ("args", "grid"), [1, 2]),  # not three dimensions: no grid
        (2, ("args", "bytes"), "512"),  # bytes written as a string: converted
        (2, ("ts",), "4.5"),  # a time written as a string
        (2, ("dur",), -1.0),  # a negative duration: bad_time
        (0, ("name",), "x" * (MAX_NAME_BYTES + 1)),  # an op name too long: dropped, counted
        (5, ("args",), []),  # args that are not an object
        (4, ("pid",), 1.0),  # a float pid
    ],
)
def test_a_value_the_rules_convert_sends_its_batch_event_by_event(
    index: int, path: tuple[str, ...], value: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = _doc()
    target = doc["traceEvents"][index]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    fast, slow = _both(doc, monkeypatch)
    assert fast == slow
    clean_fast, _ = _both(_doc(), monkeypatch)
    assert fast != clean_fast  # the value made a difference the per-event rules decided


def test_the_column_checks() -> None:
    assert kineto_columns.ints([1, None, -(2**63)]).to_pylist() == [1, None, -(2**63)]
    assert kineto_columns.ints([True]) is None
    assert kineto_columns.ints([2**63]) is None
    assert kineto_columns.ints([1.0]) is None
    assert kineto_columns.times([1, 2.5]).tolist() == [1.0, 2.5]
    assert kineto_columns.times([float("nan")]) is None
    assert kineto_columns.times(["1.5"]) is None
    assert kineto_columns.times([10**400]) is None
    assert kineto_columns.names_ok(["a", "b", None], nullable=True)
    assert not kineto_columns.names_ok(["a", None], nullable=False)
    assert not kineto_columns.names_ok(["\ud800"], nullable=False)
