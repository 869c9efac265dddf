"""Activity counter doubles (not a test module): NVML GPM on ``fake_nvml``, amdsmi's activity, a /proc tree.

``with_gpm(mod, gpm)`` adds nvidia-ml-py's GPM API to a ``fake_nvml``: the ctypes structures with
pynvml's fields (``c_nvmlGpmMetricsGet_t``: version, numMetrics, sample1, sample2, metrics[477] of
metricId, nvmlReturn, value, metricInfo; ``c_nvmlGpmSupport_t``), the metric ids, and
``nvmlGpmQueryDeviceSupport``, ``nvmlGpmSampleAlloc``, ``nvmlGpmSampleFree``, ``nvmlGpmSampleGet``,
``nvmlGpmMetricsGet``. A sample buffer remembers which GPU filled it and when; ``nvmlGpmMetricsGet``
insists on two buffers of one GPU, the older first, and answers ``gpm[i].values`` (metric id ->
value, in NVML's units) with ``nvmlReturn`` 3 (NOT_SUPPORTED) for the ids the GPU lacks.
``FakeGpm.errors`` queues NVML error codes per call name. ``fake_amdsmi_activity`` gives
``fake_amdsmi`` an activity and GPU metrics per GPU; ``proc_tree`` writes ``<pid>/comm`` and
``<pid>/cmdline`` files as Linux's /proc has them.
"""

from __future__ import annotations

import ctypes
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .smi_fakes import AmdSmiLibraryException, FakeAmdGpu, NVMLError, fake_amdsmi

NVML_GPM_METRIC_MAX = 477
GPM_IDS = {
    "NVML_GPM_METRIC_GRAPHICS_UTIL": 1,
    "NVML_GPM_METRIC_SM_UTIL": 2,
    "NVML_GPM_METRIC_SM_OCCUPANCY": 3,
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5,
    "NVML_GPM_METRIC_DRAM_BW_UTIL": 10,
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC": 20,
    "NVML_GPM_METRIC_PCIE_RX_PER_SEC": 21,
    **{f"NVML_GPM_METRIC_NVDEC_{i}_UTIL": 30 + i for i in range(8)},
    "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": 60,
    "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": 61,
    **{f"NVML_GPM_METRIC_NVENC_{i}_UTIL": 166 + i for i in range(4)},
}


class struct_c_nvmlGpmSample_t(ctypes.Structure):  # noqa: N801 - pynvml's names
    _fields_ = [("buffer", ctypes.c_uint)]  # opaque in NVML; the double numbers its buffers


c_nvmlGpmSample_t = ctypes.POINTER(struct_c_nvmlGpmSample_t)  # noqa: N816 - pynvml's name


class c_metricInfo_t(ctypes.Structure):  # noqa: N801
    _fields_ = [("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p), ("unit", ctypes.c_char_p)]


class c_nvmlGpmMetric_t(ctypes.Structure):  # noqa: N801
    _fields_ = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_double),
        ("metricInfo", c_metricInfo_t),
    ]


class c_nvmlGpmMetricsGet_t(ctypes.Structure):  # noqa: N801
    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", c_nvmlGpmSample_t),
        ("sample2", c_nvmlGpmSample_t),
        ("metrics", c_nvmlGpmMetric_t * NVML_GPM_METRIC_MAX),
    ]


class c_nvmlGpmSupport_t(ctypes.Structure):  # noqa: N801
    _fields_ = [("version", ctypes.c_uint), ("isSupportedDevice", ctypes.c_uint)]


@dataclass
class FakeGpm:
    """One GPU's GPM: supported or not, the metrics over any pair of samples, errors to raise."""

    supported: bool = True
    values: dict[int, float] = field(default_factory=dict)  # metric id -> value (%, MiB/s)
    errors: dict[str, list[int]] = field(default_factory=dict)  # call name -> NVML error codes, one per call
    rejects_newer_ids: bool = False  # a driver older than the NVENC metrics: INVALID_ARGUMENT when asked


