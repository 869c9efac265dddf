"""``aaco fleet`` over a lake on a real S3 store (SeaweedFS on loopback) answers as over the same lake on disk.

Three nodes replay different real samples into one local lake, which is copied as it is into a
bucket with pyarrow; every answer over ``s3://`` must equal the answer over the directory. A missing
bucket and refused credentials are one error line each (exit 2). That a lake survives its store
stopping and starting again is tests/integration/test_lake_s3.py's outage test.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from .helpers import run_aaco
from .test_fleet import NODES, replay

pytestmark = pytest.mark.integration


def copy_to_bucket(local: Path, seaweed) -> str:
    """The lake directory ``local`` copied as it is into a fresh bucket: its ``s3://`` URL."""
    bucket = f"fleet-{secrets.token_hex(6)}"
    seaweed.make_bucket(bucket)
    pafs.copy_files(
        str(local),
        f"{bucket}/lake",
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=seaweed.filesystem(),
    )
    return f"s3://{bucket}/lake"


def lake_in_bucket(aaco_bin: str, samples: Path, seaweed, root: Path, nodes: dict[str, str]) -> tuple[Path, str]:
    """Each node replays its sample into one lake under ``root``, copied as it is into a fresh bucket.

    Returns the directory and the bucket's ``s3://`` URL.
    """
    local = root / "lake"
    for node, sample in nodes.items():
        replay(aaco_bin, samples / sample, local, node)
    return local, copy_to_bucket(local, seaweed)


@pytest.fixture(scope="module")
def lakes(fleet_lakes: tuple[Path, dict[str, Path]], seaweed) -> tuple[Path, str]:
    """The session's three-node lake (tests/integration/conftest.py) on disk and in a bucket: (directory, URL)."""
    local = fleet_lakes[0]
    return local, copy_to_bucket(local, seaweed)


def answer(aaco_bin: str, env: dict[str, str], *args: str) -> object:
    proc = run_aaco(aaco_bin, "fleet", *args, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("command", ["summary", "models", "nodes"])
def test_the_s3_lake_answers_as_the_local_one(aaco_bin, seaweed, lakes, command):
    local, url = lakes
    remote = answer(aaco_bin, seaweed.env, command, "--lake", url)
    assert remote == answer(aaco_bin, {}, command, "--lake", str(local))
    if command == "summary":
        assert sorted(n["node"] for n in remote["nodes"]) == sorted(NODES)
        assert all(n["kernels"] > 0 for n in remote["nodes"])


def one_error(aaco_bin: str, env: dict[str, str], url: str) -> str:
    proc = run_aaco(aaco_bin, "fleet", "summary", "--lake", url, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


def test_a_missing_bucket_and_refused_credentials_are_one_clear_error(aaco_bin, seaweed, lakes):
    _, url = lakes
    missing = f"s3://nobucket-{secrets.token_hex(4)}/lake"
    assert f"{missing}: no such bucket" in one_error(aaco_bin, seaweed.env, missing)
    wrong = {**seaweed.env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    said = one_error(aaco_bin, wrong, url)
    assert f"{url}: the store refused the credentials" in said and "AWS_SECRET_ACCESS_KEY" in said
    empty = f"{url.rsplit('/', 1)[0]}/nothing-here"
    assert "not a lake" in one_error(aaco_bin, seaweed.env, empty)
