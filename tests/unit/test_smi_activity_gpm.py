"""NVIDIA's activity counters through NVML GPM, on the NVML double with nvidia-ml-py's GPM API shapes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from aaco.agent.pipeline.bus import Bus
from aaco.agent.sources.base import Journal, SourceContext
from aaco.agent.sources.smi import SmiSource, SmiSourceConfig
from aaco.agent.sources.smi.backends import BackendOptions, open_backend
from aaco.agent.sources.smi.counters_guard import ACTIVITY_METRICS, CountersGuard
from aaco.agent.sources.smi.nvml import NvmlReader
from aaco.analyzers.telemetry import TelemetryAnalyzer
from aaco.contract.schemas import EventBatch
from aaco.contract.stats import Stats
from aaco.contract.telemetry import COUNTERS_PAUSED, MIB, Snapshot

from .smi_fakes import FakeGpu, fake_nvml
from .smi_fakes_activity import FakeGpm, end, proc_tree, with_gpm

# what GPM answers over a pair (NVML's units: percent, MiB/s)
H100 = {
    1: 87.5,  # GRAPHICS_UTIL
    2: 80.0,  # SM_UTIL
    3: 25.0,  # SM_OCCUPANCY
    5: 60.0,  # ANY_TENSOR_UTIL
    10: 45.0,  # DRAM_BW_UTIL
    20: 1000.0,  # PCIE_TX_PER_SEC
    21: 2000.0,  # PCIE_RX_PER_SEC
    60: 300.0,  # NVLINK_TOTAL_RX_PER_SEC
    61: 400.0,  # NVLINK_TOTAL_TX_PER_SEC
    30: 10.0,  # NVDEC_0_UTIL
    31: 30.0,  # NVDEC_1_UTIL
    166: 20.0,  # NVENC_0_UTIL
}
WATCHED = ACTIVITY_METRICS | {COUNTERS_PAUSED}
GPM_CALLS = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmMetricsGet")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def activity(snap: Snapshot, gpu: int = 0) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GPU ``gpu``'s activity and paused readings: (metric, attributes) -> value."""
    return {(r.metric, r.attrs): r.value for r in snap.gpus[gpu].readings if r.metric in WATCHED}


def paused(snap: Snapshot, gpu: int = 0) -> dict[str, float]:
    return {dict(a)["reason"]: v for (m, a), v in activity(snap, gpu).items() if m == "aaco.gpu.counters.paused"}


def gpm_calls(nvml: object) -> dict[str, int]:
    calls = nvml.calls  # type: ignore[attr-defined]
    return {name: calls.count(name) for name in GPM_CALLS}


def reader(gpus: list[FakeGpu], gpm: list[FakeGpm], tmp_path: Path, **guard: object) -> tuple[object, NvmlReader]:
    nvml = with_gpm(fake_nvml(gpus), gpm)
    proc = proc_tree(tmp_path / "proc", {1: ("systemd", ["/sbin/init"])})
    return nvml, NvmlReader(nvml, CountersGuard(guard.pop("profilers", ["ncu"]), proc_root=proc, **guard))  # type: ignore[arg-type]