def with_gpm(mod: types.ModuleType, gpm: list[FakeGpm]) -> types.ModuleType:
    """``mod`` (a ``fake_nvml``) with NVML's GPM API, GPU i answering from ``gpm[i]``."""
    for name, value in GPM_IDS.items():
        setattr(mod, name, value)
    mod.NVML_GPM_METRIC_MAX = NVML_GPM_METRIC_MAX
    mod.NVML_GPM_METRICS_GET_VERSION = 1
    mod.NVML_GPM_SUPPORT_VERSION = 1
    mod.NVML_ERROR_IN_USE = 19
    mod.struct_c_nvmlGpmSample_t = struct_c_nvmlGpmSample_t
    mod.c_nvmlGpmSample_t = c_nvmlGpmSample_t
    mod.c_metricInfo_t = c_metricInfo_t
    mod.c_nvmlGpmMetric_t = c_nvmlGpmMetric_t
    mod.c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t
    mod.c_nvmlGpmSupport_t = c_nvmlGpmSupport_t
    by_handle = {id(mod.nvmlDeviceGetHandleByIndex(i)): g for i, g in enumerate(gpm)}
    buffers: dict[int, Any] = {}  # buffer number -> its struct, kept alive
    filled: dict[int, tuple[int, int]] = {}  # buffer number -> (GPU, when)
    mod.gpm_freed = []
    mod.gpm_pairs = []  # (older, newer) buffer numbers of every nvmlGpmMetricsGet
    clock = Counter[str]()

    def call(name: str, handle: object | None = None) -> FakeGpm | None:
        mod.calls.append(name)
        g = by_handle[id(handle)] if handle is not None else None
        if g is not None and g.errors.get(name):
            raise NVMLError(g.errors[name].pop(0))
        return g

    def nvmlGpmQueryDeviceSupport(device: object) -> c_nvmlGpmSupport_t:
        g = call("nvmlGpmQueryDeviceSupport", device)
        assert g is not None
        return c_nvmlGpmSupport_t(version=1, isSupportedDevice=int(g.supported))

    def nvmlGpmSampleAlloc() -> Any:
        call("nvmlGpmSampleAlloc")
        number = len(buffers) + 1
        buffers[number] = struct_c_nvmlGpmSample_t(buffer=number)
        return ctypes.pointer(buffers[number])

    def nvmlGpmSampleFree(sample: Any) -> None:
        call("nvmlGpmSampleFree")
        mod.gpm_freed.append(sample.contents.buffer)

    def nvmlGpmSampleGet(device: object, sample: Any) -> Any:
        g = call("nvmlGpmSampleGet", device)
        assert g is not None and g.supported, "sampled a GPU without GPM"
        clock["t"] += 1
        filled[sample.contents.buffer] = (id(device), clock["t"])
        return sample

    def nvmlGpmMetricsGet(req: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        mod.calls.append("nvmlGpmMetricsGet")
        assert req.version == 1 and 0 < req.numMetrics <= NVML_GPM_METRIC_MAX
        older, newer = req.sample1.contents.buffer, req.sample2.contents.buffer
        (gpu1, t1), (gpu2, t2) = filled[older], filled[newer]
        assert gpu1 == gpu2 and t1 < t2, "a pair of one GPU's samples, the older first"
        g = by_handle[gpu1]
        if g.errors.get("nvmlGpmMetricsGet"):
            raise NVMLError(g.errors["nvmlGpmMetricsGet"].pop(0))
        ids = [req.metrics[i].metricId for i in range(req.numMetrics)]
        if g.rejects_newer_ids and any(i >= 166 for i in ids):
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        mod.gpm_pairs.append((older, newer))
        for i, metric_id in enumerate(ids):
            m = req.metrics[i]
            m.nvmlReturn, m.value = (0, g.values[metric_id]) if metric_id in g.values else (3, 0.0)
        return req

    for fn in (
        nvmlGpmQueryDeviceSupport,
        nvmlGpmSampleAlloc,
        nvmlGpmSampleFree,
        nvmlGpmSampleGet,
        nvmlGpmMetricsGet,
    ):
        setattr(mod, fn.__name__, fn)
    return mod


@dataclass
class FakeAmdActivity:
    """One GPU's activity answers: the media engines, errors of ``amdsmi_get_gpu_activity`` one per call."""

    mm_activity: int | str = "N/A"
    vcn_activity: list[int | str] = field(default_factory=lambda: [19, "N/A", "N/A", "N/A"])
    vcn_busy: list[list[int | str]] = field(default_factory=lambda: [["N/A"] * 4] * 8)  # per XCP, per VCN
    errors: list[int] = field(default_factory=list)  # amdsmi_status_t codes


def fake_amdsmi_activity(gpus: list[FakeAmdGpu], activity: list[FakeAmdActivity]) -> types.ModuleType:
    """``fake_amdsmi(gpus)`` whose activity and GPU metrics answer ``activity[i]`` for GPU ``i``."""
    mod = fake_amdsmi(gpus)
    mod.calls = Counter()

    def of(name: str, h: FakeAmdGpu) -> FakeAmdActivity:
        mod.calls[name] += 1
        if h.gone:
            raise AmdSmiLibraryException(31)  # AMDSMI_STATUS_NOT_FOUND
        return activity[next(i for i, g in enumerate(gpus) if g is h)]

    def amdsmi_get_gpu_activity(h: FakeAmdGpu) -> dict[str, Any]:
        a = of("amdsmi_get_gpu_activity", h)
        if a.errors:
            raise AmdSmiLibraryException(a.errors.pop(0))
        return {"gfx_activity": h.gfx_activity, "umc_activity": h.umc_activity, "mm_activity": a.mm_activity}

    def amdsmi_get_gpu_metrics_info(h: FakeAmdGpu) -> dict[str, Any]:
        a = of("amdsmi_get_gpu_metrics_info", h)
        return {
            "common_header.format_revision": 1,
            "indep_throttle_status": h.indep_throttle_status,
            "average_mm_activity": a.mm_activity,
            "vcn_activity": list(a.vcn_activity),
            "xcp_stats.vcn_busy": [list(x) for x in a.vcn_busy],
        }

    mod.amdsmi_get_gpu_activity = amdsmi_get_gpu_activity
    mod.amdsmi_get_gpu_metrics_info = amdsmi_get_gpu_metrics_info
    return mod


def proc_tree(root: Path, processes: dict[int, tuple[str, list[str]]]) -> Path:
    """``root`` as /proc with ``processes`` (pid -> comm, argv); comm cut to 15 bytes as the kernel does."""
    root.mkdir(parents=True, exist_ok=True)
    for pid, (comm, argv) in processes.items():
        d = root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "comm").write_text(comm[:15] + "\n")
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (root / "self").mkdir(exist_ok=True)  # not a pid: skipped
    return root


def end(root: Path, pid: int) -> None:
    """Process ``pid`` exits."""
    for f in (root / str(pid)).iterdir():
        f.unlink()
    (root / str(pid)).rmdir()
