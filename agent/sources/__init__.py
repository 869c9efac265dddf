"""Sources: one module per input, registered here by type (a new input is a module plus one line)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aaco.agent.sources import capture, replay, smi, trace_dir
from aaco.agent.sources.ort import source as ort
from aaco.agent.sources.sched import source as sched

# type -> (config model, factory). The config union in aaco.agent.config is built from this table.
REGISTRY: dict[str, tuple[type[Any], Callable[[Any, str], Any]]] = {
    "capture": (capture.CaptureConfig, capture.create),
    "ort": (ort.OrtSourceConfig, ort.create),
    "replay": (replay.ReplaySourceConfig, replay.create),
    "sched": (sched.SchedSourceConfig, sched.create),
    "smi": (smi.SmiSourceConfig, smi.create),
    "trace_dir": (trace_dir.TraceDirConfig, trace_dir.create),
}
