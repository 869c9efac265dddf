"""NVML's return codes the NVML readers act on (``nvmlReturn_t``), and the error a lost GPU raises.

One place for ``nvml``, ``nvml_gpm`` and ``nvml_mig``: the values are nvidia-ml-py's ``NVML_ERROR_*``.
"""

from __future__ import annotations

from typing import Final

NVML_ERROR_INVALID_ARGUMENT: Final = 2
NVML_ERROR_NOT_SUPPORTED: Final = 3
NVML_ERROR_NOT_FOUND: Final = 6
NVML_ERROR_FUNCTION_NOT_FOUND: Final = 13
NVML_ERROR_GPU_IS_LOST: Final = 15
NVML_ERROR_IN_USE: Final = 19
NVML_ERROR_ARGUMENT_VERSION_MISMATCH: Final = 25


class GpuLostError(Exception):
    """NVML says the GPU is lost."""
