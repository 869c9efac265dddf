"""Fixtures several integration files share (built once per session: each costs real replays)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .test_fleet import NODES, replay


@pytest.fixture(scope="session")
def fleet_lakes(tmp_path_factory: pytest.TempPathFactory, aaco_bin: str, samples: Path) -> tuple[Path, dict[str, Path]]:
    """Three nodes replayed into one lake, and each node alone into its own: (fleet lake, {node: lake}).

    The shared lake's replays run one after another; the nodes' own lakes (other directories) beside them.
    """
    root = tmp_path_factory.mktemp("fleet")
    alone = {node: root / f"alone-{node}" for node in NODES}

    def shared() -> None:
        for node, sample in NODES.items():
            replay(aaco_bin, samples / sample, root / "lake", node)

    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = [pool.submit(shared)]
        jobs += [pool.submit(replay, aaco_bin, samples / sample, alone[node], node) for node, sample in NODES.items()]
        for job in jobs:
            job.result()
    return root / "lake", alone