def test_two_samples_give_ratios_and_bytes_per_second_the_first_only_primes(tmp_path: Path):
    nvml, r = reader([FakeGpu()], [FakeGpm(values=H100)], tmp_path)
    first = r.sample()
    assert activity(first) == {
        ("aaco.gpu.counters.paused", (("reason", why),)): 0.0 for why in ("another_profiler", "busy", "off")
    }
    assert gpm_calls(nvml) == {
        "nvmlGpmQueryDeviceSupport": 1,
        "nvmlGpmSampleAlloc": 2,
        "nvmlGpmSampleGet": 1,
        "nvmlGpmMetricsGet": 0,
    }
    second = r.sample()
    got = activity(second)
    assert got[("aaco.gpu.graphics.active", ())] == pytest.approx(0.875)
    assert got[("aaco.gpu.sm.active", ())] == pytest.approx(0.80)
    assert got[("aaco.gpu.sm.occupancy", ())] == pytest.approx(0.25)
    assert got[("aaco.gpu.tensor.active", ())] == pytest.approx(0.60)
    assert got[("aaco.gpu.dram.active", ())] == pytest.approx(0.45)
    assert got[("aaco.gpu.pcie.throughput", (("direction", "transmit"),))] == 1000 * 1048576
    assert got[("aaco.gpu.pcie.throughput", (("direction", "receive"),))] == 2000 * MIB
    assert got[("aaco.gpu.nvlink.throughput", (("direction", "transmit"),))] == 400 * MIB
    assert got[("aaco.gpu.nvlink.throughput", (("direction", "receive"),))] == 300 * MIB
    assert got[("aaco.gpu.media.active", ())] == pytest.approx(0.30)  # the busiest of NVDEC 0, 1 and NVENC 0
    assert paused(second) == {"another_profiler": 0.0, "busy": 0.0, "off": 0.0}
    # two NVML calls per sample from the second on; support asked and buffers allocated once
    r.sample()
    assert gpm_calls(nvml) == {
        "nvmlGpmQueryDeviceSupport": 1,
        "nvmlGpmSampleAlloc": 2,
        "nvmlGpmSampleGet": 3,
        "nvmlGpmMetricsGet": 2,
    }
    assert nvml.gpm_pairs == [(2, 1), (1, 2)]  # type: ignore[attr-defined]  # previous and current, swapped each sample
    r.close()
    assert sorted(nvml.gpm_freed) == [1, 2]  # type: ignore[attr-defined]
    assert nvml.state == {"init": 1, "shutdown": 1}  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["isSupportedDevice 0", "NOT_SUPPORTED"])
def test_a_gpu_without_gpm_gives_nothing_and_is_asked_once(tmp_path: Path, how: str):
    gpm = (
        FakeGpm(supported=False) if how == "isSupportedDevice 0" else FakeGpm(errors={"nvmlGpmQueryDeviceSupport": [3]})
    )
    nvml, r = reader([FakeGpu(), FakeGpu(uuid="GPU-b")], [gpm, FakeGpm(values=H100)], tmp_path)
    for _ in range(3):
        snap = r.sample()
        assert activity(snap, 0) == {}  # not even counters.paused
        assert snap.problems == []
    assert activity(snap, 1)[("aaco.gpu.sm.active", ())] == pytest.approx(0.8)  # the other GPU has them
    assert gpm_calls(nvml)["nvmlGpmQueryDeviceSupport"] == 2  # once per GPU
    assert gpm_calls(nvml)["nvmlGpmSampleAlloc"] == 2  # the supported GPU's two buffers only


def test_a_binding_without_gpm_and_a_reader_without_guard_make_no_gpm_call(tmp_path: Path):
    nvml = fake_nvml([FakeGpu()])
    r = NvmlReader(nvml, CountersGuard(["ncu"], proc_root=proc_tree(tmp_path / "proc", {})))
    assert activity(r.sample()) == {} and activity(r.sample()) == {}
    plain = with_gpm(fake_nvml([FakeGpu()]), [FakeGpm(values=H100)])
    r = NvmlReader(plain)  # activity off
    r.sample(), r.sample()
    assert gpm_calls(plain) == dict.fromkeys(GPM_CALLS, 0)


def test_a_metric_the_gpu_lacks_is_left_out(tmp_path: Path):
    pcie_card = {k: v for k, v in H100.items() if k not in (60, 61, 166)}  # no NVLink, a driver without NVENC metrics
    _, r = reader([FakeGpu()], [FakeGpm(values=pcie_card)], tmp_path)
    r.sample()
    got = activity(r.sample())
    assert not any(m == "aaco.gpu.nvlink.throughput" for m, _ in got)
    assert got[("aaco.gpu.media.active", ())] == pytest.approx(0.30)


def test_busy_pauses_that_sample_and_the_next_primes_again(tmp_path: Path):
    gpm = FakeGpm(values=H100, errors={"nvmlGpmMetricsGet": [19]})  # NVML_ERROR_IN_USE
    _, r = reader([FakeGpu()], [gpm], tmp_path)
    r.sample()
    busy = r.sample()
    assert paused(busy) == {"another_profiler": 0.0, "busy": 1.0, "off": 0.0}
    assert not any(m in ACTIVITY_METRICS for m, _ in activity(busy))
    assert busy.problems == []  # not a problem: the counters were in use
    again = r.sample()  # primes: the failed pair is not used
    assert paused(again)["busy"] == 0.0 and ("aaco.gpu.sm.active", ()) not in activity(again)
    assert activity(r.sample())[("aaco.gpu.sm.active", ())] == pytest.approx(0.8)


