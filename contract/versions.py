"""The software a node ran: one row of the lake's ``versions`` dataset each time it changes.

``versions/date=YYYY-MM-DD/node=<node>/part-NNNNNN.parquet`` beside the event kinds (the node in
the path only, as for them). A row holds what the agent found on its machine when it started or
when that changed: the GPU driver, ROCm, CUDA, ONNX Runtime, the OS kernel and AACO. Fleet queries
join a node's events to the row in force at their time (docs/fleet.md), so a latency change after a
driver upgrade shows as two groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import pyarrow as pa

KIND: Final = "versions"
FIELDS: Final = ("gpu_driver", "rocm_version", "cuda_version", "onnxruntime_version", "os_kernel", "aaco_version")
SCHEMA: Final = pa.schema(
    [pa.field("ts_ns", pa.int64(), nullable=False), pa.field("node", pa.string(), nullable=False)]
    + [pa.field(name, pa.string()) for name in FIELDS]
)


def row(ts_ns: int, node: str, found: Mapping[str, object]) -> pa.Table:
    """One versions row from what was found (``FIELDS`` only; a missing one is null)."""
    data: dict[str, list[object]] = {"ts_ns": [ts_ns], "node": [node]}
    for name in FIELDS:
        value = found.get(name)
        data[name] = [None if value is None else str(value)]
    return pa.table(data, schema=SCHEMA)
