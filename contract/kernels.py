"""Kernel families: what kind of work a kernel name stands for (GEMM, convolution, attention, ...).

The rules are data (``FAMILY_RULES``): an ordered list of (family, patterns), first match wins,
matched case-insensitively against the full (demangled) kernel name. Order matters: convolutions
come before GEMMs (cuDNN/MIOpen implicit-GEMM convolutions), and library kernels no rule names fall
back to their library's family last. Pooling counts as a (windowed) reduction. Copies and memsets
are known from the event kind. ``tests/unit/test_families.py`` holds every kernel name of the real
samples with its expected family. Names repeat heavily in a trace, so classification works on the unique names
of a batch (``families``) and caches the answers (bounded).

The patterns come from the libraries that emit the kernels: rocBLAS/Tensile (``Cijk_``), hipBLASLt,
CUTLASS, cuBLAS (``gemm``, ``sm80_xmma``), MIOpen/cuDNN (``conv``, ``winograd``, ``implicit``),
flash and memory-efficient attention, ATen's native kernels (``elementwise_kernel``,
``reduce_kernel``, ``layer_norm``, ``softmax``), NCCL/RCCL.
"""

from __future__ import annotations

import re
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FAMILY_RULES: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("communication", (r"nccl", r"rccl", r"all_?reduce", r"all_?gather", r"reduce_?scatter", r"broadcast_?kernel")),
    ("attention", (r"flash", r"fmha", r"attention", r"attn", r"sdpa", r"mha_")),
    # Convolution before GEMM: cuDNN/MIOpen run convolutions as implicit GEMMs
    # (``sm80_xmma_fprop_implicit_gemm_...``), which are convolutions to the user.
    (
        "convolution",
        (
            r"conv",
            r"winograd",
            r"implicit_?gemm",
            r"fprop",
            r"dgrad",
            r"wgrad",
            r"im2col",
            r"col2im",
            r"scudnn",
            r"fft2d_",
        ),
    ),
    (
        "gemm",
        (
            r"gemm",
            r"cijk_",
            r"matmul",
            r"mfma",
            r"hipblaslt",
            r"cutlass",
            r"xmma",
            r"wmma",
            r"cublas",
            r"rocblas",
            r"tensile",
            r"addmm",
            r"\bbmm\b",
            r"linear",
            r"dot_kernel",
        ),
    ),
    # Pooling is a windowed reduction: memory-bound like the other reductions, so it is counted with them.
    (
        "normalization",
        (
            r"norm",
            r"softmax",
            r"reduce",
            r"reduction",
            r"welford",
            r"mean",
            r"argmax",
            r"topk",
            r"pool",
        ),
    ),
    (
        "elementwise",
        (
            r"elementwise",
            r"vectorized",
            r"unrolled",
            r"pointwise",
            r"multi_tensor",
            r"\brelu",
            r"gelu",
            r"silu",
            r"sigmoid",
            r"tanh",
            r"clamp",
            r"\badd\b",
            r"addition",
            r"subtract",
            r"multiply",
            r"divide",
            r"\bmul\b",
            r"\bsub\b",
            r"\bdiv\b",
            r"\bsum\b",  # ONNX Sum adds its inputs elementwise (reductions are named reduce)
            r"reorder",  # ONNX Runtime layout reorders
            r"\bcopy",
            r"fill",
            r"cast",
            r"transpose",
            r"concat",
            r"\bclip",
            r"distribution",
            r"uniform",
            r"dropout",
            r"index",
            r"gather",
            r"scatter",
            r"\bflatten",
            r"reshape",
        ),
    ),
    # Library kernels not named above (cuDNN/MIOpen layout transforms, FFT convolution helpers,
    # offset tables) serve convolutions.
    ("convolution", (r"cudnn", r"miopen")),
)
KIND_FAMILIES: Final = {"memcpy": "memcpy", "memset": "memset"}
FAMILIES: Final = (*dict.fromkeys(f for f, _ in FAMILY_RULES), "memcpy", "memset", "other")

_FAMILY_INDEX: Final = {f: i for i, f in enumerate(FAMILIES)}
_FAMILY_NAMES: Final = np.array(FAMILIES, dtype=object)
_OTHER: Final = _FAMILY_INDEX["other"]
_COMPILED = tuple((family, re.compile("|".join(pats), re.IGNORECASE)) for family, pats in FAMILY_RULES)
_cache: dict[str, str] = {}
_CACHE_LIMIT = 100_000


def family_of(name: str | None, kind: str = "kernel") -> str:
    """The family of one kernel."""
    if kind in KIND_FAMILIES:
        return KIND_FAMILIES[kind]
    if not name:
        return "other"
    hit = _cache.get(name)
    if hit is not None:
        return hit
    fam = next((family for family, rx in _COMPILED if rx.search(name)), "other")
    if len(_cache) < _CACHE_LIMIT:
        _cache[name] = fam
    return fam


def family_codes(names: pa.Array | pa.ChunkedArray, kinds: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Families of a column of names as int16 indices into ``FAMILIES``, classifying each unique name once."""
    if isinstance(names, pa.ChunkedArray):
        names = names.combine_chunks()
    if isinstance(kinds, pa.ChunkedArray):
        kinds = kinds.combine_chunks()
    encoded = pc.dictionary_encode(names.fill_null(""))
    by_name = np.array([_FAMILY_INDEX[family_of(n)] for n in encoded.dictionary.to_pylist()] or [_OTHER], np.int16)
    out = by_name[encoded.indices.to_numpy(zero_copy_only=False)]
    # kinds are few: each distinct one is looked up once (comparing an object array per kind is ~20x slower)
    by_kind = pc.dictionary_encode(kinds.fill_null("kernel"))
    kind_names = by_kind.dictionary.to_pylist()
    fixed = np.array([_FAMILY_INDEX.get(KIND_FAMILIES.get(k, ""), -1) for k in kind_names], np.int16)
    if fixed.size and (fixed >= 0).any():
        per_row = fixed[by_kind.indices.to_numpy(zero_copy_only=False)]
        out = np.where(per_row >= 0, per_row, out)
    return out


def families(names: pa.Array | pa.ChunkedArray, kinds: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Families of a column of names (object array), classifying each unique name once."""
    return _FAMILY_NAMES[family_codes(names, kinds)]
