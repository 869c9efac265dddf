"""A replay's rank traces read once ahead, so that a job nobody named is named from all its ranks together.

``contract.jobs.derive_jobs`` names a job from the earliest profiled step of all its ranks; a
replay publishes file after file, and the first file read need not hold the earliest rank. So
before reading, ``prescan`` looks at the head of every Kineto trace (``head_rank``: the
``distributedInfo`` Kineto writes before ``traceEvents``; ``HEAD_BYTES`` of the decompressed file
at most), and the files of a (backend, world size) that more than one file shares are parsed once
ahead for their profiled spans (``ParsedTrace.span_ns``): the names ``derive_jobs`` gives them
together are ``preset`` in the replay's ``JobRegistry``. Such files are read twice; a file alone
in its (backend, world size), or whose ``distributedInfo`` comes after its events, is named as it
is read. A file that fails here is left to the replay, which reports it.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.limits import open_trace
from aaco.agent.sources.traces.parse import parse_any
from aaco.contract.jobs import MIN_WORLD, RankSpan, derive_jobs

log = logging.getLogger("aaco.sources.job_scan")
HEAD_BYTES = 256 * 1024
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


def prescan(files: list[TraceFile], context: Callable[[TraceFile], TraceContext]) -> dict[str, str]:
    """Identity -> job name for the rank traces among ``files`` that share a (backend, world size) (module doc)."""
    heads = {tf.identity: head_rank(tf) for tf in files if tf.format == "kineto"}
    shared = Counter(h for h in heads.values() if h is not None and h[1] >= MIN_WORLD)
    todo = [tf for tf in files if shared.get(heads.get(tf.identity) or ("", 0), 0) > 1]
    if not todo:
        return {}
    log.info("reading %d rank traces ahead to name their jobs", len(todo))
    spans = []
    for tf in todo:
        try:
            parts = parse_any(tf, replace(context(tf), jobs=None, job_environ=False))
            first = next(parts, None)
            parts.close()  # type: ignore[attr-defined]
        except Exception:  # the replay reads it again and reports it
            continue
        job = first.job if first is not None else None
        if job is None or first is None or first.span_ns is None or not job.dist_backend or not job.world_size:
            continue
        spans.append(RankSpan(tf.identity, job.dist_backend, job.world_size, *first.span_ns))
    return {str(k): v for k, v in derive_jobs(spans).items()}
