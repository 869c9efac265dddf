"""MIG devices from nvidia-smi XML: each a device with its parent named, its own memory, nothing device-wide copied.

The expected values are read from the real capture here, with ElementTree, independently of the
reader (examples/data/nvidia-smi/a100-sxm4-v12.xml.gz: Telegraf's A100-SXM4-80GB in MIG mode with
four MIG devices, examples/data/SAMPLES.md).
"""

from __future__ import annotations

import gzip
import xml.etree.ElementTree as ET
from pathlib import Path

from aaco.agent.sources.smi.capture import read_capture
from aaco.agent.sources.smi.nvidia_smi import parse_nvidia_smi
from aaco.agent.sources.smi.podresources import api_pb2
from aaco.agent.sources.smi.pods import Owner, attributes, device_keys, gpu_keys, owners_by_device
from aaco.agent.sources.smi.tracker import GpuTracker
from aaco.analyzers.telemetry import TelemetryAnalyzer
from aaco.contract import telemetry as m
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.telemetry import Snapshot, to_table
from tests.support.fake_kubelet import pod

A100 = Path(__file__).parents[2] / "examples" / "data" / "nvidia-smi" / "a100-sxm4-v12.xml.gz"
DEVICE_WIDE = {
    m.POWER, m.POWER_LIMIT, m.ENERGY, m.TEMPERATURE, m.CLOCK, m.CLOCK_MAX, m.UTILIZATION, m.MEMORY_UTILIZATION,
    m.PCIE_LINK_GENERATION, m.PCIE_LINK_WIDTH, m.PCIE_REPLAYS, m.ERRORS, m.THROTTLE, m.PSTATE, m.FAN_SPEED_RATIO,
    m.RETIRED_PAGES, m.REMAPPED_ROWS,
}  # fmt: skip
MIB = 2**20


def expected(path: Path) -> list[dict[str, object]]:
    """Each MIG device of the file, read with ElementTree: parent, ids, memory in bytes."""
    root = ET.fromstring(gzip.decompress(path.read_bytes()))
    out = []
    for i, gpu in enumerate(root.findall("gpu")):
        for mig in gpu.findall("mig_devices/mig_device"):
            gi, ci = mig.findtext("gpu_instance_id"), mig.findtext("compute_instance_id")
            out.append(
                {
                    "index": f"{i}/{gi}/{ci}",
                    "parent": str(i),
                    "parent_uuid": gpu.findtext("uuid"),
                    "gpu_instance": gi,
                    "compute_instance": ci,
                    "used": float(mig.findtext("fb_memory_usage/used").removesuffix(" MiB")) * MIB,
                    "total": float(mig.findtext("fb_memory_usage/total").removesuffix(" MiB")) * MIB,
                    "sram_uncorrected": float(mig.findtext("ecc_error_count/volatile_count/sram_uncorrectable")),
                }
            )
    return out


def reading(s, metric: str, **attrs: str) -> float:
    hits = [r.value for r in s.readings if r.metric == metric and dict(r.attrs) == attrs]
    assert len(hits) == 1, (s.gpu.index, metric, attrs, hits)
    return hits[0]


def test_each_mig_device_of_the_real_a100_capture_is_a_device_with_its_own_memory():
    want = expected(A100)
    assert len(want) == 4
    snap = read_capture(A100)
    assert not snap.problems
    parent, *migs = snap.gpus
    assert parent.gpu.index == "0" and not parent.gpu.parent
    assert [g.gpu.index for g in migs] == [w["index"] for w in want] == ["0/3/0", "0/4/0", "0/5/0", "0/6/0"]
    for s, w in zip(migs, want, strict=True):
        g = s.gpu
        assert (g.parent, g.parent_uuid, g.gpu_instance, g.compute_instance) == (
            w["parent"],
            w["parent_uuid"],
            w["gpu_instance"],
            w["compute_instance"],
        )
        assert g.parent_uuid == parent.gpu.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
        assert g.uuid == ""  # schema 12 has no MIG UUID
        assert g.model == "NVIDIA A100-SXM4-80GB" and g.vendor == "nvidia" and g.pci_bus == ""
        assert reading(s, m.MEMORY_USAGE) == w["used"] == 12 * MIB
        assert reading(s, m.MEMORY_LIMIT) == w["total"] == 19968 * MIB
        assert reading(s, m.ECC_UNCORRECTED, block="sram") == w["sram_uncorrected"]
        # nothing of the whole GPU is copied onto its MIG devices
        assert not {r.metric for r in s.readings} & DEVICE_WIDE
    # the parent keeps the GPU's own readings and memory (its 81920 MiB, not the sum of its slices)
    assert reading(parent, m.MEMORY_LIMIT) == 81920 * MIB
    assert reading(parent, m.POWER) > 0
    assert {r.metric for r in parent.readings} & DEVICE_WIDE


