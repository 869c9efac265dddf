"""The environment a lake was recorded in: GPU, driver, ROCm/CUDA, ONNX Runtime, clocks — and where each came from.

A baseline records it and a diff warns when it differs, since a latency change across different
hardware or software says little about the code. Each entry is ``{"value": ..., "source": ...}``:

- ``lake:sources.json`` — what the trace files said about their devices (``devices``: product and
  architecture names, e.g. rocprofv3's agents) and their formats;
- ``lake:telemetry`` — the GPU telemetry rows: product (``hw.model``), vendor, and per clock domain
  the median of the current clock and the highest maximum clock;
- ``lake:iterations`` / ``lake:kernels`` — the ONNX Runtime execution provider, the devices that ran work;
- ``machine`` — read on the machine running the command, for what a lake does not hold: the GPU
  driver (``/sys/module/amdgpu/version``, ``/proc/driver/nvidia/version``), ROCm
  (``/opt/rocm/.info/version``), CUDA (``/usr/local/cuda/version.json``, or the versioned directory
  it links to when that holds ``libcudart``; nothing from a dangling link), the installed ONNX
  Runtime (when the lake holds ONNX Runtime data), the CPU model and count, the OS kernel, Python and
  AACO. Right when the command runs where the lake was recorded (the CI case); ``--no-machine``
  leaves them out otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.verdict.lake import Lake
from aaco.contract import telemetry as tm

ORT_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-rocm", "onnxruntime-training")
CLOCK_TOLERANCE = 0.02  # clocks within 2 % are the same setting (sampling noise, DPM steps)


def _entry(value: Any, source: str) -> dict[str, Any]:
    return {"value": value, "source": source}


def _joined(values: list[str]) -> str | None:
    vals = sorted({v for v in values if v})
    return "; ".join(vals) if vals else None


def lake_environment(lake: Lake) -> dict[str, dict[str, Any]]:
    """What the lake itself says about its environment."""
    env: dict[str, dict[str, Any]] = {}
    products, formats = [], []
    for rec in lake.sources:
        formats.append(str(rec.get("format") or ""))
        for dev in (rec.get("devices") or {}).values():
            if isinstance(dev, Mapping) and str(dev.get("type", "GPU")).upper() == "GPU":
                products.append(str(dev.get("product_name") or dev.get("name") or ""))
    if _joined(products):
        env["gpu_model"] = _entry(_joined(products), "lake:sources.json")
    if _joined(formats):
        env["trace_formats"] = _entry(_joined(formats), "lake:sources.json")
    tel = lake.table("telemetry")
    if tel.num_rows:
        attrs = tel["attributes"].to_pylist()
        models = [dict(a or ()).get(tm.ATTR_MODEL, "") for a in attrs]
        vendors = [dict(a or ()).get(tm.ATTR_VENDOR, "") for a in attrs]
        if "gpu_model" not in env and _joined(models):
            env["gpu_model"] = _entry(_joined(models), "lake:telemetry")
        if _joined(vendors):
            env["gpu_vendor"] = _entry(_joined(vendors), "lake:telemetry")
        clocks = _clocks(tel, attrs)
        if clocks:
            env["clocks"] = _entry(clocks, "lake:telemetry")
    providers = lake.table("iterations")["provider"].drop_null().to_pylist()
    if _joined(providers):
        env["execution_provider"] = _entry(_joined(providers), "lake:iterations")
    devices = pc.unique(lake.table("kernels")["device"].drop_null()).to_pylist()
    if devices:
        env["devices"] = _entry(sorted(devices), "lake:kernels")
    return env


def _clocks(tel: pa.Table, attrs: list[Any]) -> dict[str, dict[str, float]]:
    """Per clock domain: the median current clock and the highest maximum clock (Hz)."""
    metric = tel["metric"].to_numpy(zero_copy_only=False)
    value = tel["value"].to_numpy(zero_copy_only=False)
    domain = np.array([dict(a or ()).get("clock", "") for a in attrs], dtype=object)
    out: dict[str, dict[str, float]] = {}
    for d in sorted(set(domain[(metric == tm.CLOCK) | (metric == tm.CLOCK_MAX)]) - {""}):
        cur = value[(metric == tm.CLOCK) & (domain == d)]
        top = value[(metric == tm.CLOCK_MAX) & (domain == d)]
        entry: dict[str, float] = {}
        if cur.size:
            entry["median_hz"] = float(np.median(cur))
        if top.size:
            entry["max_hz"] = float(top.max())
        out[str(d)] = entry
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def machine_environment(root: Path = Path("/"), with_ort: bool = True) -> dict[str, dict[str, Any]]:
    """What this machine says (``root`` lets tests point at a fake tree)."""
    env: dict[str, dict[str, Any]] = {}
    amd = _read(root / "sys/module/amdgpu/version")
    nv = _read(root / "proc/driver/nvidia/version")
    if nv:
        m = re.search(r"Kernel Module(?: for \w+)?\s+([\d.]+)", nv)
        env["gpu_driver"] = _entry(f"nvidia {m.group(1) if m else nv.splitlines()[0]}", "machine")
    elif amd:
        env["gpu_driver"] = _entry(f"amdgpu {amd}", "machine")
    # A toolkit installed where no driver of its vendor runs (a CPU-only host, a build machine) is not
    # what any workload here ran with: its version is left out rather than read as the GPU stack's.
    rocm = _read(root / "opt/rocm/.info/version") if amd else None
    if rocm:
        env["rocm_version"] = _entry(rocm, "machine")
    cuda = _cuda_version(root / "usr/local/cuda") if nv else None
    if cuda:
        env["cuda_version"] = _entry(cuda, "machine")
    if with_ort:
        for dist in ORT_DISTRIBUTIONS:
            try:
                env["onnxruntime_version"] = _entry(f"{dist} {metadata.version(dist)}", "machine")
                break
            except metadata.PackageNotFoundError:
                continue
    cpuinfo = _read(root / "proc/cpuinfo") or ""
    m = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    if m:
        env["cpu_model"] = _entry(m.group(1).strip(), "machine")
    env["cpu_count"] = _entry(os.cpu_count(), "machine")
    env["os_kernel"] = _entry(platform.release(), "machine")
    env["python"] = _entry(platform.python_version(), "machine")
    with contextlib.suppress(metadata.PackageNotFoundError):
        env["aaco_version"] = _entry(metadata.version("aaco"), "machine")
    return env


def node_versions(root: Path = Path("/")) -> dict[str, Any]:
    """The software this node runs, for the lake's ``versions`` rows (contract/versions.py)."""
    return {key: entry["value"] for key, entry in machine_environment(root).items()}


