"""Fixtures several integration files share (built once per session: each costs real replays)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_fleet import NODES, replay


@pytest.fixture(scope="session")
def fleet_lakes(tmp_path_factory: pytest.TempPathFactory, aaco_bin: str, samples: Path) -> tuple[Path, dict[str, Path]]:
    """Three nodes replayed into one lake, and each node alone into its own: (fleet lake, {node: lake})."""
    root = tmp_path_factory.mktemp("fleet")
    alone = {}
    for node, sample in NODES.items():
        replay(aaco_bin, samples / sample, root / "lake", node)
        alone[node] = root / f"alone-{node}"
        replay(aaco_bin, samples / sample, alone[node], node)
    return root / "lake", alone
