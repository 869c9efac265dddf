"""The process a Kineto trace is of: its pid (for GPU work with no launch in the file) and the model it names.

Kineto writes one trace per profiled process. Its metadata events (``ph: "M"``) name each lane:
``process_name`` (``args.name``) and ``process_labels`` (``args.labels``: ``CPU`` for the host
process, ``GPU 0`` ... for the device lanes, whose pid is the device index). Kineto takes the
process name from ``/proc/<pid>/cmdline``: the base name of ``argv[0]``, so ``python3.10`` for a
plain ``python train.py``, or the title a process set for itself (``pyper:trainer:0:0``).

The host process (``host_pid``), first rule that gives exactly one pid:

1. the pids of the CPU side, launch calls (``cuda_runtime``, ``cuda_driver``) and operators
   (``cpu_op``); with several, the one of them labelled ``CPU``;
2. when the trace has no CPU side (a GPU-only capture): the one pid labelled ``CPU``, else the one
   pid named by ``process_name`` that is neither a device lane (a pid of GPU events) nor labelled
   as something other than ``CPU``.

Otherwise there is none (a merged trace of several processes), and unlaunched work keeps no pid.

The model (``model_name``): the host process's name, unless it only names an interpreter or
launcher (``python``, ``python3.10``, ``pypy3``, ``ipython``, ``pt_main_thread``, ``torchrun``, or a
packaged interpreter with such a ``#``-separated part, as in ``penv#...#python#py_version_3_10``):
that says nothing about the model, and the caller falls back to the file name. Trailing ``:N``
fields (the rank and local rank process titles carry, ``pyper:trainer:0:0``) are removed, so every
rank of one job names the same model (``pyper:trainer``). A name longer than ``MAX_MODEL_BYTES``
(it becomes a metric label) is not used and is counted as ``name_too_long``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

from aaco.agent.sources.traces.json_values import NAME_TOO_LONG, IntOutOfRangeError, need_int

MAX_MODEL_BYTES = 256
_INTERPRETER = re.compile(r"^(?:i?python|pypy)[\d.]*[dmu]*$|^(?:pt_main_thread|torchrun)$", re.I)
_TRAILING_INDEXES = re.compile(r"(?::\d+)+$")


@dataclass
class ProcessInfo:
    """What the metadata events say about the trace's processes: names and labels by pid."""

    names: dict[int, str] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)

    def add(self, ev: dict[str, Any], skipped: Counter[str]) -> None:
        """Fold in one metadata event (``process_name`` or ``process_labels``; others are ignored)."""
        kind = ev.get("name")
        if kind not in ("process_name", "process_labels"):
            return
        args = ev.get("args")
        value = args.get("name" if kind == "process_name" else "labels") if isinstance(args, dict) else None
        if not isinstance(value, str):
            return
        try:
            pid = need_int(ev.get("pid"))
        except IntOutOfRangeError:
            skipped["int_out_of_range"] += 1
            return
        if pid is None:
            return
        if len(value) > MAX_MODEL_BYTES:  # characters >= bytes / 4: no need to encode to refuse
            value = value[: MAX_MODEL_BYTES + 1]
        (self.names if kind == "process_name" else self.labels)[pid] = value

    def _cpu_labelled(self, pids: Set[int]) -> int | None:
        cpu = [p for p in pids if self.labels.get(p, "").strip().upper() == "CPU"]
        return cpu[0] if len(cpu) == 1 else None

    def gpu_pids(self) -> set[int]:
        """The pids ``process_labels`` calls ``GPU n`` (Kineto's device lanes)."""
        return {p for p, label in self.labels.items() if label.strip().upper().startswith("GPU")}

    def cpu_pids(self) -> set[int]:
        """The pids ``process_labels`` calls ``CPU`` (the host processes)."""
        return {p for p, label in self.labels.items() if label.strip().upper() == "CPU"}

    def host_pid(self, cpu_pids: Set[int], gpu_lanes: Set[int]) -> int | None:
        """The pid of the process the trace is of (see the module doc), or None."""
        if len(cpu_pids) == 1:
            return next(iter(cpu_pids))
        if cpu_pids:
            return self._cpu_labelled(cpu_pids)
        labelled = self._cpu_labelled(set(self.labels))
        if labelled is not None:
            return labelled
        named = [
            p
            for p in self.names
            if p not in gpu_lanes and self.labels.get(p, "CPU").strip().upper() == "CPU" and p >= 0
        ]
        return named[0] if len(named) == 1 else None

    def model_name(self, host: int | None, skipped: Counter[str]) -> str | None:
        """The model the host process's name says, or None (see the module doc)."""
        if host is None or host not in self.names:
            return None
        name = _TRAILING_INDEXES.sub("", self.names[host].strip())
        if not name or is_interpreter(name):
            return None
        try:
            encoded = name.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: not a name any column can hold
            skipped["bad_name"] += 1
            return None
        if len(encoded) > MAX_MODEL_BYTES:
            skipped[NAME_TOO_LONG] += 1
            return None
        return name


def is_interpreter(name: str) -> bool:
    """Whether a process name only names an interpreter or launcher (see the module doc)."""
    return any(_INTERPRETER.match(part.strip()) for part in name.split("#"))
