"""Every trace format the agent reads, one registration line each, in the order their sniffs are tried.

A new format is a module declaring its ``TraceFormat`` (sniff and parse) plus one line here.
"""

from __future__ import annotations

from aaco.agent.sources.traces import kineto, ort_profile, rocpd, rocprof_v1, rocprofv3_csv, rocprofv3_json
from aaco.agent.sources.traces.format import FormatRegistry

TRACE_FORMATS = FormatRegistry()
TRACE_FORMATS.register(rocpd.TRACE_FORMAT)
TRACE_FORMATS.register(ort_profile.TRACE_FORMAT)
TRACE_FORMATS.register(rocprofv3_json.TRACE_FORMAT)
TRACE_FORMATS.register(rocprof_v1.JSON_FORMAT)
TRACE_FORMATS.register(kineto.TRACE_FORMAT)
TRACE_FORMATS.register(rocprofv3_csv.TRACE_FORMAT)
TRACE_FORMATS.register(rocprof_v1.CSV_FORMAT)
