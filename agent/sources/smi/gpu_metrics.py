"""The amdgpu ``gpu_metrics`` binary (``/sys/class/drm/cardN/device/gpu_metrics``), for throttle status.

Every version starts with ``struct metrics_table_header { u16 structure_size; u8 format_revision;
u8 content_revision; }`` (little endian). The layout after it depends on the version; only the
versions whose layout is known here are decoded, the others are reported as such (not an error:
the GPU's other telemetry goes on). Known (``drivers/gpu/drm/amd/include/kgd_pp_interface.h``,
naturally aligned C structs):

- v1.3 (dGPU): ``u64 indep_throttle_status`` at byte 112 (after the v1.2 fields, three u16
  voltages and a u16 pad), structure size 120;
- v2.2 (APU): ``u64 indep_throttle_status`` at byte 120 (after ``throttle_status``, ``fan_pwm`` and
  three u16 pads), structure size 128.

``indep_throttle_status`` is ASIC independent (``SMU_THROTTLER_*_BIT``): bits 0-15 are power limits
(PPT0..3, SPL, FPPT, SPPT, SPPT_APU), 16-31 current limits (TDC_*, EDC_*, APCC), 32-47 temperature
limits (TEMP_*, VRHOT*, PROCHOT*), 48-63 others (PPM, FIT). The older ``u32 throttle_status`` is
ASIC dependent and not decoded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

HEADER: Final = struct.Struct("<HBB")
# (format_revision, content_revision) -> (offset of indep_throttle_status, minimum structure size)
INDEP_THROTTLE_OFFSET: Final[dict[tuple[int, int], tuple[int, int]]] = {
    (1, 3): (112, 120),
    (2, 2): (120, 128),
}
_GROUPS: Final = (("power", 0), ("current", 16), ("thermal", 32), ("other", 48))


@dataclass(frozen=True)
class GpuMetrics:
    """The header and, where the layout is known, the ASIC-independent throttle bits."""

    structure_size: int
    format_revision: int
    content_revision: int
    indep_throttle_status: int | None

    @property
    def version(self) -> str:
        """``v1.3`` and so on."""
        return f"v{self.format_revision}.{self.content_revision}"


def decode(data: bytes) -> GpuMetrics:
    """Read the header and the throttle bits; ``ValueError`` when the data is shorter than it says."""
    if len(data) < HEADER.size:
        raise ValueError(f"{len(data)} byte(s), shorter than the 4-byte header")
    size, fmt, content = HEADER.unpack_from(data)
    if size > len(data):
        raise ValueError(f"header says {size} bytes, file has {len(data)}")
    known = INDEP_THROTTLE_OFFSET.get((fmt, content))
    bits = None
    if known is not None:
        offset, minimum = known
        if size < minimum:
            raise ValueError(f"v{fmt}.{content} is {minimum} bytes, header says {size}")
        (bits,) = struct.unpack_from("<Q", data, offset)
    return GpuMetrics(size, fmt, content, bits)


def throttle_reasons(indep_throttle_status: int) -> dict[str, bool]:
    """Reason -> active, from the 16-bit groups of ``indep_throttle_status``."""
    return {reason: bool((indep_throttle_status >> shift) & 0xFFFF) for reason, shift in _GROUPS}


def encode_v1_3(indep_throttle_status: int) -> bytes:
    """A v1.3 table with only the header and the throttle bits set (for tests and fake trees)."""
    out = bytearray(120)
    HEADER.pack_into(out, 0, 120, 1, 3)
    struct.pack_into("<Q", out, 112, indep_throttle_status)
    return bytes(out)
