"""The ledger: committed offsets only cover ranges whose every piece is durable, contiguously."""

from __future__ import annotations

from aaco.contract.ledger import Ledger


def test_offset_advances_only_over_complete_contiguous_ranges():
    led = Ledger()
    a = led.register("f", 0, 10, {"inode": 1})
    b = led.register("f", 10, 20)
    c = led.register("f", 20, 30)
    for r in (a, b, c):
        r.add_pieces(2)
        r.seal()
    # b and c done, a not: nothing commits
    led.apply([b, b, c, c])
    assert led.committed("f") == (0, {"inode": 1})
    assert led.pending("f") == 3
    # a done: all three fold
    led.apply([a, a])
    assert led.committed("f")[0] == 30
    assert led.pending("f") == 0


def test_unsealed_range_blocks():
    led = Ledger()
    r = led.register("f", 0, 5)
    r.add_pieces(1)
    led.apply([r])
    assert led.committed("f")[0] == 0
    r.seal()
    led.apply([])
    assert led.committed("f")[0] == 5


def test_failed_range_never_commits():
    led = Ledger()
    r = led.register("f", 0, 5)
    r2 = led.register("f", 5, 9)
    for x in (r, r2):
        x.add_pieces(1)
        x.seal()
    r.fail()
    led.apply([r, r2])
    assert led.committed("f")[0] == 0


def test_preview_does_not_change_state():
    led = Ledger()
    r = led.register("f", 0, 7, {"digest": "x"})
    r.add_pieces(1)
    r.seal()
    assert led.preview([r]) == {"f": {"offset": 7, "meta": {"digest": "x"}}}
    assert led.committed("f")[0] == 0
    assert led.preview([]) == {}


def test_empty_sealed_range_commits_without_pieces():
    led = Ledger()
    r = led.register("f", 0, 100)
    r.seal()
    assert led.preview([]) == {"f": {"offset": 100, "meta": {}}}


def test_load_reset_forget():
    led = Ledger()
    led.load({"f": {"offset": 42, "meta": {"inode": 9}}})
    assert led.committed("f") == (42, {"inode": 9})
    r = led.register("f", 42, 50)
    r.seal()
    led.apply([])
    assert led.committed("f")[0] == 50
    led.reset("f", {"inode": 10})
    assert led.committed("f") == (0, {"inode": 10})
    led.forget("f")
    assert led.committed("f") is None
    assert led.snapshot() == {}


def test_apply_up_to_a_preview_folds_no_range_that_completed_after_it():
    """What a commit wrote from its preview is what the ledger holds; a range sealed since waits for the next."""
    led = Ledger()
    a = led.register("f", 0, 10)
    a.add_pieces(1)
    a.seal()
    preview = led.preview([a])
    late = led.register("g", 0, 5)  # no rows: complete once sealed, after the preview
    late.seal()
    led.apply([a], upto=preview)
    assert led.committed("f")[0] == 10 and led.committed("g")[0] == 0 and led.foldable()
    led.apply([], upto=led.preview([]))
    assert led.committed("g")[0] == 5
