"""MIG devices through NVML: each MIG device of a GPU in MIG mode a device of its own (docs/shared-gpus.md).

``nvmlDeviceGetMigMode`` (current, pending; ``NVML_DEVICE_MIG_ENABLE`` 1) says whether the GPU is
split; ``nvmlDeviceGetMaxMigDeviceCount`` bounds the indexes of ``nvmlDeviceGetMigDeviceHandleByIndex``,
which answers ``NVML_ERROR_NOT_FOUND`` for an index with no MIG device (the indexes are an
enumeration, not the device's name). On a MIG handle ``nvmlDeviceGetGpuInstanceId`` and
``nvmlDeviceGetComputeInstanceId`` give its GPU and compute instance ids (its index
``<gpu>/<gi>/<ci>``, as from nvidia-smi), ``nvmlDeviceGetUUID`` its ``MIG-...`` UUID and
``nvmlDeviceGetMemoryInfo`` its own memory used and total. Nothing else is read on a MIG handle:
power, temperature, clocks and the rest are the parent GPU's (NVML answers them on the parent's
handle only, or repeats the parent's values).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from aaco.agent.sources.smi.nvml_errors import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    GpuLostError,
)
from aaco.agent.sources.smi.values import Fields
from aaco.contract.telemetry import MEMORY_LIMIT, MEMORY_USAGE, GpuIdentity, GpuSample

NVML_DEVICE_MIG_ENABLE: Final = 1
MAX_MIG_DEVICES: Final = 16  # 7 on A100/H100; a bound against a driver's odd answer


def read_mig(
    n: ModuleType, f: Fields, where: str, q: Callable[..., Any], parent: GpuIdentity, h: Any
) -> list[GpuSample]:
    """The MIG devices of the GPU behind handle ``h`` (none when it is not in MIG mode or NVML is too old).

    ``q(fn, *args)`` calls NVML as the reader does (None for a query not supported, a problem for
    other errors, ``GpuLostError`` for a lost GPU).
    """
    get_mode = getattr(n, "nvmlDeviceGetMigMode", None)
    if get_mode is None:
        return []
    mode = q(get_mode, h)
    if not mode or int(mode[0]) != getattr(n, "NVML_DEVICE_MIG_ENABLE", NVML_DEVICE_MIG_ENABLE):
        return []
    count = q(n.nvmlDeviceGetMaxMigDeviceCount, h)
    out: list[GpuSample] = []
    seen: set[str] = set()
    for j in range(min(int(count or 0), MAX_MIG_DEVICES)):
        path = f"{where}/mig[{j}]"
        try:
            mh = n.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
        except n.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == NVML_ERROR_GPU_IS_LOST:
                raise GpuLostError(str(exc)) from exc
            if code not in (NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED):  # not found: no MIG device there
                f.problem(path, f"nvmlDeviceGetMigDeviceHandleByIndex: {exc}")
            continue
        gi = q(n.nvmlDeviceGetGpuInstanceId, mh)
        ci = q(n.nvmlDeviceGetComputeInstanceId, mh)
        if gi is None or ci is None:
            f.problem(path, "a MIG device without its GPU or compute instance id")
            continue
        index = f"{parent.index}/{int(gi)}/{int(ci)}"
        if index in seen:
            continue
        seen.add(index)
        uuid = q(n.nvmlDeviceGetUUID, mh)
        s = GpuSample(
            GpuIdentity(
                index,
                uuid=_text(uuid or ""),
                model=parent.model,
                vendor=parent.vendor,
                parent=parent.index,
                parent_uuid=parent.uuid,
                gpu_instance=str(int(gi)),
                compute_instance=str(int(ci)),
            )
        )
        mem = q(n.nvmlDeviceGetMemoryInfo, mh)
        if mem is not None:
            s.add(MEMORY_USAGE, float(mem.used))
            s.add(MEMORY_LIMIT, float(mem.total))
        out.append(s)
    return out


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)
