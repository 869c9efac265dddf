"""Every real nvidia-smi and rocm-smi capture the project carries (tests/data, examples/data), read
exactly: fan speed, P-state, DPM levels, PCIe link and voltage against the values this test reads from
the files itself (xml.etree, json), placeholder zeros left out, models that are names, no warnings."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from aaco.agent.sources.smi import ttar
from aaco.agent.sources.smi.amd_smi import parse_amd_smi, parse_identities
from aaco.agent.sources.smi.capture import read_capture
from aaco.agent.sources.smi.placeholders import drop_placeholders
from aaco.agent.sources.smi.rocm_smi import parse_rocm_smi
from aaco.agent.sources.smi.sysfs import read_sysfs
from aaco.agent.sources.smi.sysfs_tree import ArchiveTree
from aaco.contract.telemetry import GpuIdentity, GpuSample, Snapshot
from tests.conftest import ROOT, SAMPLES, sample_bytes

NVIDIA = sorted((ROOT / "tests" / "data" / "nvidia-smi").glob("*.xml*")) + sorted((SAMPLES / "nvidia-smi").glob("*"))
ROCM = sorted((ROOT / "tests" / "data" / "rocm-smi").glob("*.json")) + sorted((SAMPLES / "rocm-smi").glob("*.json"))
GT_PER_S = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}  # PCIe rate per lane -> generation


def readings(snap: Snapshot, gpu: str, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Series attributes -> value of ``metric`` on GPU ``gpu``."""
    sample = next(s for s in snap.gpus if s.gpu.index == gpu)
    return {r.attrs: r.value for r in sample.readings if r.metric == metric}


def one(snap: Snapshot, gpu: str, metric: str, **attrs: str) -> float | None:
    """The reading of ``metric`` with exactly ``attrs`` on GPU ``gpu``; None when absent."""
    return readings(snap, gpu, metric).get(tuple(sorted(attrs.items())))


def test_the_captures_are_all_here():
    assert [p.name for p in NVIDIA] == [
        "3090-v13.xml.gz",
        "a10g.xml",
        "dual_2070-v13.xml.gz",
        "dual_2080-v13.xml.gz",
        "dual_a5000-v13.xml.gz",
        "gt-1030.xml",
        "gtx-1070-ti.xml",
        "gtx-1660-ti.xml",
        "pro-6000-maxq-blackwell-v13.xml.gz",
        "quadro-p2000-v12.xml",
        "quadro-p400.xml",
        "rtx-3060-v12.xml",
        "rtx-3080-v12.xml.gz",
        "rtx-3080-v13.xml.gz",
        "rtx-3090-v12.xml.gz",
        "rtx-4000-sff-ada-v13.xml.gz",
        "tesla-t4.xml",
        "tesla_p4.xml",
        "a100-sxm4-v12.xml.gz",
        "h100-sxm5-v13.xml.gz",
    ]
    assert len(ROCM) == 8


# -- nvidia-smi ----------------------------------------------------------------------------------


def xml_gpus(path: Path) -> list[ET.Element]:
    return ET.fromstring(sample_bytes(path)).findall("gpu")


def text(gpu: ET.Element, path: str) -> str:
    el = gpu.find(path)
    return (el.text or "").strip() if el is not None else ""


def expected_nvidia(gpu: ET.Element) -> dict[str, float | None]:
    """What the file says, read here: None where it says N/A (or nothing), or a vGPU's placeholder 0."""
    vgpu = text(gpu, "gpu_virtualization_mode/virtualization_mode") == "VGPU"

    def num(path: str, pattern: str, scale: float = 1.0) -> float | None:
        m = re.fullmatch(pattern, text(gpu, path))
        return None if m is None or (vgpu and float(m.group(1)) == 0) else float(m.group(1)) / scale

    link = "pci/pci_gpu_link_info"
    return {
        "hw.fan.speed_ratio": num("fan_speed", r"(\d+) %", 100),
        "aaco.gpu.pstate": num("performance_state", r"P(\d+)"),
        "aaco.gpu.pcie.link.generation": num(f"{link}/pcie_gen/current_link_gen", r"(\d+)"),
        "aaco.gpu.pcie.link.width": num(f"{link}/link_widths/current_link_width", r"(\d+)x"),
        "hw.voltage": num("voltage/graphics_volt", r"(\d+\.\d+) mV", 1000),
    }


