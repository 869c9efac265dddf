"""Kernel and launch spans encoded from columns parse to the official spans of their rows, whatever the rows.

The encoder builds fixed-width parts as byte rows, caches attribute blocks per distinct combination
of values and writes correlation varints for a whole column at once; drawn batches (values repeating
and unique, nulls anywhere, correlation IDs over the whole int64 range) check each span against the
one the generated opentelemetry-proto classes give for its row.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.trace.v1 import trace_pb2

from aaco.contract.kernels import families
from aaco.contract.schemas import SCHEMAS, conform
from aaco.exporters.otlp_spans import _LAUNCH_SALT, SpanEncoder, _hex_ids, splitmix64
from tests.support.otlp_official import official_kernel_spans

TRACES = [bytes([i]) * 16 for i in range(1, 4)]
PARENTS = [bytes([i]) * 8 for i in range(5, 8)]


ROW = st.fixed_dictionaries(
    {
        "start_ns": st.integers(10**7, 2**62),
        "dur": st.integers(0, 10**9),
        "name": st.sampled_from(["gemm_kernel", "Memcpy HtoD", "ÿ kernel ✓", "softmax"]),
        "kind": st.sampled_from(["kernel", "memcpy"]),
        "device": st.sampled_from(["0", "1", None]),
        "stream": st.sampled_from([0, 7, None]),
        "queue_id": st.sampled_from([5, None]),
        "tid": st.sampled_from([11, 2**40, None]),
        "grid_x": st.sampled_from([1, 64, None]),
        "op_name": st.sampled_from(["aten::mm", None]),
        "correlation_id": st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        "launch": st.one_of(st.none(), st.tuples(st.integers(0, 10**6), st.integers(-(10**6), 10**6))),
        "launch_name": st.sampled_from(["cudaLaunchKernel", None]),
        "trace": st.sampled_from(TRACES),
        "parent": st.sampled_from([*PARENTS, None]),
    }
)


def batch_of(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    cols: dict[str, list[Any]] = {
        "start_ns": [r["start_ns"] for r in rows],
        "end_ns": [r["start_ns"] + r["dur"] for r in rows],
        "node": ["n"] * len(rows),
        "pid": [1] * len(rows),
        "source": ["t"] * len(rows),
        "launch_start_ns": [r["start_ns"] - r["launch"][0] if r["launch"] else None for r in rows],
        "launch_end_ns": [r["start_ns"] - r["launch"][0] + r["launch"][1] if r["launch"] else None for r in rows],
        "trace_id": [r["trace"].hex() for r in rows],
        "parent_span_id": [r["parent"].hex() if r["parent"] else None for r in rows],
    }
    for c in ("name", "kind", "device", "stream", "queue_id", "tid", "grid_x", "op_name", "correlation_id"):
        cols[c] = [r[c] for r in rows]
    cols["launch_name"] = [r["launch_name"] for r in rows]
    schema = SCHEMAS["kernels"]
    return conform("kernels", pa.table({k: pa.array(v, schema.field(k).type) for k, v in cols.items()}))


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(ROW, min_size=1, max_size=40))
def test_spans_from_columns_parse_to_the_official_spans_of_their_rows(rows: list[dict[str, Any]]) -> None:
    batch = batch_of(rows)
    enc = SpanEncoder()
    _, parent_ints = _hex_ids(batch.column("parent_span_id").to_pylist(), 8)
    ids = enc.kernel_span_ids(batch, parent_ints)
    launch_ids = splitmix64(ids ^ _LAUNCH_SALT).tolist()
    fams = families(batch.column("name"), batch.column("kind"))
    expected = official_kernel_spans(batch, list(fams), ids.tolist(), launch_ids)
    ours = enc.kernel_spans(batch)
    assert [trace_pb2.Span.FromString(b) for b in ours] == expected
    kernels_only = [e for e in expected if not any(a.key == "aaco.span.kind" for a in e.attributes)]
    for e in kernels_only:
        del e.links[:]
    assert [trace_pb2.Span.FromString(b) for b in enc.kernel_spans(batch, with_launches=False)] == kernels_only
