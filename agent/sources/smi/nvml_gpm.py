"""NVIDIA's activity counters through NVML GPM (GPU Performance Monitoring; Hopper and later).

GPM metrics are computed from two samples of the GPU's counters: per GPU the reader keeps two
sample buffers (``nvmlGpmSampleAlloc`` twice, once in the GPU's life; ``nvmlGpmSampleFree`` on
``close``), fills the current one each sample (``nvmlGpmSampleGet``) and asks for the metrics over
the previous and current pair (``nvmlGpmMetricsGet``: ``c_nvmlGpmMetricsGet_t`` with ``version``
``NVML_GPM_METRICS_GET_VERSION``, ``numMetrics``, ``sample1`` the older, ``sample2`` the newer, and
``metrics[i].metricId``; each metric comes back with its own ``nvmlReturn`` and ``value``). The
first sample of a GPU, and the first after a pause, only primes: no readings until a pair exists.

NVML calls per GPU and sample: 2 (``nvmlGpmSampleGet``, ``nvmlGpmMetricsGet``; 1 on a priming
sample). Once per GPU: ``nvmlGpmQueryDeviceSupport`` and two ``nvmlGpmSampleAlloc``. A GPU that
does not support GPM (``isSupportedDevice`` 0, ``NVML_ERROR_NOT_SUPPORTED``, a binding or driver
without the calls) gives nothing, not even ``aaco.gpu.counters.paused``, and is not asked again.

Readings (the NVML API reference, ``nvmlGpmMetricId_t``: percentages 0..100 are ratios 0..1, MiB/s
are 1 048 576 bytes/s): GRAPHICS_UTIL as ``aaco.gpu.graphics.active``, SM_UTIL as
``aaco.gpu.sm.active``, SM_OCCUPANCY, ANY_TENSOR_UTIL as ``aaco.gpu.tensor.active``, DRAM_BW_UTIL
as ``aaco.gpu.dram.active``, PCIE_TX/RX_PER_SEC ("PCIe traffic from/to this GPU in MiB/sec") as
``aaco.gpu.pcie.throughput{direction=transmit|receive}``, NVLINK_TOTAL_TX/RX_PER_SEC as
``aaco.gpu.nvlink.throughput``, and the busiest of NVDEC 0..7 and NVENC 0..3 as
``aaco.gpu.media.active``. A metric the GPU does not have (its ``nvmlReturn`` not success) is left
out. MIG instances (``nvmlGpmMigSampleGet``) are not read.

Back-off (``counters_guard``): while paused no GPM call is made; ``NVML_ERROR_IN_USE`` pauses the
sample as busy; other errors count towards turning the GPU's counters off. GPM does not use the
profiling (perfmon) counters that Nsight and DCGM's profiling module hold exclusively (NVIDIA/DCGM
issue 62), so pausing for another profiler keeps out of its measurement rather than out of its
way; ``profilers: []`` keeps GPM sampling through profiling runs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Final

from aaco.agent.sources.smi.counters_guard import CountersGuard
from aaco.agent.sources.smi.nvml_errors import (
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_IN_USE,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    GpuLostError,
)
from aaco.agent.sources.smi.values import Fields
from aaco.contract.telemetry import (
    DRAM_ACTIVE,
    GRAPHICS_ACTIVE,
    MEDIA_ACTIVE,
    MIB,
    NVLINK_THROUGHPUT,
    PCIE_THROUGHPUT,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    GpuSample,
)

NVML_GPM_METRICS_GET_VERSION: Final = 1
_UNSUPPORTED: Final = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND})
_OLD_DRIVER: Final = frozenset({NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_ARGUMENT_VERSION_MISMATCH})

# nvmlGpmMetricId_t name, its value, the reading, its scale, its attributes
METRICS: Final = (
    ("NVML_GPM_METRIC_GRAPHICS_UTIL", 1, GRAPHICS_ACTIVE, 0.01, {}),
    ("NVML_GPM_METRIC_SM_UTIL", 2, SM_ACTIVE, 0.01, {}),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", 3, SM_OCCUPANCY, 0.01, {}),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5, TENSOR_ACTIVE, 0.01, {}),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", 10, DRAM_ACTIVE, 0.01, {}),
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", 20, PCIE_THROUGHPUT, float(MIB), {"direction": "transmit"}),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", 21, PCIE_THROUGHPUT, float(MIB), {"direction": "receive"}),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", 60, NVLINK_THROUGHPUT, float(MIB), {"direction": "receive"}),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", 61, NVLINK_THROUGHPUT, float(MIB), {"direction": "transmit"}),
)
NVDEC: Final = tuple((f"NVML_GPM_METRIC_NVDEC_{i}_UTIL", 30 + i) for i in range(8))
# Added to NVML after the first GPM metrics: a driver that refuses the request with them is asked without (_failed)
NVENC: Final = tuple((f"NVML_GPM_METRIC_NVENC_{i}_UTIL", 166 + i) for i in range(4))
MAX_GPUS: Final = 1024


@dataclass
class _Gpu:
    """A GPU's two sample buffers (previous, current), its request, and whether a previous sample exists."""

    samples: list[Any] = field(default_factory=list)
    request: Any = None
    ids: tuple[int, ...] = ()
    primed: bool = False
    newest_ids: bool = True  # NVENC asked for


