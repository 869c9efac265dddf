"""ByteBudget: bytes held under one limit, by holder."""

from __future__ import annotations

import threading

from aaco.contract.budget import BUDGET_HELD, BUDGET_LIMIT, ByteBudget
from aaco.contract.stats import Stats


def test_admission_refuses_what_would_pass_the_limit_and_acquire_never_refuses():
    stats = Stats()
    budget = ByteBudget(100, stats)
    assert stats.get(BUDGET_LIMIT) == 100
    assert budget.try_acquire("receiver", 60)
    assert not budget.try_acquire("receiver", 41)  # 101 > 100: refused, nothing taken
    assert budget.held == 60 and not budget.over()
    assert budget.try_acquire("receiver", 40)  # exactly the limit is allowed
    budget.acquire("otlp", 10)  # the agent's own data: taken whatever is held
    assert budget.held == 110 and budget.over()
    assert budget.held_by("receiver") == 100 and budget.held_by("otlp") == 10
    assert stats.get(BUDGET_HELD, holder="otlp") == 10


def test_release_and_move_never_go_below_zero_per_holder():
    budget = ByteBudget(100, Stats())
    budget.acquire("assembly", 30)
    budget.release("assembly", 50)  # more than it holds: only what it holds
    assert budget.held_by("assembly") == 0 and budget.held == 0
    budget.acquire("receiver", 20)
    budget.move("receiver", "assembly", 20)
    assert budget.held_by("receiver") == 0 and budget.held_by("assembly") == 20 and budget.held == 20
    budget.release("otlp", 5)  # a holder that holds nothing
    assert budget.held == 20 and budget.held_by("otlp") == 0


def test_concurrent_holders_add_up_exactly():
    budget = ByteBudget(10**12, Stats())

    def churn(holder: str) -> None:
        for _ in range(2000):
            budget.acquire(holder, 7)
            budget.release(holder, 3)

    threads = [threading.Thread(target=churn, args=(f"h{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert budget.held == 4 * 2000 * 4
    assert all(budget.held_by(f"h{i}") == 2000 * 4 for i in range(4))
