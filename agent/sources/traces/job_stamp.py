"""The job columns of a trace's rows (docs/jobs.md, "Job identity"): the last step of ``parse.parse_any``.

Once per file, on its first chunk, ``file_job`` merges what is known of its job, field by field,
the first that knows winning (``contract.jobs.resolve``): the source's configuration and, for a
capture, the captured process's environment (``TraceContext.job``); for the spool, the environment
of the process the trace names if it still runs here (``TraceContext.job_environ``,
``jobs.process_job``); the trace itself (Kineto's ``distributedInfo``: ``ParsedTrace.job``).
A rank of a distributed job that nobody named (backend and world size known, no name) is named
from its profiled span (``ParsedTrace.span_ns``) by the source's ``JobRegistry``, or alone.

Every kernel and iteration row of the file then carries ``job``, ``rank``, ``world_size``,
``local_rank`` and ``dist_backend``; when the job has a name it is also their ``model`` (unless the
configuration names the model: ``TraceContext.model_configured``), so every rank of a job is one
model whatever its files are called.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from aaco.agent.sources.jobs import process_job
from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.agent.sources.traces.tables import const
from aaco.contract.jobs import JobFields, RankSpan, derive_jobs, resolve
from aaco.contract.schemas import JOB_COLUMNS

_TYPES = dict(JOB_COLUMNS)


def stamp_jobs(parts: Iterator[ParsedTrace], tf: TraceFile, ctx: TraceContext) -> Iterator[ParsedTrace]:
    """The chunks of ``tf`` with the job columns (and the job's name as the model) on their rows."""
    fields, model = JobFields(), None
    for i, part in enumerate(parts):
        if i == 0:
            fields = file_job(part, tf, ctx)
            model = fields.job if not ctx.model_configured else None
        if fields.known():
            part.kernels = with_job(part.kernels, fields, model)
            part.iterations = with_job(part.iterations, fields, model)
        yield part


def file_job(first: ParsedTrace, tf: TraceFile, ctx: TraceContext) -> JobFields:
    """The job of a file, from its first chunk and the source's context (see the module doc)."""
    env = None
    if ctx.job_environ and first.span_ns is not None:
        pid = trace_pid(first)
        env = process_job(pid, started_before_ns=first.span_ns[0]) if pid is not None else None
    fields = resolve(ctx.job, env, first.job)
    backend, world = fields.dist_backend, fields.world_size
    if fields.job is not None or not backend or world is None or first.span_ns is None:
        return fields
    start, end = first.span_ns
    if ctx.jobs is not None:
        return fields.named(ctx.jobs.name(tf.identity, backend, world, start, end))
    return fields.named(derive_jobs([RankSpan(tf.identity, backend, world, start, end)]).get(tf.identity))


def trace_pid(part: ParsedTrace) -> int | None:
    """The one process a trace's rows name (its iterations', else all of them), None if several or none."""
    if part.iterations.num_rows:
        pids = set(part.iterations.column("pid").drop_null().to_pylist())
        if len(pids) == 1:
            return pids.pop()
    return part.pids[0] if len(part.pids) == 1 else None


def with_job(table: pa.Table, fields: JobFields, model: str | None = None) -> pa.Table:
    """``table`` with the job columns set to ``fields`` (and ``model``, when given, on every row)."""
    n = table.num_rows
    values: dict[str, object] = dict(fields.columns())
    types = dict(_TYPES)
    if model is not None:
        values["model"], types["model"] = model, pa.string()
    for name, value in values.items():
        col = const(value, n, types[name])
        i = table.schema.get_field_index(name)
        table = table.append_column(name, col) if i < 0 else table.set_column(i, name, col)
    return table
