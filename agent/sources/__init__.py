"""Sources: one module per input, registered here by type (a new input is a module plus one line)."""

from __future__ import annotations

from aaco.agent.sources import capture, counters, gpu_procs, replay, smi, trace_dir, xid
from aaco.agent.sources.base import Source
from aaco.agent.sources.ort import llm_source
from aaco.agent.sources.ort import source as ort
from aaco.agent.sources.sched import source as sched
from aaco.contract.component import Registry

# type -> (config model, factory). The config union in aaco.agent.config is built from this registry.
SOURCES = Registry[Source]("source")
SOURCES.register("capture", capture.CaptureConfig, capture.create)
SOURCES.register("counters", counters.CountersSourceConfig, counters.create)
SOURCES.register("gpu_processes", gpu_procs.GpuProcessesSourceConfig, gpu_procs.create)
SOURCES.register("llm_requests", llm_source.LlmRequestsConfig, llm_source.create)
SOURCES.register("ort", ort.OrtSourceConfig, ort.create)
SOURCES.register("replay", replay.ReplaySourceConfig, replay.create)
SOURCES.register("sched", sched.SchedSourceConfig, sched.create)
SOURCES.register("smi", smi.SmiSourceConfig, smi.create)
SOURCES.register("trace_dir", trace_dir.TraceDirConfig, trace_dir.create)
SOURCES.register("xid", xid.XidSourceConfig, xid.create)
