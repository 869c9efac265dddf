"""A replay's rank traces read once ahead, so that a job nobody named is named from all its ranks together.

``contract.jobs.derive_jobs`` names a job from the earliest profiled step of all its ranks; a
replay publishes file after file, and the first file read need not hold the earliest rank. So
before reading, ``prescan`` looks at the head of every Kineto trace (``head_rank``: the
``distributedInfo`` Kineto writes before ``traceEvents``; ``HEAD_BYTES`` of the decompressed file
at most), and the files of a (backend, world size) that more than one file shares are parsed once
ahead for their profiled spans (``ParsedTrace.span_ns``): the names ``derive_jobs`` gives them
together are ``preset`` in the replay's ``JobRegistry``. Their chunks are kept for the replay
(``ReadAhead``: up to ``KEEP_BYTES`` of tables; beyond, a file is read twice, the first time without
its critical path); a file alone in its (backend, world size), or whose ``distributedInfo`` comes
after its events, is named as it is read. A file that fails here is left to the replay, which
reports it.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.limits import DEFAULT_MAX_BYTES, TraceLimits, open_trace
from aaco.agent.sources.traces.parse import read_ahead
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.contract.jobs import MIN_WORLD, RankSpan, derive_jobs

log = logging.getLogger("aaco.sources.job_scan")
HEAD_BYTES = 256 * 1024
KEEP_BYTES = 256 << 20  # chunks read ahead kept for the replay (Arrow bytes), not read twice
_INFO = re.compile(rb'"distributedInfo"\s*:\s*\{')
_EVENTS = re.compile(rb'"traceEvents"\s*:')
_BACKEND = re.compile(rb'"backend"\s*:\s*"([A-Za-z0-9_:.-]{1,64})"')
_WORLD = re.compile(rb'"world_size"\s*:\s*(\d{1,9})\b')


def head_rank(tf: TraceFile) -> tuple[str, int] | None:
    """(backend, world size) of a Kineto trace whose ``distributedInfo`` precedes its events; None otherwise."""
    try:
        head = bytearray()
        with open_trace(tf.path, tf.limits, json_guard=False) as fh:
            while len(head) < HEAD_BYTES and (piece := fh.read(HEAD_BYTES - len(head))):
                head += piece
    except Exception:  # unreadable here: the replay reads it and reports why
        return None
    info, events = _INFO.search(head), _EVENTS.search(head)
    if info is None or (events is not None and events.start() < info.start()):
        return None
    text = head[info.end() : events.start() if events is not None else len(head)]
    backend, world = _BACKEND.search(text), _WORLD.search(text)
    if backend is None or world is None:
        return None
    return backend.group(1).decode().lower(), int(world.group(1))


@dataclass
class ReadAhead:
    """What ``prescan`` found: the names of the jobs, and the chunks of the files it kept (by identity)."""

    names: dict[str, str] = field(default_factory=dict)
    chunks: dict[str, list[ParsedTrace]] = field(default_factory=dict)

    def take(self, identity: str) -> list[ParsedTrace] | None:
        """The kept chunks of a file (once), None when it must be read."""
        return self.chunks.pop(identity, None)


def prescan(
    files: list[TraceFile],
    context: Callable[[TraceFile], TraceContext],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    keep_bytes: int = KEEP_BYTES,
) -> ReadAhead:
    """The job names of the rank traces among ``files`` that share a (backend, world size) (module doc).

    The chunks of the files read ahead are kept while their tables hold at most ``keep_bytes``, so
    the replay does not read them again; past that, the rest are read for their span alone (no
    critical path) and read again by the replay.
    """
    heads = {tf.identity: head_rank(tf) for tf in files if tf.format == "kineto"}
    shared = Counter(h for h in heads.values() if h is not None and h[1] >= MIN_WORLD)
    todo = [tf for tf in files if shared.get(heads.get(tf.identity) or ("", 0), 0) > 1]
    out = ReadAhead()
    if not todo:
        return out
    log.info("reading %d rank traces ahead to name their jobs", len(todo))
    spans, kept = [], 0
    for tf in todo:
        keep = kept < keep_bytes
        ahead = tf if keep else replace(tf, limits=replace(tf.limits or TraceLimits(), critical_path="off"))
        try:
            chunks = read_ahead(ahead, context(tf), max_bytes=max_bytes)
            first = next(chunks, None)
            rest = list(chunks) if keep and first is not None else []
            chunks.close()  # type: ignore[attr-defined]
        except Exception:  # the replay reads it again and reports it
            continue
        if keep and first is not None:
            out.chunks[tf.identity] = [first, *rest]
            kept += sum(c.kernels.nbytes + c.iterations.nbytes for c in out.chunks[tf.identity])
        job = first.job if first is not None else None
        if job is None or first is None or first.span_ns is None or not job.dist_backend or not job.world_size:
            continue
        spans.append(RankSpan(tf.identity, job.dist_backend, job.world_size, *first.span_ns))
    out.names = {str(k): v for k, v in derive_jobs(spans).items()}
    return out
