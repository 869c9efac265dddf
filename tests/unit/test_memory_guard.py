"""The memory guard: over the soft limit admissions are refused, over the hard one held data is shed."""

from __future__ import annotations

from aaco.agent.memory_guard import MEMORY_LIMITER, MIB, MemoryGuard, limits
from aaco.contract.budget import ByteBudget
from aaco.contract.memory import cgroup_memory_limit
from aaco.contract.stats import Stats


def test_the_limits_follow_the_budget_unless_set():
    assert limits(0, 0, 256) == (1536 * MIB - 1536 * MIB // 5, 1536 * MIB)
    assert limits(1000, 100, 256) == (900 * MIB, 1000 * MIB)
    assert limits(1000, 900, 256) == (500 * MIB, 1000 * MIB)  # the soft limit is never under half the hard one
    assert limits(0, 100, 256, cgroup=2000 * MIB) == (1700 * MIB, 1800 * MIB)  # nine tenths of the container's
    assert limits(500, 100, 256, cgroup=2000 * MIB) == (400 * MIB, 500 * MIB)  # a limit set wins


def test_the_cgroup_limit_is_read_from_v2_or_v1_and_unlimited_is_none(tmp_path):
    (tmp_path / "memory.max").write_text("2147483648\n")
    assert cgroup_memory_limit(str(tmp_path)) == 2 * 1024 * MIB
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_memory_limit(str(tmp_path)) is None
    (tmp_path / "memory.max").unlink()
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_memory_limit(str(tmp_path)) is None
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("1073741824\n")
    assert cgroup_memory_limit(str(tmp_path)) == 1024 * MIB


def test_refuse_over_soft_shed_over_hard_resume_under_soft():
    stats = Stats()
    budget = ByteBudget(1000, stats)
    shed: list[str] = []
    budget.add_shedder(lambda: shed.append("senders"), order=1)
    budget.add_shedder(lambda: shed.append("assembly"), order=0)
    guard = MemoryGuard(soft=100, hard=200, budget=budget, stats=stats)
    guard.check(50)
    assert budget.try_acquire("receiver", 10) and budget.refusing is None
    guard.check(150)
    assert not budget.try_acquire("receiver", 10) and budget.refusing == "memory_limit"
    assert shed == []
    budget.acquire("otlp", 10)  # the agent's own hand-overs still go through
    guard.check(250)
    assert shed == ["assembly", "senders"], "hand-overs before drops"
    guard.check(250)
    assert shed == ["assembly", "senders"] * 2
    guard.check(90)
    assert budget.try_acquire("receiver", 10) and guard.state == "ok"
    assert [stats.get(MEMORY_LIMITER, action=a) for a in ("refuse", "shed", "resume")] == [1, 2, 1]


def test_a_removed_shedder_is_not_called():
    budget = ByteBudget(1000, Stats())
    calls: list[int] = []

    def shed() -> None:
        calls.append(1)

    budget.add_shedder(shed)
    budget.remove_shedder(shed)
    budget.shed()
    assert calls == []
