"""Arrow schemas of the six event kinds (docs/architecture.md, Event schemas) and the batch type that carries them.

Every kind has required columns (fixed by docs/architecture.md) and declared optional columns that sources may
fill. ``conform`` brings any batch to the full schema of its kind — same column order, same types,
nulls for optional columns a source does not have — so every Parquet part of one kind in the lake
has one schema and reads as one dataset. A column a schema does not declare is an error: declare
it here first, so that the lake's schema is the one place that says what exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import pyarrow as pa

from aaco.contract.ledger import Range

I64 = pa.int64()
F64 = pa.float64()
STR = pa.string()
ATTRS = pa.map_(pa.string(), pa.string())


# Which distributed job a row belongs to, where known (docs/jobs.md): the job's name (configured, from the
# process environment or the pod's owner; else derived from the ranks' own traces), the rank, the world size,
# the rank on its node, and the collective backend (nccl, rccl, gloo, mpi).
JOB_COLUMNS: Final[list[tuple[str, pa.DataType]]] = [
    ("job", STR),
    ("rank", I64),
    ("world_size", I64),
    ("local_rank", I64),
    ("dist_backend", STR),
]


def _schema(required: list[tuple[str, pa.DataType]], optional: list[tuple[str, pa.DataType]]) -> pa.Schema:
    fields = [pa.field(n, t, nullable=n not in _NOT_NULL) for n, t in required]
    fields += [pa.field(n, t, nullable=True) for n, t in optional]
    return pa.schema(fields)


# Columns that may never be null in any kind: times and the node.
_NOT_NULL: Final = frozenset({"start_ns", "end_ns", "ts_ns", "node"})

KERNELS: Final = _schema(
    [
        ("start_ns", I64),
        ("end_ns", I64),
        ("node", STR),
        ("pid", I64),
        ("tid", I64),
        ("device", STR),
        ("stream", I64),
        ("name", STR),
        ("kind", STR),  # kernel | memcpy | memset
        ("correlation_id", I64),
        ("source", STR),
    ],
    [
        ("launch_start_ns", I64),  # the CPU launch call (cudaLaunchKernel, hipLaunchKernel, ORT node)
        ("launch_end_ns", I64),
        ("launch_name", STR),
        ("queue_id", I64),
        ("op_name", STR),  # the framework operator (ORT op type, PyTorch aten op)
        ("graph_node", STR),  # the ONNX graph node that ran it (ORT)
        ("grid_x", I64),
        ("grid_y", I64),
        ("grid_z", I64),
        ("workgroup_x", I64),
        ("workgroup_y", I64),
        ("workgroup_z", I64),
        ("bytes", I64),  # memcpy / memset size
        # Filled by the correlator:
        ("model", STR),
        ("run_id", STR),
        ("iteration", I64),
        ("trace_id", STR),  # 32 hex digits
        ("parent_span_id", STR),  # 16 hex digits: the iteration span
        *JOB_COLUMNS,
        # A collective's kernel (NCCL, RCCL; docs/jobs.md): the operation (all_reduce, all_gather, reduce_scatter,
        # broadcast, reduce, all_to_all, send_recv, send, recv), its message size and type, the group's size,
        # and its place in its rank's sequence of collectives (which aligns ranks).
        ("collective", STR),
        ("collective_bytes", I64),
        ("collective_dtype", STR),
        ("collective_group_size", I64),
        ("collective_seq", I64),
    ],
)

ITERATIONS: Final = _schema(
    [
        ("start_ns", I64),
        ("end_ns", I64),
        ("node", STR),
        ("pid", I64),
        ("model", STR),
        ("run_id", STR),
        ("trace_id", STR),
        ("span_id", STR),
        ("source", STR),
    ],
    [
        ("iteration", I64),  # index within the run
        ("tid", I64),
        ("graph_nodes", I64),  # ONNX graph nodes that run (not folded at load): KAR's denominator
        ("graph_nodes_optimized", I64),  # nodes of ONNX Runtime's optimised graph
        ("provider", STR),  # ONNX Runtime execution provider
        ("name", STR),  # the annotation that delimited it (ProfilerStep#3, model_run, a rocTX range)
        *JOB_COLUMNS,
        # The step's critical path as HTA 0.5.0 finds it (docs/jobs.md, "Critical path"): its length and
        # its time on the CPU, in GPU compute, in communication kernels, in kernel launch delays and in a
        # stream's gaps between kernels; the five add up to the length.
        ("cp_length_ns", I64),
        ("cp_cpu_ns", I64),
        ("cp_compute_ns", I64),
        ("cp_comm_ns", I64),
        ("cp_launch_ns", I64),
        ("cp_gap_ns", I64),
    ],
)

TELEMETRY: Final = _schema(
    [
        ("ts_ns", I64),
        ("node", STR),
        ("device", STR),
        ("metric", STR),
        ("value", F64),
        ("unit", STR),
    ],
    [
        ("gpu_uuid", STR),
        ("attributes", ATTRS),  # e.g. sensor=junction, clock=graphics, reason=power
        ("source", STR),
    ],
)

SCHED: Final = _schema(
    [
        ("ts_ns", I64),
        ("node", STR),
        ("pid", I64),
        ("tid", I64),
        ("metric", STR),
        ("value", F64),
        ("offcpu_start_ns", I64),
        ("offcpu_end_ns", I64),
    ],
    [
        ("comm", STR),
        ("interval_ns", I64),
        ("source", STR),
        ("bucket_le_ns", I64),  # runqueue_latency rows: upper bound of the log2 histogram bucket
    ],
)

FINDINGS: Final = _schema(
    [
        ("ts_ns", I64),
        ("node", STR),
        ("analyzer", STR),
        ("subject", STR),
        ("severity", STR),  # info | warning | critical
        ("confidence", F64),
        ("summary", STR),
        ("evidence_json", STR),
    ],
    [
        ("trace_id", STR),
    ],
)

REQUESTS: Final = _schema(
    [
        ("start_ns", I64),
        ("end_ns", I64),
        ("node", STR),
        ("model", STR),
        ("trace_id", STR),
        ("span_id", STR),
        ("source", STR),
    ],
    [
        ("request_id", STR),
        ("namespace", STR),
        ("pod", STR),
        ("service", STR),
        ("pid", I64),
        ("input_tokens", I64),
        ("output_tokens", I64),
        ("queue_s", F64),  # latencies in seconds, as the server reported them (contract/genai.py)
        ("ttft_s", F64),
        ("e2e_s", F64),
        ("prefill_s", F64),
        ("decode_s", F64),
        ("inference_s", F64),
        ("finish_reason", STR),
        *JOB_COLUMNS,
    ],
)

# Hardware counters (docs/counters.md): one row per kernel dispatch and counter, joined to the kernel rows
# by the dispatch (correlation id where the capture has one, else dispatch id, device and process).
COUNTERS: Final = _schema(
    [
        ("start_ns", I64),  # the dispatch's; the capture file's time where the capture does not time it
        ("end_ns", I64),
        ("node", STR),
        ("pid", I64),
        ("device", STR),
        ("dispatch_id", I64),
        ("kernel", STR),
        ("counter", STR),
        ("value", F64),
        ("source", STR),
    ],
    [
        ("correlation_id", I64),
        ("arch", STR),  # the GPU's architecture (gfx90a, gfx942, sm_80): which formulas apply (contract/roofline.py)
        ("op_name", STR),  # the framework operator that launched the kernel, innermost (Kineto captures)
        ("top_op", STR),  # ... and outermost
        ("model", STR),  # the model of the process counted (a capture window's, or the counters source's model)
        ("run_id", STR),
    ],
)

SCHEMAS: Final[dict[str, pa.Schema]] = {
    "kernels": KERNELS,
    "iterations": ITERATIONS,
    "telemetry": TELEMETRY,
    "sched": SCHED,
    "findings": FINDINGS,
    "requests": REQUESTS,
    "counters": COUNTERS,
}

REQUIRED: Final[dict[str, tuple[str, ...]]] = {
    "kernels": tuple(KERNELS.names[:11]),
    "iterations": tuple(ITERATIONS.names[:9]),
    "telemetry": tuple(TELEMETRY.names[:6]),
    "sched": tuple(SCHED.names[:8]),
    "findings": tuple(FINDINGS.names[:8]),
    "requests": tuple(REQUESTS.names[:7]),
    "counters": tuple(COUNTERS.names[:10]),
}

# The column that places an event in time (and so in a date= partition).
TIME_COLUMN: Final[dict[str, str]] = {
    "kernels": "start_ns",
    "iterations": "start_ns",
    "telemetry": "ts_ns",
    "sched": "ts_ns",
    "findings": "ts_ns",
    "requests": "start_ns",
    "counters": "start_ns",
}


class SchemaError(ValueError):
    """A batch that cannot be brought to its kind's schema (missing column, unknown column, bad type)."""


