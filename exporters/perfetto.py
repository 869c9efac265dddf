"""Perfetto export of a trace window: a Chrome-trace JSON file that ui.perfetto.dev opens as it is.

The JSON trace-event format (``traceEvents``) is one Perfetto's UI imports directly, with no extra
tool: complete events (``ph: X``) for iterations and CPU launch calls on the workload's process and
thread tracks, GPU kernels, copies and memsets on one track per device and stream, flow arrows
(``ph: s`` / ``f``) from each launch to the GPU work it started, and counter tracks (``ph: C``) for GPU
telemetry. Times are microseconds from the Unix epoch, as Kineto writes them. Bounded: at most
``max_events`` events are kept (the rest counted as dropped, reason ``perfetto_full``); the file is
written atomically at flush and shutdown.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import orjson

from aaco.contract.schemas import EventBatch
from aaco.contract.stats import EVENTS_DROPPED, EVENTS_EMITTED, Stats
from aaco.exporters.base import Exporter, ExportResult

log = logging.getLogger("aaco.exporters.perfetto")
GPU_PID_BASE = 1 << 30  # GPU tracks get their own "process" IDs, apart from real pids


class PerfettoExporter(Exporter):
    """Collects events (bounded) and writes one Chrome-trace JSON file for Perfetto."""

    name = "perfetto"

    def __init__(self, path: Path, stats: Stats, max_events: int = 2_000_000) -> None:
        self.path = Path(path)
        self.stats = stats
        self.max_events = max_events
        self._events: list[dict[str, Any]] = []
        self._gpu_pids: dict[str, int] = {}
        self._named: set[tuple[int, int | None]] = set()
        self._closed = False

    def _gpu_pid(self, device: str) -> int:
        pid = self._gpu_pids.get(device)
        if pid is None:
            pid = self._gpu_pids[device] = GPU_PID_BASE + len(self._gpu_pids)
            self._meta(pid, None, f"GPU {device}")
        return pid

    def _meta(self, pid: int, tid: int | None, name: str) -> None:
        if (pid, tid) in self._named:
            return
        self._named.add((pid, tid))
        if tid is None:
            self._events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        else:
            self._events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})

    def _room(self, n: int) -> int:
        room = max(0, self.max_events - len(self._events))
        if room < n:
            self.stats.inc(EVENTS_DROPPED, n - room, component="exporter:perfetto", reason="perfetto_full")
        return min(room, n)

    def export(self, batch: EventBatch) -> ExportResult:
        """Turn a batch's rows into trace events."""
        if self._closed or batch.rows == 0:
            return ExportResult.SUCCESS
        rows = batch.batch.to_pylist()[: self._room(batch.rows)]
        if batch.kind == "iterations":
            for r in rows:
                pid, tid = r["pid"] or 0, r["tid"] or r["pid"] or 0
                self._events.append(
                    {
                        "ph": "X",
                        "cat": "iteration",
                        "name": r["name"] or "iteration",
                        "pid": pid,
                        "tid": tid,
                        "ts": r["start_ns"] / 1000,
                        "dur": (r["end_ns"] - r["start_ns"]) / 1000,
                        "args": {"model": r["model"], "trace_id": r["trace_id"], "iteration": r["iteration"]},
                    }
                )
        elif batch.kind == "kernels":
            for r in rows:
                self._kernel(r)
        elif batch.kind == "telemetry":
            for r in rows:
                self._events.append(
                    {
                        "ph": "C",
                        "name": r["metric"],
                        "pid": self._gpu_pid(r["device"]),
                        "ts": r["ts_ns"] / 1000,
                        "args": {r["unit"] or "value": r["value"]},
                    }
                )
        self.stats.inc(EVENTS_EMITTED, len(rows), component="exporter:perfetto")
        return ExportResult.SUCCESS

    def _kernel(self, r: dict[str, Any]) -> None:
        device = r["device"] or "?"
        pid = self._gpu_pid(device)
        tid = r["stream"] if r["stream"] is not None else 0
        self._meta(pid, tid, f"stream {tid}")
        args = {
            k: r[k]
            for k in ("correlation_id", "trace_id", "op_name", "grid_x", "workgroup_x", "bytes")
            if r.get(k) is not None
        }
        self._events.append(
            {
                "ph": "X",
                "cat": r["kind"],
                "name": r["name"],
                "pid": pid,
                "tid": tid,
                "ts": r["start_ns"] / 1000,
                "dur": (r["end_ns"] - r["start_ns"]) / 1000,
                "args": args,
            }
        )
        if r["launch_start_ns"] is None or r["pid"] is None:
            return
        host_pid, host_tid = r["pid"], r["tid"] or r["pid"]
        flow = r["correlation_id"] if r["correlation_id"] is not None else len(self._events)
        self._events += [
            {
                "ph": "X",
                "cat": "launch",
                "name": r["launch_name"] or "launch",
                "pid": host_pid,
                "tid": host_tid,
                "ts": r["launch_start_ns"] / 1000,
                "dur": ((r["launch_end_ns"] or r["launch_start_ns"]) - r["launch_start_ns"]) / 1000,
            },
            {
                "ph": "s",
                "cat": "launch",
                "name": "launch",
                "id": flow,
                "pid": host_pid,
                "tid": host_tid,
                "ts": r["launch_start_ns"] / 1000,
            },
            {
                "ph": "f",
                "bp": "e",
                "cat": "launch",
                "name": "launch",
                "id": flow,
                "pid": pid,
                "tid": tid,
                "ts": r["start_ns"] / 1000,
            },
        ]

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Write the file (atomically)."""
        doc = {"displayTimeUnit": "ms", "otherData": {"producer": "aaco"}, "traceEvents": self._events}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(orjson.dumps(doc))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("perfetto: cannot write %s: %s", self.path, exc)
            return False
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Write the file once more and stop (idempotent)."""
        if not self._closed:
            self.force_flush(timeout_s)
            self._closed = True
