"""Progress piped: plain lines for work that lasts, nothing for work that does not."""

from __future__ import annotations

import io

from rich.console import Console

from aaco.agent.cli import common
from aaco.agent.cli.progress import PlainProgress


def lines(monkeypatch, every_s: float, steps: int) -> list[str]:
    buffer = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=buffer, width=160))
    progress = PlainProgress(every_s=every_s)
    with progress:
        progress.start("replay", steps)
        for _ in range(steps):
            progress.advance("replay")
        progress.finish("replay")
    return buffer.getvalue().splitlines()


def test_work_that_lasts_gets_a_line_per_interval_and_one_at_the_end(monkeypatch):
    said = lines(monkeypatch, every_s=0.0, steps=3)
    assert [s.split(" (")[0] for s in said[:3]] == ["replay: 1/3", "replay: 2/3", "replay: 3/3"]
    assert said[3].startswith("replay: 3/3, done in ")


def test_quick_work_says_nothing(monkeypatch):
    assert lines(monkeypatch, every_s=60.0, steps=3) == []