def _cuda_version(base: Path) -> str | None:
    """The CUDA toolkit's version, only from a directory that exists and holds a version file or the runtime.

    A dangling ``/usr/local/cuda`` link (a toolkit removed, a host with no GPU) or an empty versioned
    directory says nothing about what is installed.
    """
    try:
        home = base.resolve(strict=True)
    except (OSError, RuntimeError):  # absent, dangling, or a link loop
        return None
    if not home.is_dir():
        return None
    doc = _read(home / "version.json")
    if doc:
        try:
            v = json.loads(doc).get("cuda", {}).get("version")
            if v:
                return str(v)
        except (json.JSONDecodeError, AttributeError):
            pass
    txt = _read(home / "version.txt")
    if txt:
        m = re.search(r"([\d.]+)", txt)
        if m:
            return m.group(1)
    if not any(home.glob("lib64/libcudart.so*")) and not any(home.glob("targets/*/lib/libcudart.so*")):
        return None
    m = re.fullmatch(r"cuda-([\d.]+)", home.name)
    return m.group(1) if m else None


def environment(lake: Lake, machine: bool = True) -> dict[str, dict[str, Any]]:
    """The lake's environment, completed from this machine where the lake lacks an entry (unless ``machine`` is off)."""
    env = lake_environment(lake)
    if machine:
        has_ort = "ort_profile" in (env.get("trace_formats", {}).get("value") or "") or "execution_provider" in env
        for key, entry in machine_environment(with_ort=has_ort).items():
            env.setdefault(key, entry)
    return env


def differences(base: Mapping[str, Any], session: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Entries known on both sides whose values differ (clocks with a 2 % tolerance)."""
    out = []
    for key in sorted(set(base) & set(session)):
        a, b = base[key].get("value"), session[key].get("value")
        if key == "clocks" and isinstance(a, Mapping) and isinstance(b, Mapping):
            for dom in sorted(set(a) & set(b)):
                for stat in sorted(set(a[dom]) & set(b[dom])):
                    x, y = float(a[dom][stat]), float(b[dom][stat])
                    if abs(y - x) > CLOCK_TOLERANCE * max(abs(x), abs(y), 1.0):
                        out.append({"key": f"clocks.{dom}.{stat}", "baseline": x, "session": y})
        elif a != b:
            out.append({"key": key, "baseline": a, "session": b})
    return out
