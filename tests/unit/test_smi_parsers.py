"""The telemetry parsers against the real captures in examples/data: exact acceptance values, units,
throttle reasons, and bad input reported with the file and field at fault."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from aaco.agent.sources.smi import gpu_metrics, ttar
from aaco.agent.sources.smi.amd_smi import parse_amd_smi
from aaco.agent.sources.smi.capture import read_capture, sniff
from aaco.agent.sources.smi.nvidia_smi import parse_nvidia_smi
from aaco.agent.sources.smi.rocm_smi import parse_rocm_smi
from aaco.agent.sources.smi.sysfs import SysfsReader, read_sysfs
from aaco.agent.sources.smi.sysfs_tree import DirTree
from aaco.agent.sources.smi.values import TelemetryFormatError, number, scale
from aaco.contract.telemetry import GpuSample, Snapshot, normalize_pci, to_table
from tests.conftest import sample_bytes

from .smi_fakes import fail_reads_of


def value(snap: Snapshot, gpu: str, metric: str, **attrs: str) -> float:
    """The one reading of ``metric`` with ``attrs`` on GPU ``gpu`` (fails if absent or repeated)."""
    named = {("error.type" if k == "error_type" else k): v for k, v in attrs.items()}
    hits = [
        r.value
        for s in snap.gpus
        if s.gpu.index == gpu
        for r in s.readings
        if r.metric == metric and dict(r.attrs) == named
    ]
    assert len(hits) == 1, f"{metric}{attrs} on gpu {gpu}: {hits}"
    return hits[0]


def gpu(snap: Snapshot, index: str) -> GpuSample:
    return next(s for s in snap.gpus if s.gpu.index == index)


# -- rocm-smi ------------------------------------------------------------------------------------


def test_rocm_smi_acceptance_values(samples: Path):
    path = samples / "rocm-smi" / "mi100_rocm602.json"
    snap = parse_rocm_smi(json.loads(path.read_text()), str(path))
    assert len(snap.gpus) == 4
    assert [s.gpu.index for s in snap.gpus] == ["0", "1", "2", "3"]
    assert value(snap, "0", "hw.temperature", sensor="junction") == 55.0
    assert value(snap, "0", "hw.power") == 36.0
    assert value(snap, "0", "aaco.gpu.power.limit") == 290.0  # Max Graphics Package Power (W): the cap
    assert value(snap, "0", "hw.gpu.memory.usage") == 6750208
    assert value(snap, "0", "hw.gpu.memory.limit") == 34342961152
    assert value(snap, "0", "aaco.gpu.clock.frequency", clock="graphics") == 300e6
    assert value(snap, "0", "hw.temperature", sensor="edge") == 53.0
    assert value(snap, "0", "aaco.gpu.clock.frequency", clock="memory") == 1200e6
    assert value(snap, "1", "hw.temperature", sensor="junction") == 58.0
    assert value(snap, "1", "hw.power") == 44.0
    g = gpu(snap, "0").gpu
    assert (g.pci_bus, g.uuid, g.model, g.vendor) == (
        "0000:83:00.0",
        "0x79ccd55167a2124a",
        "Arcturus GL-XL [Instinct MI100]",
        "amd",
    )
    assert snap.problems == []  # stray numeric keys ("0": "16.0GT/s x16 *") are not problems


def test_rocm_smi_bad_value_names_file_and_field_and_keeps_the_rest(samples: Path):
    doc = json.loads((samples / "rocm-smi" / "mi100_rocm602.json").read_text())
    doc["card0"]["Temperature (Sensor junction) (C)"] = "hot"
    snap = parse_rocm_smi(doc, "caps/rocm.json")
    assert [str(p) for p in snap.problems] == [
        "caps/rocm.json: field card0.\"Temperature (Sensor junction) (C)\": not a number: 'hot'"
    ]
    assert value(snap, "0", "hw.power") == 36.0
    assert value(snap, "1", "hw.temperature", sensor="junction") == 58.0


def test_rocm_smi_newer_power_key_and_not_a_rocm_document():
    snap = parse_rocm_smi(
        {"card0": {"Current Socket Graphics Package Power (W)": "120.5", "Average Graphics Package Power (W)": "N/A"}},
        "x",
    )
    assert value(snap, "0", "hw.power") == 120.5
    with pytest.raises(TelemetryFormatError, match="x: not rocm-smi JSON"):
        parse_rocm_smi({"system": {}}, "x")


# -- amd-smi -------------------------------------------------------------------------------------


def test_amd_smi_acceptance_values(samples: Path):
    path = samples / "amd-smi" / "amd-smi-metric.json"
    snap = parse_amd_smi(json.loads(path.read_text()), str(path))
    assert len(snap.gpus) == 1
    assert value(snap, "0", "hw.temperature", sensor="junction") == 49.0  # amd-smi "hotspot"
    assert value(snap, "0", "hw.power") == 34.0
    assert value(snap, "0", "aaco.gpu.clock.frequency", clock="graphics") == 60e6
    assert value(snap, "0", "aaco.gpu.clock.max", clock="graphics") == 1760e6
    assert value(snap, "0", "hw.temperature", sensor="edge") == 43.0
    assert value(snap, "0", "hw.temperature", sensor="memory") == 56.0
    assert value(snap, "0", "hw.gpu.memory.usage") == 1758 * 2**20
    assert value(snap, "0", "hw.gpu.memory.limit") == 46064 * 2**20
    assert value(snap, "0", "hw.errors", error_type="uncorrected") == 0
    assert snap.problems == []


def test_amd_smi_throttle_status_throttled_reads_reason_other(samples: Path):
    snap = parse_amd_smi(json.loads((samples / "amd-smi" / "amd-smi-metric.json").read_text()), "x")
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="other") == 1.0


def test_amd_smi_violation_status_names_the_reason_and_gpu_data_wrapper(samples: Path):
    doc = json.loads((samples / "amd-smi" / "amd-smi-metric.json").read_text())
    doc[0]["throttle"]["ppt_violation_status"] = "ACTIVE"
    doc[0]["throttle"]["socket_thermal_violation_status"] = "NOT ACTIVE"
    snap = parse_amd_smi({"gpu_data": doc}, "x")
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="power") == 1.0
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="thermal") == 0.0
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="other") == 0.0
    unthrottled = copy.deepcopy(doc)
    unthrottled[0]["power"]["throttle_status"] = "UNTHROTTLED"
    snap = parse_amd_smi(unthrottled, "x")
    for reason in ("power", "thermal", "current", "other"):
        assert value(snap, "0", "aaco.gpu.throttle.active", reason=reason) == 0.0


def test_amd_smi_malformed_fields_are_named(samples: Path):
    doc = json.loads((samples / "amd-smi" / "amd-smi-metric.json").read_text())
    doc[0]["power"]["socket_power"] = {"value": "lots", "unit": "W"}
    doc[0]["temperature"]["edge"] = {"value": 43, "unit": "V"}
    doc[0]["clock"] = "broken"
    snap = parse_amd_smi(doc, "cap.json")
    assert sorted(str(p) for p in snap.problems) == [
        "cap.json: field gpu[0].clock: expected a section, got str",
        "cap.json: field gpu[0].power.socket_power.value: not a number: 'lots'",
        "cap.json: field gpu[0].temperature.edge: unexpected unit 'V' (expected one of c)",
    ]
    assert value(snap, "0", "hw.temperature", sensor="junction") == 49.0
    with pytest.raises(TelemetryFormatError, match="not amd-smi JSON"):
        parse_amd_smi({"gpus": []}, "cap.json")


# -- nvidia-smi ----------------------------------------------------------------------------------


def test_nvidia_smi_acceptance_values(samples: Path):
    path = samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz"
    snap = parse_nvidia_smi(sample_bytes(path), str(path))
    assert len(snap.gpus) == 5  # the GPU and its four MIG devices (tests/unit/test_smi_mig.py)
    assert value(snap, "0", "hw.temperature", sensor="edge") == 27.0
    assert value(snap, "0", "hw.power") == 67.03
    assert value(snap, "0", "aaco.gpu.power.limit") == 500.0  # current_power_limit
    assert value(snap, "0", "hw.gpu.memory.usage") == 50 * 2**20
    assert value(snap, "0", "aaco.gpu.clock.frequency", clock="sm") == 1275e6
    assert value(snap, "0", "aaco.gpu.clock.max", clock="sm") == 1410e6
    assert value(snap, "0", "hw.temperature", sensor="memory") == 44.0
    assert value(snap, "0", "hw.gpu.memory.limit") == 81920 * 2**20
    for reason in ("power", "thermal", "other"):
        assert value(snap, "0", "aaco.gpu.throttle.active", reason=reason) == 0.0
    g = snap.gpus[0].gpu
    assert (g.uuid, g.pci_bus, g.model) == (
        "GPU-513536b6-7d19-9063-b049-1e69664bb298",
        "0000:01:00.0",
        "NVIDIA A100-SXM4-80GB",
    )
    assert not any(r.metric == "hw.gpu.utilization" for r in snap.gpus[0].readings)  # N/A under MIG


def test_nvidia_smi_h100_driver_580(samples: Path):
    """A capture of our own on an H100 (nvsmi_device_v13.dtd, driver 580): Hopper's thermal-limit fields,
    a memory power section and 'Requested functionality has been deprecated' are read past, not misread."""
    path = samples / "nvidia-smi" / "h100-sxm5-v13.xml.gz"
    snap = parse_nvidia_smi(sample_bytes(path), str(path))
    assert snap.problems == [] and len(snap.gpus) == 1
    assert value(snap, "0", "hw.power") == 79.73  # instant_power_draw, not the average (80.06) nor memory's
    assert value(snap, "0", "aaco.gpu.power.limit") == 700.0
    assert value(snap, "0", "hw.temperature", sensor="edge") == 36.0  # gpu_temp, not gpu_temp_tlimit (51)
    assert value(snap, "0", "hw.temperature", sensor="memory") == 39.0
    assert value(snap, "0", "hw.gpu.memory.limit") == 81559 * 2**20
    assert value(snap, "0", "hw.gpu.memory.usage") == 0.0
    assert value(snap, "0", "aaco.gpu.clock.frequency", clock="sm") == 345e6
    assert value(snap, "0", "aaco.gpu.clock.max", clock="sm") == 1980e6
    assert value(snap, "0", "aaco.gpu.clock.frequency", clock="memory") == 2619e6
    assert value(snap, "0", "hw.errors", **{"error.type": "uncorrected"}) == 1.0
    g = snap.gpus[0].gpu
    assert (g.uuid, g.pci_bus, g.model) == (
        "GPU-dab60736-6049-d541-3661-0407a2d7284c",
        "0000:00:06.0",
        "NVIDIA H100 80GB HBM3",
    )


def test_nvidia_smi_active_clock_event_reasons(samples: Path):
    text = sample_bytes(samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz").decode()
    text = text.replace(
        "<clocks_event_reason_sw_power_cap>Not Active<", "<clocks_event_reason_sw_power_cap>Active<"
    ).replace(
        "<clocks_event_reason_hw_thermal_slowdown>Not Active<", "<clocks_event_reason_hw_thermal_slowdown>Active<"
    )
    snap = parse_nvidia_smi(text, "x")
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="power") == 1.0
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="thermal") == 1.0
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="other") == 0.0


def test_nvidia_smi_bad_input(samples: Path):
    text = sample_bytes(samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz").decode()
    text = text.replace("<power_draw>67.03 W<", "<power_draw>x W<")
    snap = parse_nvidia_smi(text, "n.xml")
    assert [str(p) for p in snap.problems] == ["n.xml: field gpu[0]/gpu_power_readings/power_draw: not a number: 'x W'"]
    with pytest.raises(TelemetryFormatError, match=r"n\.xml: not nvidia-smi XML"):
        parse_nvidia_smi(text[:5000], "n.xml")


# -- sysfs ---------------------------------------------------------------------------------------


@pytest.fixture
def sysfs_root(samples: Path, tmp_path: Path) -> Path:
    """The real amdgpu sysfs excerpt, unpacked; returns the directory that holds class/drm."""
    ttar.unpack(ttar.read((samples / "sysfs" / "amdgpu_card0.ttar").read_text()), tmp_path)
    return tmp_path / "fixtures" / "sys"


def test_ttar_unpacks_files_directories_and_links(sysfs_root: Path):
    dev = sysfs_root / "class" / "drm" / "card0" / "device"
    assert (dev / "gpu_busy_percent").read_text() == "4\n"
    assert (dev / "pp_dpm_sclk").read_text().splitlines()[0] == "0: 852Mhz *"
    assert (dev / "product_name").read_text() == "\n"
    assert (dev / "driver").is_symlink()
    assert (dev / "driver").readlink() == Path("../../../../bus/pci/drivers/amdgpu")
    assert (sysfs_root / "class" / "drm" / "card1").is_dir()


def test_ttar_no_newline_base64_and_errors():
    archive = ttar.read("Path: a\nLines: 2\nfirst\nlastEOF\nMode: 644\nPath: b\nLines: 1|base64\nAAEC\nMode: 444\n")
    assert archive.files == {"a": b"first\nlast", "b": b"\x00\x01\x02"}
    with pytest.raises(ttar.TtarError, match="line 2: a: 5 line"):
        ttar.read("Path: a\nLines: 5\nx\n")
    with pytest.raises(ttar.TtarError, match="leaves the archive"):
        ttar.read("Path: ../../etc/passwd\nLines: 0\n")


def test_sysfs_acceptance_values(sysfs_root: Path):
    snap = read_sysfs(DirTree(sysfs_root))
    assert len(snap.gpus) == 1
    assert value(snap, "0", "hw.gpu.utilization") == 0.04
    assert value(snap, "0", "hw.gpu.memory.usage") == 1490378752
    assert value(snap, "0", "hw.gpu.memory.limit") == 8573157376
    assert value(snap, "0", "aaco.gpu.clock.frequency", clock="graphics") == 852e6
    assert value(snap, "0", "aaco.gpu.clock.max", clock="graphics") == 1630e6
    assert value(snap, "0", "aaco.gpu.clock.frequency", clock="memory") == 167e6
    assert value(snap, "0", "aaco.gpu.pcie.link.generation") == 3  # current_link_speed 8.0 GT/s
    assert value(snap, "0", "aaco.gpu.pcie.link.width") == 16
    assert value(snap, "0", "aaco.gpu.dpm.level", clock="soc") == 1  # pp_dpm_socclk's "1: ... *"
    g = snap.gpus[0].gpu
    # product_name is empty: device 0x687f revision 0xc1 in libdrm's amdgpu.ids
    assert (g.pci_bus, g.uuid, g.model) == ("0000:09:00.0", "0123456789abcdef", "AMD Radeon RX Vega")
    assert snap.problems == []


def add_hwmon_and_metrics(dev: Path, throttle_bits: int) -> None:
    hw = dev / "hwmon" / "hwmon3"
    hw.mkdir(parents=True)
    for name, text in {
        "power1_average": "41000000",
        "power1_cap": "300000000",
        "temp1_input": "45000",
        "temp1_label": "edge",
        "temp2_input": "61000",
        "temp2_label": "junction",
        "temp3_input": "52000",
        "temp3_label": "mem",
        "freq1_input": "1500000000",
        "freq1_label": "sclk",
    }.items():
        (hw / name).write_text(text + "\n")
    (dev / "ras").mkdir()
    (dev / "ras" / "umc_err_count").write_text("ue: 2\nce: 5\n")
    (dev / "ras" / "gfx_err_count").write_text("ue: 1\nce: 0\n")
    (dev / "gpu_metrics").write_bytes(gpu_metrics.encode_v1_3(throttle_bits))


def test_sysfs_hwmon_ras_and_gpu_metrics_throttle_bits(sysfs_root: Path):
    dev = sysfs_root / "class" / "drm" / "card0" / "device"
    add_hwmon_and_metrics(dev, (1 << 4) | (1 << 36))  # SPL (power) and TEMP_HOTSPOT (thermal)
    snap = read_sysfs(DirTree(sysfs_root))
    assert value(snap, "0", "hw.power") == 41.0
    assert value(snap, "0", "aaco.gpu.power.limit") == 300.0
    assert value(snap, "0", "hw.temperature", sensor="junction") == 61.0
    assert value(snap, "0", "hw.temperature", sensor="memory") == 52.0
    assert value(snap, "0", "aaco.gpu.clock.frequency", clock="graphics") == 1.5e9  # measured beats DPM level
    assert value(snap, "0", "hw.errors", error_type="uncorrected") == 3
    assert value(snap, "0", "hw.errors", error_type="corrected") == 5
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="power") == 1.0
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="thermal") == 1.0
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="current") == 0.0
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="other") == 0.0


def test_gpu_metrics_decoding():
    t = gpu_metrics.decode(gpu_metrics.encode_v1_3(1 << 17))
    assert (t.version, t.indep_throttle_status) == ("v1.3", 1 << 17)
    assert gpu_metrics.throttle_reasons(1 << 17) == {"power": False, "current": True, "thermal": False, "other": False}
    unknown = bytearray(gpu_metrics.encode_v1_3(0))
    unknown[2:4] = bytes([1, 5])
    assert gpu_metrics.decode(bytes(unknown)).indep_throttle_status is None  # layout not decoded: no reasons
    with pytest.raises(ValueError, match="header says 120 bytes, file has 60"):
        gpu_metrics.decode(gpu_metrics.encode_v1_3(0)[:60])


def test_sysfs_bad_values_and_truncated_gpu_metrics(sysfs_root: Path):
    dev = sysfs_root / "class" / "drm" / "card0" / "device"
    (dev / "gpu_busy_percent").write_text("busy\n")
    (dev / "gpu_metrics").write_bytes(gpu_metrics.encode_v1_3(0)[:40])
    snap = read_sysfs(DirTree(sysfs_root))
    assert sorted(str(p) for p in snap.problems) == [
        f"{sysfs_root}: field class/drm/card0/device/gpu_busy_percent: not a number: 'busy'",
        f"{sysfs_root}: field class/drm/card0/device/gpu_metrics: header says 120 bytes, file has 40",
    ]
    assert value(snap, "0", "hw.gpu.memory.usage") == 1490378752


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("max_open", [0, 512])
def test_sysfs_reader_gives_what_read_sysfs_gives_sample_after_sample(sysfs_root: Path, max_open: int):
    dev = sysfs_root / "class" / "drm" / "card0" / "device"
    add_hwmon_and_metrics(dev, 1 << 4)
    tree = DirTree(sysfs_root, max_open=max_open)
    reader = SysfsReader(tree)
    assert reader.sample() == read_sysfs(tree)
    (dev / "gpu_busy_percent").write_text("57\n")  # readings are read again every sample
    (dev / "hwmon" / "hwmon3" / "temp2_input").write_text("70000\n")
    (dev / "pp_dpm_sclk").write_text("0: 852Mhz\n1: 1630Mhz *\n")
    snap = reader.sample()
    assert snap == read_sysfs(tree)
    assert value(snap, "0", "hw.gpu.utilization") == 0.57
    assert value(snap, "0", "hw.temperature", sensor="junction") == 70.0
    assert value(snap, "0", "aaco.gpu.clock.max", clock="graphics") == 1630e6


@pytest.mark.parametrize("max_open", [0, 512])
def test_sysfs_reader_keeps_layouts_until_a_refresh(sysfs_root: Path, max_open: int):
    dev = sysfs_root / "class" / "drm" / "card0" / "device"
    add_hwmon_and_metrics(dev, 0)
    clock = FakeClock()
    reader = SysfsReader(DirTree(sysfs_root, max_open=max_open), refresh_s=60.0, clock=clock)
    reader.sample()
    (dev / "hwmon" / "hwmon3" / "temp3_label").write_text("hotspot\n")  # labels are part of the layout
    (dev / "unique_id").write_text("fedcba9876543210\n")
    snap = reader.sample()
    assert value(snap, "0", "hw.temperature", sensor="memory") == 52.0
    assert snap.gpus[0].gpu.uuid == "0123456789abcdef"
    clock.now = 60.0
    snap = reader.sample()
    assert snap.gpus[0].gpu.uuid == "fedcba9876543210"
    assert not any(dict(r.attrs).get("sensor") == "memory" for r in snap.gpus[0].readings)  # a label not mapped


def test_sysfs_reader_cards_that_come_go_and_fail(sysfs_root: Path, monkeypatch: pytest.MonkeyPatch):
    import shutil

    from aaco.agent.sources.smi import sysfs

    drm = sysfs_root / "class" / "drm"
    reader = SysfsReader(DirTree(sysfs_root))
    assert [g.gpu.index for g in reader.sample().gpus] == ["0"]
    shutil.copytree(drm / "card0", drm / "card2", symlinks=True)  # a card that appears is probed at once
    (drm / "card2" / "device" / "unique_id").write_text("2222\n")
    assert [(g.gpu.index, g.gpu.uuid) for g in reader.sample().gpus] == [("0", "0123456789abcdef"), ("2", "2222")]
    (drm / "card0").rename(drm / "gone")  # one that vanished is forgotten
    assert [g.gpu.index for g in reader.sample().gpus] == ["2"]
    (drm / "gone").rename(drm / "card0")
    (drm / "card0" / "device" / "unique_id").write_text("0000\n")  # it came back as another GPU: probed again
    assert [(g.gpu.index, g.gpu.uuid) for g in reader.sample().gpus] == [("0", "0000"), ("2", "2222")]

    real_read = fail_reads_of("card2/device/gpu_busy_percent", monkeypatch)
    snap = reader.sample()
    assert [g.gpu.index for g in snap.gpus] == ["0"]
    assert [p.field for p in snap.problems] == ["class/drm/card2"]
    monkeypatch.setattr(sysfs.os, "read", real_read)
    (drm / "card2" / "device" / "unique_id").write_text("2223\n")  # a card that failed is probed again
    assert [(g.gpu.index, g.gpu.uuid) for g in reader.sample().gpus] == [("0", "0000"), ("2", "2223")]


def open_files(under: Path) -> list[str]:
    """Files of this process open under a directory."""
    fds = Path("/proc/self/fd")
    targets = []
    for fd in fds.iterdir():
        try:
            targets.append(os.readlink(fd))
        except OSError:
            continue
    return sorted(t for t in targets if t.startswith(str(under)))


def test_sysfs_reader_keeps_reading_files_open_within_a_bound(sysfs_root: Path, monkeypatch: pytest.MonkeyPatch):
    import shutil

    from aaco.agent.sources.smi import sysfs

    drm = sysfs_root / "class" / "drm"
    add_hwmon_and_metrics(drm / "card0" / "device", 0)
    shutil.copytree(drm / "card0", drm / "card2", symlinks=True)
    reader = SysfsReader(DirTree(sysfs_root, max_open=10))
    reader.sample()
    kept = open_files(sysfs_root)
    assert 0 < len(kept) <= 10  # the bound (files that do not exist take a place): the rest are opened per read
    assert open_files(drm / "card0") == kept and open_files(drm / "card2") == []
    (drm / "card0" / "device" / "gpu_busy_percent").write_text("75\n")
    assert value(reader.sample(), "0", "hw.gpu.utilization") == 0.75  # read again from the start
    assert open_files(sysfs_root) == kept

    real_pread = fail_reads_of("card0/device/gpu_busy_percent", monkeypatch, call="pread")
    snap = reader.sample()
    assert [g.gpu.index for g in snap.gpus] == ["2"]
    assert open_files(drm / "card0") == []  # a GPU that failed has its files closed
    monkeypatch.setattr(sysfs.os, "pread", real_pread)
    assert [g.gpu.index for g in reader.sample().gpus] == ["0", "2"]
    reader.close()
    assert open_files(sysfs_root) == []


def test_sysfs_reader_reports_bad_dpm_lines_every_sample(sysfs_root: Path):
    dev = sysfs_root / "class" / "drm" / "card0" / "device"
    (dev / "pp_dpm_sclk").write_text("0: 852Mhz *\nturbo\n")
    reader = SysfsReader(DirTree(sysfs_root))
    for _ in range(2):
        snap = reader.sample()
        assert [str(p) for p in snap.problems] == [
            f"{sysfs_root}: field class/drm/card0/device/pp_dpm_sclk: not a DPM level line: 'turbo'"
        ]
        assert value(snap, "0", "aaco.gpu.clock.frequency", clock="graphics") == 852e6


# -- the file backend's capture reader -----------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "fmt", "gpus"),
    [
        ("amd-smi/amd-smi-metric.json", "amd-smi", 1),
        ("rocm-smi/mi100_rocm602.json", "rocm-smi", 4),
        ("nvidia-smi/a100-sxm4-v12.xml.gz", "nvidia-smi", 5),  # the GPU and its four MIG devices
        ("sysfs/amdgpu_card0.ttar", "sysfs", 1),
    ],
)
def test_captures_are_recognised_by_content(samples: Path, rel: str, fmt: str, gpus: int):
    assert sniff(sample_bytes(samples / rel)) == fmt
    snap = read_capture(samples / rel)
    assert (snap.format, len(snap.gpus)) == (fmt, gpus)


def test_sysfs_capture_values_match_the_unpacked_tree(samples: Path, sysfs_root: Path):
    from_archive = read_capture(samples / "sysfs" / "amdgpu_card0.ttar")
    from_dir = read_sysfs(DirTree(sysfs_root))
    assert [(r.metric, r.value, r.attrs) for r in from_archive.gpus[0].readings] == [
        (r.metric, r.value, r.attrs) for r in from_dir.gpus[0].readings
    ]


def test_unreadable_captures_name_the_file(tmp_path: Path):
    bad = tmp_path / "cap.json"
    bad.write_text('[{"gpu": 0, "power": ')
    with pytest.raises(TelemetryFormatError, match=f"{bad}: invalid or truncated JSON"):
        read_capture(bad)
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(TelemetryFormatError, match=f"{other}: not a telemetry capture"):
        read_capture(other)
    with pytest.raises(TelemetryFormatError, match="no such file"):
        read_capture(tmp_path / "missing.json")


# -- values and rows -----------------------------------------------------------------------------


def test_numbers_units_and_pci_addresses():
    assert number("(300Mhz)") == 300.0
    assert number("N/A") is None
    assert scale(1275, "MHz", "hz") == 1275e6
    assert scale(50, "MiB", "by") == 52428800
    with pytest.raises(ValueError, match="unexpected unit"):
        scale(1, "W", "hz")
    assert normalize_pci("00000000:01:00.0") == "0000:01:00.0"
    assert normalize_pci("0000:A3:00.0") == "0000:a3:00.0"
    assert normalize_pci("83:00.0") == "0000:83:00.0"


def test_rows_carry_identity_units_and_pods(samples: Path):
    snap = read_capture(samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz")
    table = to_table(snap.gpus, ts_ns=7, node="n1", source="smi", extra={"0": {"k8s.pod.name": "p"}})
    rows = table.to_pylist()
    power = next(r for r in rows if r["metric"] == "hw.power")
    assert power["unit"] == "W" and power["value"] == 67.03 and power["ts_ns"] == 7
    assert power["gpu_uuid"] == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert dict(power["attributes"]) == {
        "hw.model": "NVIDIA A100-SXM4-80GB",
        "hw.vendor": "nvidia",
        "pci.bus_id": "0000:01:00.0",
        "k8s.pod.name": "p",
    }
    from aaco.contract.schemas import conform

    assert conform("telemetry", table).num_rows == len(rows)


def test_gzip_captures_are_bounded_and_damage_is_named(samples: Path, tmp_path: Path):
    packed = (samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz").read_bytes()
    raw = sample_bytes(samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz")
    with pytest.raises(TelemetryFormatError, match="limit once decompressed"):
        read_capture(samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz", max_bytes=len(raw) - 1)
    cut = tmp_path / "cut.xml.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(TelemetryFormatError, match="cut gzip") as exc:
        read_capture(cut)
    assert exc.value.subject == str(cut)
    flipped = tmp_path / "flipped.xml.gz"
    flipped.write_bytes(packed[:20] + bytes(b ^ 0xFF for b in packed[20:40]) + packed[40:])
    with pytest.raises(TelemetryFormatError, match=r"damaged gzip|cut gzip"):
        read_capture(flipped)