@pytest.mark.parametrize("path", NVIDIA, ids=lambda p: p.name)
def test_nvidia_smi_fan_pstate_pcie_and_voltage_equal_the_file(path: Path):
    snap = read_capture(path)
    gpus = xml_gpus(path)
    physical = [s for s in snap.gpus if not s.gpu.parent]  # MIG devices: tests/unit/test_smi_mig.py
    assert len(physical) == len(gpus) and snap.problems == []
    attrs = {"hw.fan.speed_ratio": {"fan": "0"}, "hw.voltage": {"sensor": "graphics"}}
    for i, gpu in enumerate(gpus):
        for metric, want in expected_nvidia(gpu).items():
            got = readings(snap, str(i), metric)
            assert got == ({} if want is None else {tuple(attrs.get(metric, {}).items()): want}), (i, metric)


def test_fan_speeds_of_every_capture():
    """19 GPUs in 16 nvidia-smi captures and 2 in 2 rocm-smi captures report a fan speed (0 % included)."""
    nvidia = [
        (p.name, len(fans))
        for p in NVIDIA
        if (fans := [g for g in read_capture(p).gpus if any(r.metric == "hw.fan.speed_ratio" for r in g.readings)])
    ]
    rocm = [
        p.name for p in ROCM if any(r.metric == "hw.fan.speed_ratio" for g in read_capture(p).gpus for r in g.readings)
    ]
    assert (len(nvidia), sum(n for _, n in nvidia)) == (16, 19)
    assert rocm == ["vega-10-XT.json", "vega-20-WKS-GL-XE.json"]
    dual = read_capture(ROOT / "tests" / "data" / "nvidia-smi" / "dual_2070-v13.xml.gz")
    assert [one(dual, g, "hw.fan.speed_ratio", fan="0") for g in ("0", "1")] == [0.35, 0.34]


def test_a_vgpu_guest_placeholder_zeros_are_absent():
    """GRID P4-1Q (virtualization_mode VGPU) prints 0 C and 0 MHz for every clock and maximum: absent."""
    path = ROOT / "tests" / "data" / "nvidia-smi" / "tesla_p4.xml"
    gpu = xml_gpus(path)[0]
    assert text(gpu, "temperature/gpu_temp") == "0 C" and text(gpu, "max_clocks/sm_clock") == "0 MHz"
    snap = read_capture(path)
    metrics = {r.metric for r in snap.gpus[0].readings}
    assert not metrics & {"hw.temperature", "aaco.gpu.clock.frequency", "aaco.gpu.clock.max"}
    assert not any(r.value == 0 and r.unit in ("Cel", "Hz") for r in snap.gpus[0].readings)
    # the guest's own readings stay, zeros included
    assert one(snap, "0", "hw.gpu.utilization") == 0.0
    assert one(snap, "0", "hw.gpu.memory.usage") == 807 * 2**20
    assert one(snap, "0", "aaco.gpu.pstate") == 8


def test_real_zeros_of_a_physical_gpu_are_kept():
    """RTX 3090 in a pass-through VM: graphics clock 0 MHz under a 2100 MHz maximum, 0 mV, fan 0 %."""
    snap = read_capture(ROOT / "tests" / "data" / "nvidia-smi" / "rtx-3090-v12.xml.gz")
    assert one(snap, "0", "aaco.gpu.clock.frequency", clock="graphics") == 0.0
    assert one(snap, "0", "aaco.gpu.clock.max", clock="graphics") == 2100e6
    assert one(snap, "0", "hw.voltage", sensor="graphics") == 0.0
    assert one(snap, "0", "hw.fan.speed_ratio", fan="0") == 0.0
    gfxoff = read_capture(ROOT / "tests" / "data" / "rocm-smi" / "rx6700xt_rocm612.json")  # sclk (0Mhz): GFXOFF
    assert one(gfxoff, "0", "aaco.gpu.clock.frequency", clock="graphics") == 0.0


