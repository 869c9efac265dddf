"""Finding and loading ONNX models, with errors that say which file is wrong and how."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from aaco.contract.errors import AacoError

DEFAULT_MODEL = "light_resnet50.onnx"


def default_model_path() -> Path:
    """The default model: ResNet-50 from the ONNX model zoo, as shipped inside the ``onnx`` wheel.

    It is a real graph (weights replaced by ConstantOfShape), so it needs no download.
    """
    import onnx  # loaded only when a model is needed

    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / DEFAULT_MODEL
    if not path.is_file():
        raise AacoError(
            f"the default model {DEFAULT_MODEL} is not in this onnx install",
            subject=path,
            hint="reinstall the onnx wheel, or name a model (aaco run --model PATH, or the source's model key)",
        )
    return path


def resolve_model(path: Path | None) -> Path:
    """The model to run: ``path``, or the default model."""
    return default_model_path() if path is None else Path(path)


def model_name(path: Path) -> str:
    """The model's name in metrics: its file name without ``.onnx``."""
    return path.name.removesuffix(".onnx") or "model"


def load_model(path: Path, given_as: str = "the model path") -> Any:
    """Load and sanity-check an ONNX model, or raise ``AacoError`` naming the file, the problem and ``given_as``."""
    if not path.exists():
        raise AacoError("model file not found", subject=path, hint=f"check {given_as}")
    if path.is_dir():
        raise AacoError("is a directory, not an .onnx model file", subject=path)
    if not os.access(path, os.R_OK):
        raise AacoError("model file is not readable (permission denied)", subject=path)
    if path.stat().st_size == 0:
        raise AacoError("model file is empty", subject=path)
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(os.fspath(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise AacoError(f"not a valid ONNX model ({type(exc).__name__}: {exc})", subject=path) from exc
    if not model.graph.node:
        raise AacoError("not a valid ONNX model (its graph has no nodes)", subject=path)
    return model
