"""Inputs for a model, generated from its declared input shapes and element types.

A symbolic dimension (a name such as ``batch`` or ``N``, or an unknown one) takes ``symbolic_dim``,
default 1: one request at a time, the latency-bound case AACO is about. Floats are standard-normal,
integers uniform in [0, 10) (valid as token IDs and indices for most models), booleans random.
The generator is seeded so two runs see the same data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aaco.contract.errors import AacoError

ORT_TYPES: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}


def concrete_shape(shape: list[Any], symbolic_dim: int) -> tuple[int, ...]:
    """The shape with every symbolic or unknown dimension replaced by ``symbolic_dim``."""
    return tuple(d if isinstance(d, int) and d > 0 else symbolic_dim for d in shape)


def make_inputs(inputs: list[Any], symbolic_dim: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for ``session.get_inputs()``: one array per input, by declared shape and type."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for arg in inputs:
        dtype = ORT_TYPES.get(arg.type)
        if dtype is None:
            raise AacoError(
                f"input {arg.name!r} has type {arg.type}, which AACO cannot generate",
                hint="supported: " + ", ".join(sorted(ORT_TYPES)),
            )
        shape = concrete_shape(list(arg.shape or []), symbolic_dim)
        if np.issubdtype(dtype, np.floating):
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype is np.bool_:
            feeds[arg.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
        else:
            feeds[arg.name] = rng.integers(0, 10, size=shape).astype(dtype)
    return feeds
