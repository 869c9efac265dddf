"""MIG on ``fake_nvml`` (not a test module): nvidia-ml-py's MIG calls over a table of MIG devices.

``with_mig(mod, migs)`` adds ``NVML_DEVICE_MIG_ENABLE``/``DISABLE``, ``nvmlDeviceGetMigMode`` (a
``[current, pending]`` list, as pynvml returns it), ``nvmlDeviceGetMaxMigDeviceCount`` (7),
``nvmlDeviceGetMigDeviceHandleByIndex`` (``NVML_ERROR_NOT_FOUND``, 6, at an index without a MIG
device: indexes may have holes), ``nvmlDeviceGetGpuInstanceId`` and ``nvmlDeviceGetComputeInstanceId``
(``NVML_ERROR_INVALID_ARGUMENT``, 2, on a handle that is not a MIG device's, as NVML answers). A MIG
device is a ``FakeGpu`` (its ``uuid``, ``mem``), so ``nvmlDeviceGetUUID`` and
``nvmlDeviceGetMemoryInfo`` of ``fake_nvml`` answer on its handle. ``migs`` maps a GPU's position to
its MIG devices by index: ``{0: {0: FakeMig(...), 2: FakeMig(...)}}``; a GPU not in it is not in MIG mode.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

from .smi_fakes import FakeGpu, NVMLError


@dataclass
class FakeMig:
    gi: int
    ci: int
    device: FakeGpu = field(default_factory=FakeGpu)


def with_mig(mod: types.ModuleType, gpus: list[FakeGpu], migs: dict[int, dict[int, FakeMig]]) -> types.ModuleType:
    """``mod`` (a ``fake_nvml(gpus)``) with NVML's MIG calls over ``migs``."""
    mod.NVML_DEVICE_MIG_DISABLE, mod.NVML_DEVICE_MIG_ENABLE = 0, 1
    mod.NVML_ERROR_NOT_FOUND = 6
    by_handle = {id(m.device): m for table in migs.values() for m in table.values()}

    def position(h: FakeGpu) -> int:
        return next(i for i, g in enumerate(gpus) if g is h)

    def nvmlDeviceGetMigMode(h: FakeGpu) -> list[int]:
        mod.calls.append("nvmlDeviceGetMigMode")
        on = int(position(h) in migs)
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(h: FakeGpu) -> int:
        return 7 if position(h) in migs else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(h: FakeGpu, index: int) -> FakeGpu:
        mod.calls.append("nvmlDeviceGetMigDeviceHandleByIndex")
        table = migs.get(position(h), {})
        if index not in table:
            raise NVMLError(6)
        return table[index].device

    def instance(h: FakeGpu, attr: str) -> int:
        if id(h) not in by_handle:
            raise NVMLError(2)
        return getattr(by_handle[id(h)], attr)

    mod.nvmlDeviceGetMigMode = nvmlDeviceGetMigMode
    mod.nvmlDeviceGetMaxMigDeviceCount = nvmlDeviceGetMaxMigDeviceCount
    mod.nvmlDeviceGetMigDeviceHandleByIndex = nvmlDeviceGetMigDeviceHandleByIndex
    mod.nvmlDeviceGetGpuInstanceId = lambda h: instance(h, "gi")
    mod.nvmlDeviceGetComputeInstanceId = lambda h: instance(h, "ci")
    return mod
