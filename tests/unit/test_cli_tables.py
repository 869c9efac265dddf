"""Tables fit the width they are printed at: no line wider, no number or word broken across lines."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from aaco.agent.cli.tables import FitTable, wrap_text

WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.:/-[]", min_size=1, max_size=24)  # : and [ ]: no emoji, no markup
NUMBER = st.one_of(
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False).map(lambda v: f"{v:.3f}"),
    st.integers(min_value=0, max_value=10**15).map(str),
    st.just("-"),
)


def render(t: FitTable, width: int) -> list[str]:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(t)
    return console.export_text().splitlines()


@settings(max_examples=150, deadline=None)
@given(
    width=st.sampled_from([40, 60, 80, 120, 160]),
    texts=st.integers(min_value=1, max_value=3),
    numbers=st.integers(min_value=0, max_value=8),
    data=st.data(),
)
def test_every_number_and_every_word_is_whole_and_no_line_is_wider(width, texts, numbers, data):
    text_cols = [f"name {i}" for i in range(texts)]
    num_cols = [f"value {i} s" for i in range(numbers)]
    t = FitTable(*text_cols, *num_cols, right=num_cols, title="a title")
    rows = data.draw(
        st.lists(
            st.tuples(
                st.lists(st.lists(WORD, min_size=1, max_size=4).map(" ".join), min_size=texts, max_size=texts),
                st.lists(NUMBER, min_size=numbers, max_size=numbers),
            ),
            min_size=1,
            max_size=5,
        )
    )
    for text_cells, number_cells in rows:
        t.add_row(*text_cells, *number_cells)
    lines = render(t, width)
    assert all(len(line) <= width for line in lines), "\n".join(lines)
    tokens = {tok for line in lines for tok in line.split()}
    for text_cells, number_cells in rows:
        for cell in number_cells:
            assert cell in tokens, (cell, lines)
        for cell in text_cells:
            for word in cell.split():
                if len(word) < width // 2 - 2:  # a word longer than a block's value column is folded
                    assert any(word in tok for tok in tokens), (word, lines)


def test_a_table_that_fits_stays_a_table_and_one_that_does_not_turns_into_blocks():
    t = FitTable("model", "p50 ms", "p95 ms", right={"p50 ms", "p95 ms"})
    t.add_row("light_resnet50", "42.281", "44.042")
    wide = render(t, 80)
    assert wide[0].split() == ["model", "p50", "ms", "p95", "ms"] or "p50 ms" in wide[0]
    assert any(line.split() == ["light_resnet50", "42.281", "44.042"] for line in wide)
    narrow = render(t, 24)
    assert narrow[0] == "model: light_resnet50"
    assert [line.split() for line in narrow[1:]] == [["p50", "ms", "42.281"], ["p95", "ms", "44.042"]]


def test_wrap_text_breaks_between_words():
    console = Console(width=80, file=io.StringIO())
    assert wrap_text(console, "one two three four", 9) == ["one two", "three", "four"]
    assert wrap_text(console, "", 9) == [""]
