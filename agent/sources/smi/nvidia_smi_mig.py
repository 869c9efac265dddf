"""MIG devices in ``nvidia-smi -q -x``: each ``<mig_devices>/<mig_device>`` a device of its own.

A GPU in MIG mode (``mig_mode/current_mig`` Enabled) lists its MIG devices (a compute instance in
a GPU instance), each with ``index`` (nvidia-smi's enumeration order), ``gpu_instance_id``,
``compute_instance_id``, ``device_attributes`` (its share of the engines), ``ecc_error_count``
(its own volatile ECC counts, in schema 12 ``sram_uncorrectable``), ``fb_memory_usage``
(``total``, ``reserved``, ``used``, ``free``: its own slice of the memory) and ``bar1_memory_usage``;
newer drivers add its ``MIG-...`` ``uuid`` (some leave it out). Each becomes a ``GpuSample`` named
``<gpu>/<gpu_instance>/<compute_instance>`` (``contract.telemetry.GpuIdentity``) with its parent's
index and UUID, its memory used and total and its ECC counts; everything else nvidia-smi reports
(power, temperature, clocks, utilisation, PCIe, ECC totals) belongs to the whole GPU and stays on
the parent only (docs/shared-gpus.md).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from aaco.agent.sources.smi.values import Fields, missing
from aaco.contract.telemetry import (
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    MEMORY_LIMIT,
    MEMORY_USAGE,
    GpuIdentity,
    GpuSample,
)


def read_mig(f: Fields, gpu: ET.Element, where: str, parent: GpuIdentity) -> list[GpuSample]:
    """The MIG devices of one ``<gpu>`` (none unless its current MIG mode is Enabled)."""
    if _text(gpu.find("mig_mode/current_mig")).lower() != "enabled":
        return []
    out: list[GpuSample] = []
    seen: set[str] = set()
    for j, mig in enumerate(gpu.findall("mig_devices/mig_device")):
        path = f"{where}/mig_devices/mig_device[{j}]"
        gi = _id(f, mig, "gpu_instance_id", path)
        ci = _id(f, mig, "compute_instance_id", path)
        if gi is None or ci is None:
            continue
        index = f"{parent.index}/{gi}/{ci}"
        if index in seen:
            f.problem(path, f"a second MIG device with GPU instance {gi} and compute instance {ci}")
            continue
        seen.add(index)
        uuid = _text(mig.find("uuid"))
        s = GpuSample(
            GpuIdentity(
                index,
                uuid="" if missing(uuid) else uuid,
                model=parent.model,
                vendor=parent.vendor,
                parent=parent.index,
                parent_uuid=parent.uuid,
                gpu_instance=gi,
                compute_instance=ci,
            )
        )
        for tag, metric in (("used", MEMORY_USAGE), ("total", MEMORY_LIMIT)):
            el = mig.find(f"fb_memory_usage/{tag}")
            if el is not None and el.text is not None:
                s.add(metric, f.with_unit(el.text.strip(), f"{path}/fb_memory_usage/{tag}", "by", "MiB"))
        _ecc(f, mig, path, s)
        out.append(s)
    return out


def _ecc(f: Fields, mig: ET.Element, path: str, s: GpuSample) -> None:
    """``ecc_error_count/volatile_count``: ``sram_uncorrectable``, ``dram_correctable``, ... (by block)."""
    vol = mig.find("ecc_error_count/volatile_count")
    if vol is None:
        return
    counts: dict[tuple[str, str], float] = {}
    for child in vol:
        block, _, rest = child.tag.partition("_")
        if block not in ("sram", "dram") or not rest:
            continue
        kind = ECC_UNCORRECTED if rest.startswith("uncorrectable") else ECC_CORRECTED if rest == "correctable" else ""
        v = f.num(_text(child), f"{path}/ecc_error_count/volatile_count/{child.tag}") if kind else None
        if v is not None:
            counts[(kind, block)] = counts.get((kind, block), 0.0) + v
    for (kind, block), v in sorted(counts.items()):
        s.add(kind, v, block=block)


def _id(f: Fields, mig: ET.Element, tag: str, path: str) -> str | None:
    """A GPU or compute instance id (a small whole number); None and a problem when absent or not one."""
    value = _text(mig.find(tag))
    if value.isdigit():
        return str(int(value))
    f.problem(f"{path}/{tag}", f"expected an instance id, got {value!r}")
    return None


def _text(el: ET.Element | None) -> str:
    return "" if el is None else (el.text or "").strip()
