"""amdgpu's hwmon files (``class/drm/cardN/device/hwmon/hwmonM``): power, sensors, fans, voltages.

- ``power1_average`` or ``power1_input`` (microwatts; the first with a value), ``power1_cap`` (the
  power cap, microwatts);
- ``tempK_input`` (millidegrees, labelled ``edge`` / ``junction`` / ``mem``; unlabelled: edge),
  ``freqK_input`` (Hz, labelled ``sclk`` / ``mclk``);
- ``inK_input`` (millivolts, labelled ``vddgfx``: graphics, ``vddnb``: the APU's northbridge, soc);
- ``fanK_input`` (rpm) and ``pwmK`` (the fan's duty, 0..``pwmK_max``, 255 when that file is missing)
  as fan ``K-1``'s speed and speed ratio.

``hwmon_layout`` finds the files once (labels and scales do not change while the card stays);
``read_hwmon`` reads them sample after sample.
"""

from __future__ import annotations

import re
from typing import Final

from aaco.agent.sources.smi.sysfs_tree import Tree, text
from aaco.agent.sources.smi.values import Fields
from aaco.contract.telemetry import (
    CLOCK,
    FAN_SPEED,
    FAN_SPEED_RATIO,
    POWER,
    POWER_LIMIT,
    TEMPERATURE,
    VOLTAGE,
    GpuSample,
)

_SENSOR = re.compile(r"^(temp|freq|in|fan)(\d+)_input$")
_PWM = re.compile(r"^pwm(\d+)$")
_FREQ_LABELS: Final[dict[str, str]] = {"sclk": "graphics", "mclk": "memory"}
_TEMP_LABELS: Final[dict[str, str]] = {"edge": "edge", "junction": "junction", "mem": "memory"}
_VOLT_LABELS: Final[dict[str, str]] = {"vddgfx": "graphics", "vddnb": "soc"}
PWM_FULL: Final = 255.0

# (kind, path, label): kind power / cap (candidate files, the first with a value wins), temp / freq /
# in (a sensor and its label), fan (its rpm; label: the fan's number), pwm (label: "fan/full scale")
HwmonFile = tuple[str, str, str]


def hwmon_layout(tree: Tree, dev: str) -> list[HwmonFile]:
    """The hwmon files of a card's device directory ``dev``, in reading order."""
    out: list[HwmonFile] = []
    for hw in tree.listdir(f"{dev}/hwmon"):
        base = f"{dev}/hwmon/{hw}"
        files = set(tree.listdir(base))
        out += [("power", f"{base}/{name}", "") for name in ("power1_average", "power1_input") if name in files]
        if "power1_cap" in files:
            out.append(("cap", f"{base}/power1_cap", ""))
        for name in sorted(files):
            m = _SENSOR.match(name)
            if m is not None and m.group(1) == "fan":
                out.append(("fan", f"{base}/{name}", str(int(m.group(2)) - 1)))
            elif m is not None:
                out.append((m.group(1), f"{base}/{name}", text(tree, f"{base}/{m.group(1)}{m.group(2)}_label").lower()))
            elif (p := _PWM.match(name)) is not None:
                full = text(tree, f"{base}/{name}_max") or str(PWM_FULL)
                out.append(("pwm", f"{base}/{name}", f"{int(p.group(1)) - 1}/{full}"))
    return out


def read_hwmon(tree: Tree, files: tuple[HwmonFile, ...], f: Fields, s: GpuSample) -> None:
    """Add the readings of a card's hwmon files to ``s``."""
    for kind, path, label in files:
        if kind in ("power", "cap"):
            metric = POWER if kind == "power" else POWER_LIMIT
            if not s.has(metric):
                raw = text(tree, path)
                uw = f.num(raw, path) if raw else None
                s.add(metric, None if uw is None else uw / 1e6)
            continue
        raw = text(tree, path)
        v = f.num(raw, path) if raw else None
        if v is None:
            continue
        if kind == "temp" and (sensor := _TEMP_LABELS.get(label or "edge")):
            s.add(TEMPERATURE, v / 1000.0, sensor=sensor)
        elif kind == "freq" and (clock := _FREQ_LABELS.get(label)):
            s.add(CLOCK, v, clock=clock)
        elif kind == "in" and (sensor := _VOLT_LABELS.get(label)):
            s.add(VOLTAGE, v / 1000.0, sensor=sensor)
        elif kind == "fan":
            s.add(FAN_SPEED, v, fan=label)
        elif kind == "pwm":
            fan, _, full = label.partition("/")
            top = f.num(full, f"{path}_max")
            s.add(FAN_SPEED_RATIO, v / top if top else None, fan=fan)