def test_placeholder_rules():
    s = GpuSample(GpuIdentity("0"))
    for metric, value, attrs in [
        ("aaco.gpu.clock.max", 0, {"clock": "sm"}),
        ("aaco.gpu.clock.frequency", 0, {"clock": "sm"}),  # its maximum read 0: no clock data
        ("aaco.gpu.clock.frequency", 0, {"clock": "graphics"}),  # kept: a gated domain
        ("aaco.gpu.clock.max", 1e9, {"clock": "graphics"}),
        ("hw.temperature", 0, {"sensor": "edge"}),
        ("hw.power", 0, {}),
        ("hw.energy", 0, {}),
        ("aaco.gpu.pcie.link.width", 0, {}),
        ("hw.gpu.utilization", 0, {}),
        ("hw.fan.speed_ratio", 0, {"fan": "0"}),
        ("hw.voltage", 0, {"sensor": "graphics"}),
        ("aaco.gpu.pstate", 0, {}),
    ]:
        s.add(metric, value, **attrs)
    vgpu = GpuSample(s.gpu, list(s.readings))
    drop_placeholders(s)
    kept = [(r.metric, dict(r.attrs).get("clock", "")) for r in s.readings]
    assert kept == [
        ("aaco.gpu.clock.frequency", "graphics"),
        ("aaco.gpu.clock.max", "graphics"),
        ("hw.gpu.utilization", ""),
        ("hw.fan.speed_ratio", ""),
        ("hw.voltage", ""),
        ("aaco.gpu.pstate", ""),
    ]
    drop_placeholders(vgpu, vgpu=True)
    assert [r.metric for r in vgpu.readings] == ["aaco.gpu.clock.max", "hw.gpu.utilization", "aaco.gpu.pstate"]


# -- rocm-smi ------------------------------------------------------------------------------------


def expected_rocm(card: dict[str, str]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(metric, attributes) -> value, read here from a card's keys."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    fan = (("fan", "0"),)
    if "Fan speed (%)" in card:
        out[("hw.fan.speed_ratio", fan)] = int(card["Fan speed (%)"]) / 100
        out[("hw.fan.speed", fan)] = float(card["Fan RPM"])
    if "Voltage (mV)" in card:
        out[("hw.voltage", (("sensor", "graphics"),))] = int(card["Voltage (mV)"]) / 1000
    rate, lanes = re.fullmatch(r"\d+ \((\d+\.\d) ?GT/s x(\d+)\)", card["pcie clock level"]).groups()
    out[("aaco.gpu.pcie.link.generation", ())] = GT_PER_S[rate]
    out[("aaco.gpu.pcie.link.width", ())] = int(lanes)
    if "PCIe Replay Count" in card:  # --showreplaycount
        out[("aaco.gpu.pcie.replays", ())] = int(card["PCIe Replay Count"])
    names = {"s": "graphics", "m": "memory", "f": "fabric", "soc": "soc", "dcef": "dcef"}
    for key, level in card.items():
        if m := re.fullmatch(r"(\w+?)clk clock level:", key):
            out[("aaco.gpu.dpm.level", (("clock", names[m.group(1)]),))] = int(level)
    return out


@pytest.mark.parametrize("path", ROCM, ids=lambda p: p.name)
def test_rocm_smi_fan_voltage_pcie_and_dpm_levels_equal_the_file(path: Path):
    doc = json.loads(path.read_text())
    snap = parse_rocm_smi(doc, str(path))
    cards = sorted((k for k in doc if k.startswith("card")), key=lambda k: int(k[4:]))
    assert [s.gpu.index for s in snap.gpus] == [c[4:] for c in cards]
    assert snap.problems == []  # "N/A (Secondary die)" (rx6700xt_rocm602) included: quietly absent
    new = ("hw.fan.", "hw.voltage", "aaco.gpu.pcie.", "aaco.gpu.dpm.")
    for card, s in zip(cards, snap.gpus, strict=True):
        got = {(r.metric, r.attrs): r.value for r in s.readings if r.metric.startswith(new)}
        assert got == expected_rocm(doc[card]), card


def test_rocm_smi_na_with_a_reason_is_absent_without_a_warning():
    path = ROOT / "tests" / "data" / "rocm-smi" / "rx6700xt_rocm602.json"
    doc = json.loads(path.read_text())
    assert doc["card0"]["Average Graphics Package Power (W)"] == "N/A (Secondary die)"
    snap = parse_rocm_smi(doc, str(path))
    assert snap.problems == [] and one(snap, "0", "hw.power") is None
    assert one(snap, "0", "aaco.gpu.power.limit") == 211.0


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("rx6700xt_rocm430.json", "67XA6S"),  # "Card series": "0x1002"; 0x73df without a revision: its SKU
        ("rx6700xt_rocm571.json", "Navi 22 [Radeon RX 6700/6700 XT / 6800M]"),
        ("rx6700xt_rocm612.json", "Navi 22 [Radeon RX 6700/6700 XT / 6800M]"),
        ("vega-10-XT.json", "AMD Radeon Pro WX 9100"),  # no series, "Card model": "0xc1e": GPU ID 0x6861
        ("vega-20-WKS-GL-XE.json", "Radeon Instinct MI50 32GB"),
        ("mi100_rocm571.json", "Arcturus GL-XL [Instinct MI100]"),
    ],
)
def test_rocm_smi_models_are_names_never_pci_ids(name: str, model: str):
    snap = read_capture(ROOT / "tests" / "data" / "rocm-smi" / name)
    assert {s.gpu.model for s in snap.gpus} == {model}