class GpmReader:
    """Per GPU GPM state: support (asked once), sample buffers, the previous sample."""

    def __init__(self, nvml: Any, guard: CountersGuard) -> None:
        self.nvml = nvml
        self.guard = guard
        self._gpus: dict[str, _Gpu] = {}
        self._unsupported: set[str] = set()

    def start_sample(self) -> None:
        """Once per sample, before any GPU (the guard looks for profilers)."""
        self.guard.start_sample()

    def close(self) -> None:
        """Free every sample buffer."""
        free = getattr(self.nvml, "nvmlGpmSampleFree", None)
        for state in self._gpus.values():
            for buf in state.samples:
                with contextlib.suppress(Exception):  # shutting down: nothing left to do about it
                    free(buf)  # type: ignore[misc]
        self._gpus.clear()

    def read(self, f: Fields, where: str, gpu: str, h: Any, s: GpuSample) -> None:
        """Add ``gpu``'s GPM readings (``h`` its handle) and ``aaco.gpu.counters.paused`` to ``s``."""
        if gpu in self._unsupported:
            return
        state = self._gpus.get(gpu)
        if state is None and not self.guard.is_off(gpu):
            try:
                if not self._supported(h):
                    self._forget(gpu)
                    return
                state = self._new(gpu)
            except self.nvml.NVMLError as exc:
                if not self._failed(f, where, gpu, exc, "nvmlGpmQueryDeviceSupport"):
                    return
        if state is None or self.guard.paused(gpu):
            if state is not None:
                state.primed = False  # the pair must not span the pause
        else:
            try:
                self._sample(state, h, s)
                self.guard.succeeded(gpu)
            except self.nvml.NVMLError as exc:
                state.primed = False
                if not self._failed(f, where, gpu, exc, "GPM sample", state):
                    return
        self.guard.publish(gpu, s)

    def _supported(self, h: Any) -> bool:
        n = self.nvml
        query = getattr(n, "nvmlGpmQueryDeviceSupport", None)
        if query is None or not hasattr(n, "nvmlGpmMetricsGet"):
            return False  # a binding without GPM
        return bool(getattr(query(h), "isSupportedDevice", 0))

    def _new(self, gpu: str) -> _Gpu:
        if len(self._gpus) >= MAX_GPUS:
            self.close()
        state = self._gpus[gpu] = _Gpu()
        return state

    def _build_request(self, state: _Gpu) -> None:
        n = self.nvml
        ids = [getattr(n, name, value) for name, value, *_ in METRICS]
        ids += [getattr(n, name, value) for name, value in NVDEC]
        if state.newest_ids:
            ids += [getattr(n, name, value) for name, value in NVENC]
        req = n.c_nvmlGpmMetricsGet_t()
        req.version = getattr(n, "NVML_GPM_METRICS_GET_VERSION", NVML_GPM_METRICS_GET_VERSION)
        req.numMetrics = len(ids)
        for i, metric_id in enumerate(ids):
            req.metrics[i].metricId = metric_id
        state.request, state.ids = req, tuple(ids)

    def _forget(self, gpu: str) -> None:
        """``gpu`` has no GPM: free what it holds, never ask again."""
        state = self._gpus.pop(gpu, None)
        free = getattr(self.nvml, "nvmlGpmSampleFree", None)
        for buf in state.samples if state is not None else ():
            with contextlib.suppress(Exception):
                free(buf)  # type: ignore[misc]
        if len(self._unsupported) >= MAX_GPUS:
            self._unsupported.clear()
        self._unsupported.add(gpu)

    def _failed(self, f: Fields, where: str, gpu: str, exc: Exception, what: str, state: _Gpu | None = None) -> bool:
        """Sort a GPM error; False when the GPU turned out to have no GPM (nothing to publish)."""
        code = getattr(exc, "value", None)
        if code == NVML_ERROR_GPU_IS_LOST:
            raise GpuLostError(str(exc)) from exc
        if code in _UNSUPPORTED:
            self._forget(gpu)
            return False
        if state is not None and state.newest_ids and code in _OLD_DRIVER:
            state.newest_ids = False  # a driver older than the NVENC metrics: ask without them
            self._build_request(state)
            return True
        if code == NVML_ERROR_IN_USE:
            self.guard.busy(gpu)
            return True
        message = f"{what}: {exc}"
        f.problem(where, message)
        self.guard.failed(gpu, message)
        return True

    def _sample(self, state: _Gpu, h: Any, s: GpuSample) -> None:
        """Take the current sample; with a previous one, add the metrics over the pair."""
        n = self.nvml
        while len(state.samples) < 2:  # allocated once per GPU (registered first: freed even if the next fails)
            state.samples.append(n.nvmlGpmSampleAlloc())
        if state.request is None:
            self._build_request(state)
        previous, current = state.samples
        n.nvmlGpmSampleGet(h, current)
        if state.primed:
            req = state.request
            req.sample1, req.sample2 = previous, current
            n.nvmlGpmMetricsGet(req)
            _readings(req, len(state.ids), s)
        state.samples = [current, previous]
        state.primed = True


def _readings(req: Any, count: int, s: GpuSample) -> None:
    """The readings of ``req``'s first ``count`` metrics: ``METRICS`` in order, then the media engines."""
    values: list[float | None] = []
    for i in range(count):
        m = req.metrics[i]
        values.append(float(m.value) if m.nvmlReturn == 0 else None)
    for (_, _, metric, factor, attrs), v in zip(METRICS, values, strict=False):
        s.add(metric, None if v is None else v * factor, **attrs)
    media = [v for v in values[len(METRICS) :] if v is not None]
    s.add(MEDIA_ACTIVE, max(media) * 0.01 if media else None)