def test_three_failures_turn_the_counters_off_for_good(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    gpm = FakeGpm(values=H100, errors={"nvmlGpmSampleGet": [999, 999, 999]})  # NVML_ERROR_UNKNOWN
    nvml, r = reader([FakeGpu()], [gpm], tmp_path, max_failures=3)
    with caplog.at_level(logging.INFO, logger="aaco.sources.smi"):
        snaps = [r.sample() for _ in range(6)]
    assert [paused(s)["off"] for s in snaps] == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert [len(s.problems) for s in snaps] == [1, 1, 1, 0, 0, 0]
    assert "GPM sample" in snaps[0].problems[0].message
    assert gpm_calls(nvml)["nvmlGpmSampleGet"] == 3  # not called once off
    assert all(not any(m in ACTIVITY_METRICS for m, _ in activity(s)) for s in snaps)
    off = [m for m in caplog.messages if "turned off" in m]
    assert len(off) == 1 and "GPU-11111111" in off[0]
    assert snaps[-1].gpus[0].has("hw.gpu.utilization")  # the rest of the GPU's readings go on


def test_failures_between_successes_do_not_add_up(tmp_path: Path):
    gpm = FakeGpm(values=H100, errors={"nvmlGpmSampleGet": [999, 999]})
    _, r = reader([FakeGpu()], [gpm], tmp_path)
    snaps = [r.sample() for _ in range(2)]
    snaps += [r.sample()]  # succeeds
    gpm.errors["nvmlGpmSampleGet"] = [999, 999]
    snaps += [r.sample() for _ in range(2)]
    assert [paused(s)["off"] for s in snaps] == [0.0] * 5


def test_another_profiler_pauses_every_gpu_and_resumes_when_it_ends(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    nvml = with_gpm(fake_nvml([FakeGpu(), FakeGpu(uuid="GPU-b")]), [FakeGpm(values=H100), FakeGpm(values=H100)])
    proc = proc_tree(
        tmp_path / "proc", {1: ("systemd", ["/sbin/init"]), 4242: ("ncu", ["ncu", "--set", "full", "./app"])}
    )
    clock = Clock()
    r = NvmlReader(nvml, CountersGuard(["ncu"], proc_root=proc, scan_every_s=5.0, clock=clock))
    with caplog.at_level(logging.INFO, logger="aaco.sources.smi"):
        during = []
        for _ in range(3):
            during.append(r.sample())
            clock.t += 1.0
        assert all(paused(s, g) == {"another_profiler": 1.0, "busy": 0.0, "off": 0.0} for s in during for g in (0, 1))
        assert gpm_calls(nvml)["nvmlGpmSampleGet"] == 0  # the counters are not touched
        end(proc, 4242)
        r.sample()  # within 5 s of the last look: still paused
        clock.t += 5.0
        back = r.sample()  # looks again: resumed, primes
        assert paused(back, 0)["another_profiler"] == 0.0 and ("aaco.gpu.sm.active", ()) not in activity(back)
        assert activity(r.sample(), 1)[("aaco.gpu.sm.active", ())] == pytest.approx(0.8)
    logged = [m for m in caplog.messages if "activity counters" in m]
    assert logged == [
        "activity counters paused: another profiler runs (ncu, pid 4242)",
        "activity counters resumed: ncu (pid 4242) is gone",
    ]


def test_a_pause_between_samples_makes_the_next_one_prime(tmp_path: Path):
    proc = proc_tree(tmp_path / "proc", {})
    nvml = with_gpm(fake_nvml([FakeGpu()]), [FakeGpm(values=H100)])
    clock = Clock()
    r = NvmlReader(nvml, CountersGuard(["nsys"], proc_root=proc, scan_every_s=0.0, clock=clock))
    r.sample()
    proc_tree(proc, {77: ("nsys", ["nsys", "profile", "python", "train.py"])})
    r.sample()
    end(proc, 77)
    r.sample()  # primes again: no pair spans the pause
    r.sample()
    assert nvml.gpm_pairs == [(1, 2)]  # type: ignore[attr-defined]


def test_a_driver_without_the_nvenc_metrics_is_asked_without_them(tmp_path: Path):
    _, r = reader([FakeGpu()], [FakeGpm(values=H100, rejects_newer_ids=True)], tmp_path)
    r.sample()
    assert activity(r.sample()).get(("aaco.gpu.sm.active", ())) is None  # INVALID_ARGUMENT: asked again without
    r.sample()
    got = activity(r.sample())
    assert got[("aaco.gpu.sm.active", ())] == pytest.approx(0.8)
    assert got[("aaco.gpu.media.active", ())] == pytest.approx(0.30)  # NVDEC 1 still counts


def test_a_gpu_lost_in_gpm_is_dropped_from_the_sample(tmp_path: Path):
    _, r = reader([FakeGpu(), FakeGpu(uuid="GPU-b")], [FakeGpm(errors={"nvmlGpmSampleGet": [15]}), FakeGpm()], tmp_path)
    snap = r.sample()
    assert [g.gpu.uuid for g in snap.gpus] == ["GPU-b"]
    assert "GPU is lost" in snap.problems[0].message


def test_the_nvml_backend_reads_gpm_with_activity_on(tmp_path: Path):
    nvml = with_gpm(fake_nvml([FakeGpu()]), [FakeGpm(values=H100)])
    opts = BackendOptions(modules={"pynvml": nvml}, activity=True, proc_root=proc_tree(tmp_path / "proc", {}))
    backend = open_backend("nvml", opts)
    backend.sample()
    assert activity(backend.sample())[("aaco.gpu.tensor.active", ())] == pytest.approx(0.6)
    backend.close()
    assert sorted(nvml.gpm_freed) == [1, 2]  # type: ignore[attr-defined]
    off = open_backend("nvml", BackendOptions(modules={"pynvml": with_gpm(fake_nvml([FakeGpu()]), [FakeGpm()])}))
    assert activity(off.sample()) == {}  # activity off by default here (one-shot commands)


def test_the_gpm_double_has_nvidia_ml_py_shapes():
    import pynvml

    nvml = with_gpm(fake_nvml([FakeGpu()]), [FakeGpm()])
    for name in [n for n in vars(nvml) if n.startswith(("NVML_GPM", "nvmlGpm"))]:
        assert hasattr(pynvml, name), name
        if name.startswith("NVML_"):
            assert getattr(nvml, name) == getattr(pynvml, name), name
    assert pynvml.NVML_ERROR_IN_USE == 19

    def layout(cls: type) -> list[tuple[str, str]]:
        return [(n, getattr(t, "_length_", t.__name__)) for n, t, *_ in cls._fields_]

    for name in ("c_nvmlGpmMetricsGet_t", "c_nvmlGpmMetric_t", "c_nvmlGpmSupport_t", "c_metricInfo_t"):
        fake, real = layout(getattr(nvml, name)), layout(getattr(pynvml, name))
        assert [n for n, _ in fake] == [n for n, _ in real], name
    assert dict(layout(pynvml.c_nvmlGpmMetricsGet_t))["metrics"] == 477


def test_the_smi_source_publishes_gpm_readings_the_telemetry_analyzer_renders(tmp_path: Path):
    nvml = with_gpm(fake_nvml([FakeGpu()]), [FakeGpm(values=H100)])
    cfg = SmiSourceConfig(backend="nvml", kubelet_socket=None)
    opts = cfg.backend_options()
    opts.modules, opts.proc_root = {"pynvml": nvml}, proc_tree(tmp_path / "proc", {})
    src = SmiSource(cfg, "smi", opts)
    stats = Stats()
    ctx = SourceContext("n1", stats, Bus(stats), Journal(stats))
    src.backend = open_backend("nvml", src.options)
    src.sample_once(ctx), src.sample_once(ctx)
    analyzer = TelemetryAnalyzer()
    for _ in range(2):
        analyzer.update(EventBatch("telemetry", ctx.bus.get(0).batch, "smi"))
    src.backend.close()
    got = {
        (p.metric.prom_name, p.labels.get("direction", p.labels.get("reason"))): p.value
        for p in analyzer.snapshot().points()
    }
    assert got[("aaco_gpu_sm_active_ratio", None)] == pytest.approx(0.8)
    assert got[("aaco_gpu_pcie_throughput_bytes_per_second", "receive")] == 2000 * MIB
    assert got[("aaco_gpu_counters_paused", "another_profiler")] == 0.0