def test_no_capture_names_a_gpu_by_a_pci_id():
    paths = [*NVIDIA, *ROCM, *sorted((SAMPLES / "amd-smi").glob("*")), *sorted((SAMPLES / "sysfs").glob("*"))]
    models = {p.name: {s.gpu.model for s in read_capture(p).gpus} for p in paths}
    assert {n: m for n, m in models.items() if any(re.fullmatch(r"0x[0-9a-fA-F]+", x) for x in m)} == {}
    assert models["amdgpu_card0.ttar"] == {"AMD Radeon RX Vega"}  # empty product_name: 0x687f rev 0xc1


# -- amd-smi and sysfs ---------------------------------------------------------------------------


def test_amd_smi_fan_voltages_and_pcie_equal_the_file():
    path = SAMPLES / "amd-smi" / "amd-smi-metric.json"
    doc = json.loads(path.read_text())
    e = doc[0]
    snap = parse_amd_smi(doc, str(path))
    assert snap.problems == []
    assert one(snap, "0", "hw.fan.speed_ratio", fan="0") == e["fan"]["usage"]["value"] / 100  # 20 %: 51 of 255
    assert one(snap, "0", "hw.fan.speed", fan="0") == e["fan"]["rpm"]
    for key, sensor in (("gfx_voltage", "graphics"), ("soc_voltage", "soc"), ("mem_voltage", "memory")):
        assert one(snap, "0", "hw.voltage", sensor=sensor) == e["power"][key]["value"] / 1000
    assert one(snap, "0", "aaco.gpu.pcie.link.width") == e["pcie"]["width"]
    assert e["pcie"]["speed"] == {"value": 16, "unit": "GT/s"}
    assert one(snap, "0", "aaco.gpu.pcie.link.generation") == 4
    assert e["energy"]["total_energy_consumption"]["value"] == 0.0
    assert one(snap, "0", "hw.energy") is None  # a counter at 0 J: no accumulator


def test_amd_smi_market_name_that_is_a_device_id_is_replaced():
    listed = [{"gpu": 0, "bdf": "0000:0c:00.0", "uuid": "u0"}]
    static = [{"gpu": 0, "asic": {"market_name": "0x74a1", "device_id": "0x74a1", "rev_id": "0x00"}}]
    assert parse_identities(listed, static, "x")["0"].model == "AMD Instinct MI300X"


def test_sysfs_hwmon_fans_and_voltages():
    """The real Vega 10 excerpt with the amdgpu hwmon files it lacks: pwm1 of pwm1_max, fan1_input, in0_input."""
    archive = ttar.read((SAMPLES / "sysfs" / "amdgpu_card0.ttar").read_text())
    hw = "fixtures/sys/class/drm/card0/device/hwmon/hwmon2/"
    for name, content in {
        "pwm1": "102",
        "pwm1_max": "255",
        "fan1_input": "1180",
        "in0_input": "806",
        "in0_label": "vddgfx",
        "temp1_input": "0",  # a sensor that reads 0 C: absent
    }.items():
        archive.files[hw + name] = content.encode() + b"\n"
    snap = read_sysfs(ArchiveTree(archive, "card0.ttar"))
    assert snap.problems == []
    assert one(snap, "0", "hw.fan.speed_ratio", fan="0") == 102 / 255
    assert one(snap, "0", "hw.fan.speed", fan="0") == 1180
    assert one(snap, "0", "hw.voltage", sensor="graphics") == 0.806
    assert readings(snap, "0", "hw.temperature") == {}
