"""The smi source's discipline: fixed-rate sampling, GPUs going and coming back, deadlines on every
backend call (a hung tool is killed), and what it publishes."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from aaco.agent.pipeline.bus import Bus
from aaco.agent.sources.base import Journal, SourceContext
from aaco.agent.sources.smi import SmiSource, SmiSourceConfig
from aaco.agent.sources.smi.backends import BackendOptions, open_backend
from aaco.agent.sources.smi.calls import BackendError, BackendTimeoutError, TimedCaller, run_tool
from aaco.agent.sources.smi.tracker import FixedRate, GpuTracker
from aaco.contract.stats import EVENTS_DROPPED, SOURCE_ERRORS, Stats
from aaco.contract.telemetry import GpuIdentity, GpuSample, Snapshot

from .smi_fakes import FakeGpu, fail_reads_of, fake_nvml


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_fixed_rate_does_not_drift_and_skips_overrun_slots():
    clock = FakeClock()
    rate = FixedRate(1.0, clock)
    clock.t += 0.3  # a sample that took 0.3 s
    assert rate.next_delay() == pytest.approx(0.7)
    clock.t = 101.0 + 0.05  # woke a little late: the next slot is still at t0 + 2
    assert rate.next_delay() == pytest.approx(0.95)
    clock.t = 102.0 + 2.5  # a sample overran two and a half intervals
    assert rate.next_delay() == pytest.approx(0.5)
    assert (rate.k, rate.missed) == (5, 2)  # slots 3 and 4 skipped, the next is slot 5 at t0 + 5
    clock.t = 105.0
    assert rate.next_delay() == pytest.approx(1.0)


def snap(*indices: str) -> Snapshot:
    s = Snapshot("test")
    for i in indices:
        g = GpuSample(GpuIdentity(i, uuid=f"u{i}", model="m"))
        g.add("hw.power", 100.0 + int(i))
        s.gpus.append(g)
    return s


def readings(samples: list[GpuSample]) -> dict[tuple[str, str, tuple], float]:
    return {(s.gpu.index, r.metric, r.attrs): r.value for s in samples for r in s.readings}


def test_gpu_that_vanishes_is_down_counted_and_comes_back():
    t = GpuTracker()
    out, ch = t.update(snap("0", "1"))
    r = readings(out)
    assert r[("1", "aaco.gpu.up", ())] == 1.0
    assert r[("1", "hw.errors", (("error.type", "lost"),))] == 0.0
    out, ch = t.update(snap("0"))
    r = readings(out)
    assert [g.index for g in ch.lost] == ["1"]
    assert r[("1", "aaco.gpu.up", ())] == 0.0
    assert r[("1", "hw.errors", (("error.type", "lost"),))] == 1.0
    assert ("1", "hw.power", ()) not in r
    out, ch = t.update(snap("0"))  # still gone: not counted twice
    assert readings(out)[("1", "hw.errors", (("error.type", "lost"),))] == 1.0 and ch.lost == []
    out, ch = t.update(snap("0", "1"))
    r = readings(out)
    assert [g.index for g in ch.back] == ["1"]
    assert r[("1", "aaco.gpu.up", ())] == 1.0 and r[("1", "hw.power", ())] == 101.0
    assert r[("1", "hw.errors", (("error.type", "lost"),))] == 1.0


def test_failed_backend_call_reports_every_known_gpu_down_and_max_gpus_bounds():
    t = GpuTracker(max_gpus=2)
    _, ch = t.update(snap("0", "1", "2"))
    assert ch.refused == 1 and sorted(t.known) == ["0", "1"]
    out, ch = t.update(None)
    assert {g.index for g in ch.lost} == {"0", "1"}
    assert all(v == 0.0 for (_, m, _), v in readings(out).items() if m == "aaco.gpu.up")


def test_timed_caller_abandons_a_hung_call_and_refuses_while_it_hangs():
    caller = TimedCaller("lib", max_stuck=1)
    release = threading.Event()
    assert caller.call(lambda: 42, 5.0) == 42
    with pytest.raises(BackendTimeoutError, match=r"no answer within 0\.2s"):
        caller.call(release.wait, 0.2)
    assert caller.stuck == 1
    with pytest.raises(BackendTimeoutError, match="still hung"):
        caller.call(lambda: 1, 5.0)
    release.set()
    for _ in range(100):  # the abandoned thread returns and is no longer counted
        if caller.stuck == 0:
            break
        threading.Event().wait(0.05)
    assert caller.call(lambda: 7, 5.0) == 7
    with pytest.raises(ZeroDivisionError):
        caller.call(lambda: 1 / 0, 5.0)


def test_timed_caller_keeps_its_worker_thread_and_lets_it_go():
    caller = TimedCaller("idling", max_stuck=1, idle_s=0.2)
    threads = {caller.call(threading.current_thread, 5.0) for _ in range(5)}
    assert len(threads) == 1  # one worker for call after call
    release = threading.Event()
    with pytest.raises(BackendTimeoutError):
        caller.call(release.wait, 0.1)
    release.set()
    for _ in range(100):
        if caller.stuck == 0:
            break
        threading.Event().wait(0.05)
    assert caller.call(threading.current_thread, 5.0) not in threads  # the abandoned worker was replaced
    names = lambda: [t for t in threading.enumerate() if t.name == "aaco-idling-call"]  # noqa: E731
    for _ in range(100):  # idle past idle_s: the worker ends (the abandoned one ended with its call)
        if not names():
            break
        threading.Event().wait(0.05)
    assert names() == []
    assert caller.call(lambda: 3, 5.0) == 3  # and a new one starts for the next call
    caller.close()
    for _ in range(100):
        if not names():
            break
        threading.Event().wait(0.05)
    assert names() == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(")")[-1].split()[0] != "Z"


def test_hung_tool_is_killed_with_its_children(tmp_path: Path):
    pids = tmp_path / "pids"
    tool = tmp_path / "hung-smi"
    tool.write_text(f"#!/bin/sh\nsleep 300 &\necho $$ $! > {pids}\nwait\n")
    tool.chmod(0o755)
    with pytest.raises(BackendTimeoutError, match=r"no answer within 2s; killed"):
        run_tool([str(tool)], 2.0)
    for pid in map(int, pids.read_text().split()):
        for _ in range(100):
            if not _alive(pid):
                break
            threading.Event().wait(0.05)
        assert not _alive(pid), f"process {pid} survived the kill"


def test_failing_and_missing_tools(tmp_path: Path):
    tool = tmp_path / "bad-smi"
    tool.write_text("#!/bin/sh\necho 'amdgpu driver not loaded' >&2\nexit 3\n")
    tool.chmod(0o755)
    with pytest.raises(BackendError, match="exited with status 3: amdgpu driver not loaded"):
        run_tool([str(tool)], 5.0)
    with pytest.raises(BackendError, match="not found on PATH"):
        open_backend("rocm-smi", BackendOptions(rocm_smi=str(tmp_path / "nope")))


def test_tool_backends_parse_what_the_tools_print(samples: Path, tmp_path: Path):
    """A stand-in tool prints the real capture; the backend runs it and parses its output."""
    tool = tmp_path / "rocm-smi"
    tool.write_text(f"#!/bin/sh\ncat {samples / 'rocm-smi' / 'mi100_rocm602.json'}\n")
    tool.chmod(0o755)
    backend = open_backend("rocm-smi", BackendOptions(rocm_smi=str(tool)))
    assert "--json" in backend.argv
    assert len(backend.sample().gpus) == 4
    amd = tmp_path / "amd-smi"
    listing = '[{"gpu": 0, "bdf": "0000:c1:00.0", "uuid": "aa-bb"}]'
    asic = '[{"gpu": 0, "asic": {"market_name": "AMD Radeon PRO W7900"}}]'
    amd.write_text(
        "#!/bin/sh\n"
        f'case "$1" in metric) cat {samples / "amd-smi" / "amd-smi-metric.json"};; '
        f"list) echo '{listing}';; static) echo '{asic}';; esac\n"
    )
    amd.chmod(0o755)
    g = open_backend("amd-smi", BackendOptions(amd_smi=str(amd))).sample().gpus[0].gpu
    assert (g.uuid, g.pci_bus, g.model) == ("aa-bb", "0000:c1:00.0", "AMD Radeon PRO W7900")


def context(stats: Stats | None = None, **bus: int) -> SourceContext:
    stats = stats or Stats()
    return SourceContext("node-a", stats, Bus(stats, **bus), Journal(stats))


def test_source_publishes_live_telemetry_and_reports_bad_fields(samples: Path, tmp_path: Path):
    cap = tmp_path / "amd.json"
    cap.write_bytes((samples / "amd-smi" / "amd-smi-metric.json").read_bytes())
    cfg = SmiSourceConfig(backend="file", file=cap, kubelet_socket=None, samples=2, interval_s=0.01)
    src = SmiSource(cfg, "smi")
    ctx = context()
    src.run(ctx)
    items = [ctx.bus.get(0) for _ in range(2)]
    assert all(i is not None and i.kind == "telemetry" and i.source == "smi" for i in items)
    rows = items[0].batch.to_pylist()
    assert {r["node"] for r in rows} == {"node-a"}
    assert next(r for r in rows if r["metric"] == "hw.power")["value"] == 34.0
    assert next(r for r in rows if r["metric"] == "aaco.gpu.up")["value"] == 1.0
    # the capture is read again at every sample: a rewritten file shows its new values
    cap.write_text(cap.read_text().replace('"value": 34,', '"value": "watts",'))
    src2 = SmiSource(cfg.model_copy(update={"samples": 1}), "smi")
    src2.run(ctx)
    rows = ctx.bus.get(0).batch.to_pylist()
    assert not any(r["metric"] == "hw.power" for r in rows)
    problem = next(p for p in ctx.journal.problems if p.reason == "malformed")
    assert problem.subject == f"{cap}: field gpu[0].power.socket_power.value"
    assert problem.message == "not a number: 'watts'"


def test_source_marks_gpus_down_when_the_capture_breaks(samples: Path, tmp_path: Path):
    cap = tmp_path / "n.xml"
    cap.write_bytes((samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz").read_bytes())
    src = SmiSource(SmiSourceConfig(backend="file", file=cap, kubelet_socket=None), "smi")
    ctx = context()
    src.backend = open_backend("file", src.options)
    src.sample_once(ctx)
    cap.write_text("<nvidia_smi_log><gpu>")  # truncated mid-write
    src.sample_once(ctx)
    ctx.bus.get(0)
    rows = {r["metric"]: r["value"] for r in ctx.bus.get(0).batch.to_pylist()}
    assert rows == {"aaco.gpu.up": 0.0, "hw.errors": 1.0}
    assert ctx.stats.get(SOURCE_ERRORS, source="smi", reason="unreadable") == 1
    assert ctx.stats.get(SOURCE_ERRORS, source="smi", reason="gpu_lost") == 1


def test_live_telemetry_is_offered_and_dropped_when_the_bus_is_full(samples: Path):
    cfg = SmiSourceConfig(backend="file", file=samples / "rocm-smi" / "mi100_rocm602.json", kubelet_socket=None)
    src = SmiSource(cfg, "smi")
    ctx = context(max_batches=1)
    src.backend = open_backend("file", src.options)
    src.sample_once(ctx)
    n = src.sample_once(ctx)  # the bus holds one batch: this one is dropped, not waited for
    assert ctx.stats.get(EVENTS_DROPPED, component="source:smi", reason="queue_full") == n > 0


def test_config_validation():
    with pytest.raises(ValueError, match="backend file needs file"):
        SmiSourceConfig(backend="file")
    with pytest.raises(ValueError, match="file is only read by backend file"):
        SmiSourceConfig(backend="sysfs", file=Path("x"))


def test_source_with_no_backend_is_a_fatal_problem(tmp_path: Path):
    cfg = SmiSourceConfig(backend="sysfs", sysfs_root=tmp_path, kubelet_socket=None)
    ctx = context()
    SmiSource(cfg, "smi").run(ctx)
    (p,) = ctx.journal.problems
    assert p.fatal and p.reason == "missing" and "class/drm" in p.message


def test_nvml_backend_through_the_source_with_a_hung_library():
    gate = threading.Event()
    nvml = fake_nvml([FakeGpu()])
    real = nvml.nvmlDeviceGetCount
    nvml.nvmlDeviceGetCount = lambda: (gate.wait(), real())[1]
    gate.set()
    src = SmiSource(
        SmiSourceConfig(backend="nvml", kubelet_socket=None, timeout_s=1.0),
        "smi",
        BackendOptions(timeout_s=1.0, modules={"pynvml": nvml}),
    )
    ctx = context()
    src.backend = open_backend("nvml", src.options)
    assert src.sample_once(ctx) > 0
    gate.clear()  # the library hangs now
    src.sample_once(ctx)
    assert ctx.stats.get(SOURCE_ERRORS, source="smi", reason="timeout") == 1
    gate.set()


def test_auto_prefers_amd_then_nvidia(tmp_path: Path):
    nvml = fake_nvml([FakeGpu()])
    opts = BackendOptions(sysfs_root=tmp_path, amd_smi="no-amd-smi", rocm_smi="no-rocm-smi", modules={"pynvml": nvml})
    assert open_backend("auto", opts).name == "nvml"


def test_sysfs_gpu_that_falls_off_the_bus_and_comes_back(samples: Path, tmp_path: Path):
    from aaco.agent.sources.smi import ttar

    ttar.unpack(ttar.read((samples / "sysfs" / "amdgpu_card0.ttar").read_text()), tmp_path)
    root = tmp_path / "fixtures" / "sys"
    card, gone = root / "class" / "drm" / "card0", root / "class" / "drm" / "gone"
    src = SmiSource(SmiSourceConfig(backend="sysfs", sysfs_root=root, kubelet_socket=None), "smi")
    src.backend = open_backend("sysfs", src.options)
    ctx = context()

    def up() -> dict[str, float]:
        src.sample_once(ctx)
        rows = ctx.bus.get(0).batch.to_pylist()
        return {
            r["metric"] + "".join(v for k, v in r["attributes"] if k == "error.type"): r["value"]
            for r in rows
            if r["metric"] in ("aaco.gpu.up", "hw.errors", "hw.gpu.utilization")
        }

    assert up() == {"aaco.gpu.up": 1.0, "hw.errorslost": 0.0, "hw.gpu.utilization": 0.04}
    card.rename(gone)  # the GPU fell off the bus: its sysfs directory is gone
    assert up() == {"aaco.gpu.up": 0.0, "hw.errorslost": 1.0}
    gone.rename(card)
    assert up() == {"aaco.gpu.up": 1.0, "hw.errorslost": 1.0, "hw.gpu.utilization": 0.04}


def test_sysfs_device_errors_drop_the_gpu(samples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from aaco.agent.sources.smi import sysfs, sysfs_tree, ttar

    ttar.unpack(ttar.read((samples / "sysfs" / "amdgpu_card0.ttar").read_text()), tmp_path)
    tree = sysfs_tree.DirTree(tmp_path / "fixtures" / "sys")
    fail_reads_of("gpu_busy_percent", monkeypatch)
    snap = sysfs.read_sysfs(tree)
    assert snap.gpus == []
    assert [str(p) for p in snap.problems] == [
        f"{tree.name}: field class/drm/card0: device error: class/drm/card0/device/gpu_busy_percent: No such device"
    ]


def test_a_missing_capture_is_a_fatal_problem_naming_the_file(tmp_path: Path):
    cfg = SmiSourceConfig(backend="file", file=tmp_path / "nope.json", kubelet_socket=None)
    ctx = context()
    SmiSource(cfg, "smi").run(ctx)
    (p,) = ctx.journal.problems
    assert (p.fatal, p.subject, p.message) == (True, str(tmp_path / "nope.json"), "no such capture file")


def test_to_table_rows_carry_identity_reading_and_pod_attributes():
    from aaco.contract.schemas import SCHEMAS, conform
    from aaco.contract.telemetry import to_table

    a = GpuSample(GpuIdentity("0", uuid="u0", pci_bus="0000:09:00.0", model="MI300X", vendor="amd"))
    a.add("hw.power", 400.0)
    a.add("hw.temperature", 61.0, sensor="junction")
    b = GpuSample(GpuIdentity("1"))
    b.add("hw.errors", 2.0, error_type="corrected")
    pods = {"0": {"k8s.pod.name": "trainer-0", "hw.model": "MI300X OAM"}}
    batch = to_table([a, b], ts_ns=7, node="n1", source="smi", extra=pods)
    assert batch.schema == SCHEMAS["telemetry"]
    assert conform("telemetry", batch).equals(batch)
    ident = [("hw.model", "MI300X OAM"), ("hw.vendor", "amd"), ("pci.bus_id", "0000:09:00.0")]
    ident.append(("k8s.pod.name", "trainer-0"))
    assert batch.to_pylist() == [
        {"ts_ns": 7, "node": "n1", "device": "0", "metric": "hw.power", "value": 400.0, "unit": "W",
         "gpu_uuid": "u0", "attributes": ident, "source": "smi"},
        {"ts_ns": 7, "node": "n1", "device": "0", "metric": "hw.temperature", "value": 61.0, "unit": "Cel",
         "gpu_uuid": "u0", "attributes": [*ident, ("sensor", "junction")], "source": "smi"},
        {"ts_ns": 7, "node": "n1", "device": "1", "metric": "hw.errors", "value": 2.0, "unit": "{error}",
         "gpu_uuid": None, "attributes": [("error.type", "corrected")], "source": "smi"},
    ]  # fmt: skip
    assert to_table([], ts_ns=7, node="n1", source="smi").num_rows == 0
