"""Tables that fit the terminal: whole numbers and names, never a cell cut or broken mid-word.

``FitTable`` is a rich renderable that decides at print time, from the width it is given: when every
column fits with its numbers on one line and its text wrapped only between words, a plain table
(columns sized here, not by rich, which would fold "171.285" into "171.2" / "85" when short of room);
otherwise one block per row, each cell on its own line under its column's name, which fits any width
that the longest word fits.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.text import Text

GAP = 2  # columns between two columns (collapsed padding, no rules)


def _longest_word(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def wrap_text(console: Console, text: str, width: int) -> list[str]:
    """``text`` as lines of at most ``width`` columns, broken between words (a word longer than a line is folded)."""
    from rich.text import Text

    lines = Text(text).wrap(console, max(1, width), overflow="fold")
    return [line.plain.rstrip() for line in lines] or [""]


class FitTable:
    """Rows of text cells under named columns; ``right`` columns are numbers (right-justified, never wrapped)."""

    def __init__(self, *columns: str, right: Collection[str] = (), title: str | None = None) -> None:
        self.columns = list(columns)
        self.right = frozenset(right)
        self.title = title
        self.rows: list[list[str]] = []
        self.styles: list[str | None] = []

    def add_row(self, *cells: str, style: str | None = None) -> None:
        """One row, a cell per column (text; ``-`` for nothing), in a rich ``style`` if given."""
        self.rows.append(list(cells))
        self.styles.append(style)

    def widths(self, width: int) -> list[int] | None:
        """Each column's width to fit ``width`` without breaking a number or a word; None if it cannot."""
        low: list[int] = []
        high: list[int] = []
        for i, name in enumerate(self.columns):
            cells = [row[i] for row in self.rows]
            if name in self.right:  # a number: its whole width; the header may wrap between words
                w = max([len(c) for c in cells] + [_longest_word(name)])
                low.append(w)
                high.append(max(w, len(name)))
            else:
                low.append(max([_longest_word(c) for c in cells] + [_longest_word(name), 1]))
                high.append(max([len(c) for c in cells] + [len(name)]))
        room = width - GAP * (len(self.columns) - 1)
        if sum(low) > room:
            return None
        out = list(low)
        spare = room - sum(low)
        for i in sorted(range(len(out)), key=lambda i: high[i] - low[i]):  # the nearest to whole first
            grow = min(spare, high[i] - out[i])
            out[i] += grow
            spare -= grow
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """A table when it fits ``options.max_width``, else a block per row."""
        widths = self.widths(options.max_width)
        if widths is None:
            yield from self._blocks(console, options.max_width)
        else:
            yield self._table(widths)

    def _table(self, widths: list[int]) -> object:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        out = Table(
            title=Text(self.title) if self.title else None,
            title_justify="left",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            collapse_padding=True,
        )
        for name, w in zip(self.columns, widths, strict=True):
            numeric = name in self.right
            # every cell of a numeric column fits its width whole; only its header may wrap, between words
            out.add_column(Text(name), justify="right" if numeric else "left", width=w, overflow="fold")
        for row, style in zip(self.rows, self.styles, strict=True):
            out.add_row(*(Text(cell) for cell in row), style=style)  # data, never markup or :emoji: codes
        return out

    def _blocks(self, console: Console, width: int) -> Iterator[Text]:
        """Each row as its first cell, then ``column  value`` lines, values wrapped between words."""
        from rich.text import Text

        if self.title:
            yield Text(self.title, style="italic")
        key = min(max(len(c) for c in self.columns[1:]) if len(self.columns) > 1 else 0, width // 2)
        for n, row in enumerate(self.rows):
            if n:
                yield Text("")
            for line in wrap_text(console, f"{self.columns[0]}: {row[0]}", width):
                yield Text(line, style="bold")
            for name, cell in zip(self.columns[1:], row[1:], strict=True):
                names = wrap_text(console, name, key)
                values = wrap_text(console, cell, max(1, width - key - GAP))
                for i in range(max(len(names), len(values))):
                    left = names[i] if i < len(names) else ""
                    right = values[i] if i < len(values) else ""
                    yield Text(f"{left:<{key}}{' ' * GAP}{right}".rstrip())

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> object:
        """As wide as the table when it fits, else the width given."""
        from rich.measure import Measurement

        widths = self.widths(options.max_width)
        if widths is None:
            return Measurement(1, options.max_width)
        total = sum(widths) + GAP * (len(widths) - 1)
        return Measurement(total, total)
