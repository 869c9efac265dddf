"""Kineto's event categories in every schema it wrote, and the GPU-looking events of categories it did not.

Kineto named its categories twice. PyTorch 1.8 to 1.10 (Kineto before its November 2021 logger
refactor, ``schemaVersion`` 1) wrote capitalised ones: ``Kernel``, ``Memcpy``, ``Memset`` for GPU
work, ``Runtime`` for the CUDA (or HIP) calls that launched it, ``Operator`` for framework
operators (``ProfilerStep#N`` among them), ``User`` for GPU-lane annotations (tid ``stream N
user``), ``Trace`` for the profiling span and ``async`` for the launch flows. Later releases write
``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_runtime``, ``cuda_driver``, ``cpu_op``,
``user_annotation`` ... (``libkineto/include/ActivityType.h``). Categories are compared without
case (``role``), so both schemas, and any other capitalisation, are one reader.

A category that is neither read (``ROLES``) nor known to hold no GPU work of its own
(``NOT_GPU_WORK``: annotations, syncs, flows, Python functions, overheads) is *unrecognised*.
``Unrecognised`` counts the complete events (``ph: "X"``) of such categories that look like GPU
work: on a GPU lane (the pid of GPU work read from the file, or one ``process_labels`` calls
``GPU n``), or, off the host's pids, with ``args.device`` / ``args.stream`` or on a tid named
``stream N``. Their counts by category go on ``ParsedTrace.unrecognised``, which the ingest reports
once per file (``aaco_trace_events_unrecognised_total``): a trace whose GPU work is all of an unknown
schema says so instead of giving an empty lake.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Set
from typing import Any

GPU_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "memcpy": "memcpy", "memset": "memset"}
LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "runtime")
OP_CATS = ("cpu_op", "operator")
ROLES = {
    **dict.fromkeys(GPU_KINDS, "gpu"),
    **dict.fromkeys(LAUNCH_CATS, "launch"),
    **dict.fromkeys(OP_CATS, "op"),
    "user_annotation": "ann",
}
NOT_GPU_WORK = frozenset(
    {
        "gpu_user_annotation",  # an annotation drawn on a GPU lane (its work is in the kernels)
        "user",  # the same in early 2021 Kineto (tid "stream N user")
        "cuda_sync",
        "cuda_event",
        "cuda_profiler_range",
        "external_correlation",
        "python_function",
        "cpu_instant_event",
        "overhead",
        "trace",
        "async",
        "ac2g",
        "fwdbwd",
        "async_cpu_to_gpu",
    }
)
MAX_CATEGORY_CHARS = 64  # a category kept in a count (a label of a message, not of a metric)
_MAX_KEYS = 4096  # distinct (category, pid, hint) counted; more are folded into one key
_OTHER = "(other categories)"
_CACHE_MAX = 1024
_roles: dict[str, str | None] = {}


def role(cat: Any) -> str | None:
    """What events of category ``cat`` are read as (``gpu``, ``launch``, ``op``, ``ann``), None if not read."""
    if type(cat) is not str:
        return None
    got = _roles.get(cat, "")
    if got != "":
        return got
    got = ROLES.get(cat.lower())
    if len(_roles) < _CACHE_MAX:
        _roles[cat] = got
    return got


def gpu_kind(cat: str) -> str:
    """The ``kind`` (kernel, memcpy, memset) of GPU work of category ``cat`` (one ``role`` reads as ``gpu``)."""
    return GPU_KINDS[cat.lower()]


class Unrecognised:
    """Complete events of categories not read and not known to hold no GPU work: counted, then judged."""

    def __init__(self) -> None:
        self._seen: Counter[tuple[str, int | None, bool]] = Counter()
        self._known: dict[str, bool] = {}  # category -> in NOT_GPU_WORK (a few distinct ones per file)

    def add(self, events: Iterable[dict[str, Any]]) -> None:
        """Count events no role reads (those of ``NOT_GPU_WORK`` are passed over)."""
        for ev in events:
            cat = ev.get("cat")
            name = cat if isinstance(cat, str) else f"<{type(cat).__name__}>"
            known = self._known.get(name)
            if known is None:
                known = name.lower() in NOT_GPU_WORK
                if len(self._known) < _CACHE_MAX:
                    self._known[name] = known
            if known:
                continue
            args, tid, pid = ev.get("args"), ev.get("tid"), ev.get("pid")
            hint = (isinstance(args, dict) and ("device" in args or "stream" in args)) or (
                isinstance(tid, str) and tid.lower().startswith("stream")
            )
            key = (name[:MAX_CATEGORY_CHARS], pid if type(pid) is int else None, hint)
            if key not in self._seen and len(self._seen) >= _MAX_KEYS:
                key = (_OTHER, None, hint)
            self._seen[key] += 1

    def gpu_looking(self, lanes: Set[int], host: Set[int]) -> Counter[str]:
        """The counted events that look like GPU work, by category.

        On a GPU lane (a pid in ``lanes``), or with a hint in the event (a device, a stream) and not on
        the host side (a pid in ``host``: a runtime call names the device it drives, it is not its work).
        """
        out: Counter[str] = Counter()
        for (cat, pid, hint), n in self._seen.items():
            if (pid is not None and pid in lanes) or (hint and (pid is None or pid not in host)):
                out[cat] += n
        return out
