"""ONNX Runtime sessions: execution provider choice and the session options AACO uses."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from aaco.contract.errors import AacoError

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider",
}
# `auto` takes the first present: the GPU providers first (MIGraphX before the older ROCm EP on AMD).
AUTO_ORDER = ("cuda", "migraphx", "rocm", "cpu")


def resolve_provider(choice: str) -> str:
    """The short name of the provider to use for ``choice`` (``auto`` or one of ``PROVIDERS``)."""
    import onnxruntime as ort  # here, not at import: the agent loads it only when a workload runs

    available = set(ort.get_available_providers())
    if choice == "auto":
        return next(p for p in AUTO_ORDER if PROVIDERS[p] in available)
    if choice not in PROVIDERS:
        raise AacoError(f"unknown provider {choice!r}", subject="--provider", hint="use auto, " + ", ".join(PROVIDERS))
    if PROVIDERS[choice] not in available:
        hints = {
            "cuda": "pip install onnxruntime-gpu",
            "rocm": "install onnxruntime-rocm",
            "migraphx": "install onnxruntime-migraphx",
        }
        raise AacoError(
            f"execution provider {choice} is not available in this onnxruntime "
            f"(available: {', '.join(sorted(available))})",
            subject="--provider",
            hint=hints.get(choice, "choose another provider"),
        )
    return choice


def make_session(
    model: Path,
    provider: str,
    *,
    profile_prefix: Path | None = None,
    optimized_model: Path | None = None,
    intra_op_threads: int = 0,
    log_severity: int = 3,
) -> Any:
    """A session on ``provider`` (CPU as fallback for unsupported nodes), profiling when a prefix is given."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = log_severity
    so.intra_op_num_threads = intra_op_threads
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = os.fspath(profile_prefix)
    if optimized_model is not None:
        so.optimized_model_filepath = os.fspath(optimized_model)
    providers = [PROVIDERS[provider]] + ([PROVIDERS["cpu"]] if provider != "cpu" else [])
    try:
        return ort.InferenceSession(os.fspath(model), so, providers=providers)
    except Exception as exc:  # ORT raises its own pybind types (InvalidProtobuf, Fail, ...)
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AacoError(f"ONNX Runtime cannot load the model: {msg}", subject=model) from exc
