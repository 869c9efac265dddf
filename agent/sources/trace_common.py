"""What the rocprof-family parsers share: the parse context, devices, launches, table builders, chunks.

Every parser in this family turns a trace into ``ParsedTrace`` chunks of at most ``CHUNK_ROWS``
rows, with the columns of the ``kernels`` and ``iterations`` schemas (``contract/schemas.py``).
Timestamps of rocprofv3, rocpd and rocprof v1/v2 are CLOCK_BOOTTIME nanoseconds: the caller
passes the offset to apply (``TraceContext.clock``, by default sampled on this host with
``boottime_offset()``), and every chunk records it.

Devices: rocprof tools name an agent (a CPU or GPU node of the HSA topology) in several ways
(``Agent 4`` by absolute or logical node index, ``GPU 0`` by index among GPUs, a bare node id in
older layouts, an opaque handle in JSON). A user grouping kernels by device expects one group per
physical GPU, named the way the telemetry sources name it: the GPU ordinal (``"0"``, ``"1"``,
...), which is the agent's index among GPU agents (``logical_node_type_id``). ``AgentMap`` does
that translation when agent information is available (``agent_info.csv``, JSON ``agents``, rocpd
``rocpd_info_agent``) and keeps the device's names (``gfx90a``, ``AMD Instinct MI210``) in
``ParsedTrace.devices``: ``{"0": {"name": ..., "product_name": ..., "agent": ..., ...}}``. Without
agent information the device is the label the tool wrote (``Agent 4``), unchanged.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.sources.parsed import ParsedTrace
from aaco.agent.sources.rocprofv3_u64 import U64_MASK, TimeWindow
from aaco.contract.clock import ClockOffset, boottime_offset
from aaco.contract.ids import span_id, trace_id

CHUNK_ROWS = 65_536
# Longest kernel / range name kept; a longer one is a bad row (no real symbol is this long, a
# corrupted file or a runaway string is, and it would blow up every label and span downstream).
MAX_NAME_BYTES = 64 * 1024

I64 = pa.int64()
STR = pa.string()


@dataclass(frozen=True)
class TraceContext:
    """Who is parsing: the node, the file's identity, the run and model, the source name, the clock.

    ``clock`` converts CLOCK_BOOTTIME nanoseconds (rocprofv3, rocpd, rocprof v1/v2) to epoch ns;
    the default samples this host's offset. ``file_mtime_ns`` anchors formats without a clock
    of their own (ONNX Runtime profiles, Kineto traces without ``baseTimeNanoseconds``).
    ``model_given``: ``model`` is the user's (config ``model``, ``--model-name``) or the traced
    process's, not a default taken from the file name: it wins over the model the file names.
    """

    node: str
    identity: str
    run_id: str
    model: str
    source: str
    clock: ClockOffset = field(default_factory=boottime_offset)
    file_mtime_ns: int = 0
    pid: int | None = None  # the traced process, when the file does not say it
    model_given: bool = False


class BadRow(NamedTuple):
    """A row that could not be used: its byte offset in the (decompressed) file, raw bytes, reason."""

    offset: int
    line: bytes
    reason: str


# --- devices -------------------------------------------------------------------------------------

_LABEL = re.compile(r"^\s*(?:(Agent|GPU|CPU)\s+)?(-?\d+)\s*$", re.I)


@dataclass(frozen=True)
class Agent:
    """One HSA agent as the trace describes it."""

    node_id: int | None
    logical_node_id: int | None
    type: str  # "GPU" | "CPU" | "UNK"
    type_index: int | None  # index among agents of its type: the GPU ordinal for GPUs
    name: str | None = None  # gfx target, e.g. gfx90a
    product_name: str | None = None  # e.g. AMD Instinct MI210
    handle: int | None = None  # the JSON agent handle / rocpd row id

    @property
    def device(self) -> str:
        """The ``device`` string of this agent's events: the GPU ordinal, or ``cpu<N>``."""
        if self.type == "GPU" and self.type_index is not None:
            return str(self.type_index)
        if self.type == "CPU":
            return f"cpu{self.type_index if self.type_index is not None else self.node_id}"
        return f"agent{self.node_id}"

    def describe(self, label: str | None = None) -> dict[str, Any]:
        """The documented mapping entry kept in ``ParsedTrace.devices``."""
        return {
            "type": self.type,
            "name": self.name,
            "product_name": self.product_name,
            "node_id": self.node_id,
            "logical_node_id": self.logical_node_id,
            **({"label": label} if label is not None else {}),
        }


