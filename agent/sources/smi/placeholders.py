"""Zeros that stand for "no reading": the tools print 0 where a GPU has no sensor or cannot see it.

A reading of 0 is left out (absent, as if the tool had printed "N/A") when it cannot be a
measurement; zeros that can be real are kept. Every backend applies the same rules to every GPU
it reads (docs/metrics.md, "Absent readings"):

- any GPU: a maximum clock of 0 Hz (no clock domain tops out at 0), and the current clock of a
  domain whose maximum read 0; a temperature of exactly 0 C (a powered die or memory never sits
  at 0 C; the tools print 0 for a sensor the GPU does not have: AMD's MI300 edge sensor, which
  amd-smi itself shows as N/A, a vGPU guest's core sensor); a power draw or power cap of 0 W (a
  board that answers draws power); an energy counter at 0 J (it counts from the driver's start;
  amd-smi prints 0.0 J for a GPU without the accumulator); a PCIe link of generation 0 or 0 lanes;
- a vGPU guest (a virtual machine given a slice of a GPU: nvidia-smi ``virtualization_mode`` VGPU,
  NVML ``NVML_GPU_VIRTUALIZATION_MODE_VGPU``), whose driver cannot see the board's sensors and
  prints 0 for them (GRID P4-1Q: 0 C, 0 MHz for every clock and maximum): every zero of a clock,
  voltage and fan speed as well.

Kept: 0 utilisation, 0 bytes of memory, 0 errors, throttle flags, a P-state or DPM level of 0 (the
fastest NVIDIA state, the slowest AMD level), a fan at 0 % or 0 rpm on a physical GPU (fans that
stop at idle), a current clock of 0 Hz below a real maximum (a gated domain: RDNA's GFXOFF reads
sclk 0 MHz) and a voltage of 0 V on a physical GPU (that gated domain's rail). A vGPU guest's
utilisation, memory and P-state are its own and kept.
"""

from __future__ import annotations

from typing import Final

from aaco.contract.telemetry import (
    CLOCK,
    CLOCK_MAX,
    ENERGY,
    FAN_SPEED,
    FAN_SPEED_RATIO,
    PCIE_LINK_GENERATION,
    PCIE_LINK_WIDTH,
    POWER,
    POWER_LIMIT,
    TEMPERATURE,
    VOLTAGE,
    GpuSample,
)

# metrics whose 0 is never a reading
NEVER_ZERO: Final = frozenset(
    {CLOCK_MAX, TEMPERATURE, POWER, POWER_LIMIT, ENERGY, PCIE_LINK_GENERATION, PCIE_LINK_WIDTH}
)
# metrics whose 0 is no reading on a vGPU guest
VGPU_NEVER_ZERO: Final = NEVER_ZERO | {CLOCK, VOLTAGE, FAN_SPEED, FAN_SPEED_RATIO}


def drop_placeholders(s: GpuSample, vgpu: bool = False) -> None:
    """Leave out the readings of ``s`` whose 0 stands for "no reading" (see the module's rules)."""
    zero_max = {dict(r.attrs).get("clock") for r in s.readings if r.metric == CLOCK_MAX and r.value == 0}
    never = VGPU_NEVER_ZERO if vgpu else NEVER_ZERO
    s.readings = [
        r
        for r in s.readings
        if r.value != 0
        or (r.metric not in never and not (r.metric == CLOCK and dict(r.attrs).get("clock") in zero_max))
    ]