def test_mig_rows_carry_parent_and_instance_ids_and_the_analyzer_labels_them():
    snap = read_capture(A100)
    table = to_table(snap.gpus, ts_ns=1_000, node="n1", source="smi")
    rows = table.to_pylist()
    mig_rows = [r for r in rows if r["device"] == "0/4/0"]
    assert {r["metric"] for r in mig_rows} == {m.MEMORY_USAGE, m.MEMORY_LIMIT, m.ECC_UNCORRECTED}
    attrs = dict(mig_rows[0]["attributes"])
    assert attrs[m.ATTR_PARENT_UUID] == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert (attrs[m.ATTR_GPU_INSTANCE], attrs[m.ATTR_COMPUTE_INSTANCE]) == ("4", "0")
    parent_attrs = dict(next(r for r in rows if r["device"] == "0")["attributes"])
    assert m.ATTR_PARENT_UUID not in parent_attrs
    a = TelemetryAnalyzer()
    a.update(EventBatch("telemetry", conform("telemetry", table), "smi"))
    pts = [(p.metric.prom_name, p.labels, p.value) for p in a.snapshot().points()]
    used = {lb["gpu"]: (lb, v) for n, lb, v in pts if n == "aaco_gpu_memory_usage_bytes"}
    assert set(used) == {"0", "0/3/0", "0/4/0", "0/5/0", "0/6/0"}
    lb, v = used["0/5/0"]
    assert v == 12 * MIB
    assert (lb["parent_uuid"], lb["gpu_instance"], lb["compute_instance"]) == (
        "GPU-513536b6-7d19-9063-b049-1e69664bb298",
        "5",
        "0",
    )
    assert used["0"][0]["parent_uuid"] == "" and used["0"][0]["gpu_uuid"].startswith("GPU-")
    power = [lb["gpu"] for n, lb, _ in pts if n == "aaco_gpu_power_watts"]
    assert power == ["0"]  # device-wide: once, on the parent


MIG_XML = """<nvidia_smi_log><gpu id="00000000:07:00.0"><uuid>GPU-aaaa</uuid><product_name>NVIDIA H100</product_name>
<mig_mode><current_mig>{mode}</current_mig></mig_mode><mig_devices>
<mig_device><index>0</index><uuid>MIG-bbbb</uuid><gpu_instance_id>1</gpu_instance_id>
<compute_instance_id>0</compute_instance_id><fb_memory_usage><total>40 GiB</total><used>N/A</used></fb_memory_usage>
<ecc_error_count><volatile_count><sram_uncorrectable>N/A</sram_uncorrectable></volatile_count></ecc_error_count>
</mig_device>
<mig_device><index>1</index><gpu_instance_id>x</gpu_instance_id><compute_instance_id>0</compute_instance_id></mig_device>
</mig_devices><fb_memory_usage><total>81920 MiB</total><used>N/A</used></fb_memory_usage></gpu></nvidia_smi_log>"""


def test_mig_uuid_missing_values_and_bad_ids():
    snap = parse_nvidia_smi(MIG_XML.format(mode="Enabled"), "x.xml")
    assert [g.gpu.index for g in snap.gpus] == ["0", "0/1/0"]
    mig = snap.gpus[1]
    assert mig.gpu.uuid == "MIG-bbbb"
    assert [(r.metric, r.value) for r in mig.readings] == [(m.MEMORY_LIMIT, 40 * 2**30)]  # used and ECC N/A
    assert [p.field for p in snap.problems] == ["gpu[0]/mig_devices/mig_device[1]/gpu_instance_id"]
    # MIG mode off (or pending): no MIG devices, whatever the section holds
    assert [g.gpu.index for g in parse_nvidia_smi(MIG_XML.format(mode="Disabled"), "x.xml").gpus] == ["0"]


def test_a_removed_mig_device_is_forgotten_while_its_gpu_answers_and_down_when_the_gpu_is():
    snap = read_capture(A100)
    t = GpuTracker()
    t.update(snap)
    reconfigured = Snapshot(snap.format, [g for g in read_capture(A100).gpus if g.gpu.index != "0/6/0"])
    out, tr = t.update(reconfigured)
    assert "0/6/0" not in {s.gpu.index for s in out} and not tr.lost
    out, tr = t.update(Snapshot(snap.format, []))  # the whole GPU is gone: it and its MIG devices are down
    assert [g.index for g in tr.lost] == ["0"]  # said once, for the GPU
    assert {s.gpu.index: s.readings[0].value for s in out} == {"0": 0.0, "0/3/0": 0.0, "0/4/0": 0.0, "0/5/0": 0.0}


def test_pods_holding_mig_devices_under_the_mixed_and_single_strategies():
    snap = parse_nvidia_smi(MIG_XML.format(mode="Enabled"), "x.xml")
    parent, mig = snap.gpus[0].gpu, snap.gpus[1].gpu
    resp = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            pod("train", "ml", "main", "nvidia.com/mig-3g.40gb", "MIG-bbbb"),  # mixed strategy
            pod("infer", "ml", "srv", "nvidia.com/gpu", "MIG-GPU-aaaa/1/0"),  # single, a pre-R470 driver
            pod("other", "ml", "x", "example.com/fpga", "MIG-bbbb"),
        ]
    )
    owners = owners_by_device(resp, ("amd.com/gpu", "nvidia.com/gpu"))
    found = [o for k in gpu_keys(mig) for o in owners.get(k, [])]
    assert sorted(found, key=lambda o: o.pod) == [Owner("infer", "ml", "srv"), Owner("train", "ml", "main")]
    assert not [o for k in gpu_keys(parent) for o in owners.get(k, [])]  # the parent is not theirs
    assert device_keys("MIG-bbbb") <= gpu_keys(mig)
    assert attributes(found)[m.ATTR_POD] == "infer,train"