class AgentMap:
    """Translates the agent labels and handles a trace uses into device strings (see module doc)."""

    def __init__(self, agents: Iterable[Agent] = ()) -> None:
        self.agents = list(agents)
        self._by_node = {a.node_id: a for a in self.agents if a.node_id is not None}
        self._by_logical = {a.logical_node_id: a for a in self.agents if a.logical_node_id is not None}
        self._by_handle = {a.handle & U64_MASK: a for a in self.agents if a.handle is not None}
        self._gpus = {a.type_index: a for a in self.agents if a.type == "GPU" and a.type_index is not None}
        self.used: dict[str, dict[str, Any]] = {}

    @staticmethod
    def with_type_indexes(agents: list[Agent]) -> list[Agent]:
        """Fill in missing type indexes: agents of one type numbered in logical-node order."""
        out: list[Agent] = []
        counters: Counter[str] = Counter()
        for a in sorted(agents, key=lambda a: a.logical_node_id if a.logical_node_id is not None else 1 << 30):
            idx = a.type_index if a.type_index is not None else counters[a.type]
            counters[a.type] += 1
            out.append(Agent(a.node_id, a.logical_node_id, a.type, idx, a.name, a.product_name, a.handle))
        return out

    def __bool__(self) -> bool:
        return bool(self.agents)

    def resolve_label(self, label: str | None) -> str | None:
        """Device string for an agent label (``Agent 4``, ``GPU 0``, ``4``); the label itself if unknown."""
        if label is None:
            return None
        m = _LABEL.match(label)
        agent: Agent | None = None
        if m:
            kind, num = (m.group(1) or "").lower(), int(m.group(2))
            if kind == "gpu":
                agent = self._gpus.get(num)
                if agent is None:
                    return str(num)  # type-relative labels already are GPU ordinals
            elif kind == "cpu":
                return f"cpu{num}"
            else:  # absolute (node id) first, then logical index: they agree on almost every system
                agent = self._by_node.get(num) or self._by_logical.get(num)
        if agent is None:
            return label
        self.used.setdefault(agent.device, agent.describe(label))
        return agent.device

    def resolve_handle(self, handle: int | None) -> str | None:
        """Device string for a JSON agent handle / rocpd agent row id; ``agent<handle>`` if unknown.

        Handles are unsigned 64-bit (``rocprofv3_u64``): a negative int means the same 64 bits.
        """
        if handle is None:
            return None
        handle &= U64_MASK
        agent = self._by_handle.get(handle)
        if agent is None:
            return f"agent{handle}"
        self.used.setdefault(agent.device, agent.describe())
        return agent.device

    def map_labels(self, labels: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Vectorised ``resolve_label`` over a string or dictionary column (few distinct values)."""
        if isinstance(labels, pa.ChunkedArray):
            labels = labels.combine_chunks() if labels.num_chunks != 1 else labels.chunk(0)
        if not pa.types.is_dictionary(labels.type):
            labels = pc.dictionary_encode(labels)
        values = [self.resolve_label(v) for v in labels.dictionary.to_pylist()]
        return pa.array(values, STR).take(labels.indices)

    def map_handles(self, handles: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
        """Vectorised ``resolve_handle`` over a ``uint64`` (or int64, same bits) array; null where not ``valid``."""
        if handles.size == 0:
            return pa.array([], STR)
        uniq, inv = np.unique(handles.view(np.uint64), return_inverse=True)
        values = [self.resolve_handle(int(h)) for h in uniq]
        mask = None if valid is None else ~valid
        return pa.array(values, STR).take(pa.array(inv.reshape(-1).astype(np.int64), mask=mask))


# --- launches ------------------------------------------------------------------------------------


@dataclass
class LaunchTable:
    """Host API calls (HIP) by correlation id, sorted, for a vectorised join with GPU records.

    Correlation ids are ``uint64`` (``rocprofv3_u64``; int64 ids are viewed with the same bits);
    times are raw (BOOTTIME) or epoch ns, as the caller gives them. ``pid`` and ``tid`` are int64
    arrays (the 64 bits of each id) with ``pid_ok`` / ``tid_ok`` marking the known ones: ``build``
    takes nullable Arrow columns, or numpy arrays where a negative value is unknown.
    """

    corr: np.ndarray  # uint64, sorted ascending, unique
    start: np.ndarray  # int64
    end: np.ndarray
    pid: np.ndarray  # int64
    tid: np.ndarray
    name_idx: np.ndarray  # int32 index into names
    names: list[str]
    pid_ok: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    tid_ok: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @classmethod
    def empty(cls) -> LaunchTable:
        """No launches."""
        z = np.zeros(0, dtype=np.int64)
        return cls(z.view(np.uint64), z, z, z, z, np.zeros(0, dtype=np.int32), [])

    @classmethod
    def build(
        cls,
        corr: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        pid: pa.Array | np.ndarray,
        tid: pa.Array | np.ndarray,
        name_idx: np.ndarray,
        names: list[str],
    ) -> LaunchTable:
        """Sort by correlation id (``uint64``, or int64 of the same bits; the last record of a repeated id wins)."""
        corr = np.asarray(corr).view(np.uint64)
        order = np.argsort(corr, kind="stable")
        corr = corr[order]
        keep = np.ones(corr.size, dtype=bool)
        if corr.size > 1:
            keep[:-1] = corr[1:] != corr[:-1]
        idx = order[keep]
        (pid_v, pid_ok), (tid_v, tid_ok) = _known_ids(pid), _known_ids(tid)
        return cls(
            corr[keep], start[idx], end[idx], pid_v[idx], tid_v[idx], name_idx[idx], names, pid_ok[idx], tid_ok[idx]
        )

    def __len__(self) -> int:
        return int(self.corr.size)

    def lookup(self, corr: np.ndarray, valid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """For each correlation id (``uint64`` or int64 bits; only where ``valid``): (matched mask, index here)."""
        if self.corr.size == 0 or corr.size == 0:
            return np.zeros(corr.size, dtype=bool), np.zeros(corr.size, dtype=np.int64)
        corr = corr.view(np.uint64)
        pos = np.searchsorted(self.corr, corr)
        pos_c = np.minimum(pos, self.corr.size - 1)
        hit = self.corr[pos_c] == corr
        return (hit if valid is None else hit & valid), pos_c

    def columns(self, corr: np.ndarray, offset_ns: int, valid: np.ndarray | None = None) -> dict[str, pa.Array]:
        """launch_start_ns, launch_end_ns, launch_name, launch_pid, launch_tid for these correlation ids.

        Times are raw here: launches whose times convert (with ``offset_ns``) outside 1990..2100 are no match.
        """
        hit, pos = self.lookup(corr, valid)
        if hit.any():
            hit &= TimeWindow(offset_ns).mask(self.start[pos].view(np.uint64), self.end[pos].view(np.uint64))
        mask = ~hit
        start = np.where(hit, self.start[pos] + offset_ns, 0) if hit.any() else np.zeros(corr.size, np.int64)
        end = np.where(hit, self.end[pos] + offset_ns, 0) if hit.any() else np.zeros(corr.size, np.int64)
        names = pa.array(self.names or [""], STR)
        name_idx = self.name_idx[pos] if self.name_idx.size else np.zeros(corr.size, np.int32)
        empty = not self.pid.size
        return {
            "launch_start_ns": pa.array(start, I64, mask=mask),
            "launch_end_ns": pa.array(end, I64, mask=mask),
            "launch_name": names.take(pa.array(name_idx, pa.int32(), mask=mask)),
            "launch_pid": pa.nulls(corr.size, I64)
            if empty
            else pa.array(self.pid[pos], I64, mask=mask | ~self.pid_ok[pos]),
            "launch_tid": pa.nulls(corr.size, I64)
            if empty
            else pa.array(self.tid[pos], I64, mask=mask | ~self.tid_ok[pos]),
        }


def _known_ids(ids: pa.Array | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values, known mask) of a nullable Arrow column, or of a numpy array where negative is unknown."""
    if isinstance(ids, np.ndarray):
        values = ids.astype(np.int64, copy=False)
        return values, values >= 0
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    known = ~np.asarray(ids.is_null(), dtype=bool) if ids.null_count else np.ones(len(ids), dtype=bool)
    values = np.asarray(ids.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    return values, known


# --- tables --------------------------------------------------------------------------------------


def const(value: Any, n: int, type_: pa.DataType = STR) -> pa.Array:
    """An array of ``n`` copies of ``value`` (null when ``value`` is None), built in C++."""
    if value is None:
        return pa.nulls(n, type_)
    return pa.repeat(pa.scalar(value, type_), n)


def stamp_kernels(cols: dict[str, pa.Array], n: int, ctx: TraceContext, kind: str | pa.Array) -> pa.Table:
    """A kernels table from ``cols`` plus the columns every row carries (node, source, run_id)."""
    out = dict(cols)
    out["node"] = const(ctx.node, n)
    out["source"] = const(ctx.source, n)
    out["run_id"] = const(ctx.run_id, n)
    out["kind"] = kind if isinstance(kind, pa.Array | pa.ChunkedArray) else const(kind, n)
    for name in ("pid", "tid", "stream", "correlation_id"):
        out.setdefault(name, pa.nulls(n, I64))
    out.setdefault("device", pa.nulls(n, STR))
    return pa.table(out)


def iterations_table(
    ctx: TraceContext,
    *,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    pid: list[int | None],
    tid: list[int | None],
    names: list[str],
    keys: list[object],
) -> pa.Table:
    """Iterations (one per range), in start order, with deterministic trace and span IDs from ``keys``."""
    order = np.argsort(start_ns, kind="stable")
    m = len(order)
    ks = [keys[i] for i in order]
    return pa.table(
        {
            "start_ns": pa.array(start_ns[order], I64),
            "end_ns": pa.array(end_ns[order], I64),
            "node": const(ctx.node, m),
            "pid": pa.array([pid[i] for i in order], I64),
            "tid": pa.array([tid[i] for i in order], I64),
            "model": const(ctx.model, m),
            "run_id": const(ctx.run_id, m),
            "trace_id": pa.array([trace_id(ctx.node, ctx.identity, "range", k) for k in ks], STR),
            "span_id": pa.array([span_id(ctx.node, ctx.identity, "range", k) for k in ks], STR),
            "source": const(ctx.source, m),
            "iteration": pa.array(np.arange(m, dtype=np.int64), I64),
            "name": pa.array([names[i] for i in order], STR),
        }
    )


def empty_kernels(ctx: TraceContext) -> pa.Table:
    """A kernels table with no rows (the required columns only)."""
    return stamp_kernels({"start_ns": pa.array([], I64), "end_ns": pa.array([], I64)}, 0, ctx, "kernel")


def empty_iterations(ctx: TraceContext) -> pa.Table:
    """An iterations table with no rows."""
    z = np.zeros(0, dtype=np.int64)
    return iterations_table(ctx, start_ns=z, end_ns=z, pid=[], tid=[], names=[], keys=[])


def split_rows(table: pa.Table, rows: int = CHUNK_ROWS) -> Iterator[pa.Table]:
    """``table`` in slices of at most ``rows`` rows (zero-copy)."""
    for start in range(0, table.num_rows, rows):
        yield table.slice(start, rows)


def chunks(
    fmt: str,
    ctx: TraceContext,
    kernels: pa.Table,
    iterations: pa.Table | None = None,
    *,
    skipped: Counter[str] | None = None,
    bad_rows: list[BadRow] | None = None,
    pids: tuple[int, ...] = (),
    devices: dict[str, dict[str, Any]] | None = None,
) -> Iterator[ParsedTrace]:
    """Wrap tables as ``ParsedTrace`` chunks of at most ``CHUNK_ROWS`` kernels.

    The iterations, the skipped counts, the bad rows and the devices ride on the first chunk, so
    that a consumer publishing chunk by chunk sees iterations before their kernels.
    """
    its = iterations if iterations is not None else empty_iterations(ctx)
    parts = list(split_rows(kernels)) or [kernels]
    for i, part in enumerate(parts):
        first = i == 0
        yield ParsedTrace(
            fmt,
            part,
            its if first else its.slice(0, 0),
            ctx.clock,
            Counter(skipped or {}) if first else Counter(),
            pids,
            devices=dict(devices or {}) if first else {},
            bad_rows=list(bad_rows or []) if first else [],
        )


# --- the program a trace names -------------------------------------------------------------------

# Programs that run another one named on their command line: the model is that one.
_RUNNERS = re.compile(
    r"^(python[\d.]*m?|pypy[\d.]*|bash|sh|zsh|dash|perl|ruby|node|julia|Rscript|lua[\d.]*|env|"
    r"torchrun|deepspeed|accelerate|mpirun|mpiexec|srun|numactl|taskset|nohup|time|uv|rocprofv3)$"
)
_SUBCOMMANDS = frozenset({"launch", "run", "exec"})  # accelerate launch x.py, uv run x.py
_SCRIPT_SUFFIXES = (".py", ".sh", ".pl", ".rb", ".js", ".jl", ".R", ".lua")
MAX_MODEL_CHARS = 128


def model_from_command(argv: list[str] | str | None) -> str | None:
    """The model a traced command line names: the script of an interpreter or launcher, else the program.

    ``python3 train.py --x`` -> ``train``; ``torchrun --nproc_per_node=8 train.py`` -> ``train``;
    ``python -m pkg.train`` -> ``train``; ``/opt/app/bench -n 3`` -> ``bench``. Options, numbers
    (``mpirun -np 8 ...``), ``NAME=value`` settings and launcher subcommands are passed over;
    ``python -c ...`` names the interpreter. A string is split on whitespace. None if it names nothing.
    """
    if isinstance(argv, str):
        argv = argv.split()
    if not argv:
        return None
    words = [a for a in argv[:256] if isinstance(a, str)]
    first: str | None = None
    runner = False
    i = 0
    while i < len(words):
        word = words[i].strip()
        i += 1
        base = word.replace("\\", "/").rsplit("/", 1)[-1]
        if not base or base.isdigit() or (runner and (word.startswith("-") or base in _SUBCOMMANDS)):
            if word in ("-m", "--module") and i < len(words):
                return _model_name(words[i].rsplit(".", 1)[-1])
            if word == "-c":
                break
            i += word in ("-W", "-X")  # python options that take a value
            continue
        if "=" in base and not word.startswith("-"):
            continue  # env NAME=value
        if _RUNNERS.match(base):
            first = first or base
            runner = True
            continue
        return _model_name(base)
    return _model_name(first) if first else None


def _model_name(base: str) -> str | None:
    for suffix in _SCRIPT_SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            base = base[: -len(suffix)]
            break
    base = "".join(ch for ch in base if ch.isprintable()).strip()[:MAX_MODEL_CHARS]
    return base or None