def conform(kind: str, data: pa.RecordBatch | pa.Table | dict[str, object]) -> pa.RecordBatch:
    """Return ``data`` as a record batch with exactly the full schema of ``kind``.

    Optional columns that are absent become nulls; present columns are cast (safely: an int64 that
    does not fit, or a string where a number belongs, is an error, never a silent wrap).
    """
    schema = SCHEMAS.get(kind)
    if schema is None:
        raise SchemaError(f"unknown event kind {kind!r}; known: {', '.join(SCHEMAS)}")
    if isinstance(data, dict):
        data = pa.table(data)
    names = set(data.schema.names)
    missing = [c for c in REQUIRED[kind] if c not in names]
    if missing:
        raise SchemaError(f"{kind}: missing required column(s) {', '.join(missing)}")
    unknown = sorted(names - set(schema.names))
    if unknown:
        raise SchemaError(f"{kind}: undeclared column(s) {', '.join(unknown)}; declare them in schemas.py")
    n = data.num_rows
    arrays = []
    for field in schema:
        if field.name in names:
            col = data.column(field.name)
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks()
            if col.type != field.type:
                from_text = pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
                if from_text and not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
                    raise SchemaError(f"{kind}.{field.name}: strings where {field.type} belongs")
                try:
                    col = col.cast(field.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise SchemaError(f"{kind}.{field.name}: cannot use {col.type} as {field.type}: {exc}") from exc
            if not field.nullable and col.null_count:
                raise SchemaError(f"{kind}.{field.name}: {col.null_count} null value(s) in a required column")
            arrays.append(col)
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def empty(kind: str) -> pa.RecordBatch:
    """An empty batch of ``kind``."""
    return pa.RecordBatch.from_pylist([], schema=SCHEMAS[kind])


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One batch on the bus: the kind (a key of ``SCHEMAS``), the rows, and the source that read them.

    ``ranges`` are the chunks of durable input the rows came from (``ledger.Range``): whoever makes
    them durable (the lake) marks them done, so checkpoints only ever cover rows already stored.
    """

    kind: str
    batch: pa.RecordBatch
    source: str
    ranges: tuple[Range, ...] = ()

    def derive(self, batch: pa.RecordBatch) -> EventBatch:
        """A batch with other rows but the same kind, source and ranges (the caller counts the pieces)."""
        return EventBatch(self.kind, batch, self.source, self.ranges)

    @property
    def rows(self) -> int:
        """Number of events in the batch."""
        return self.batch.num_rows
