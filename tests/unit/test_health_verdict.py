"""The health verdict (contract/health.py): each rule, its threshold and its near miss; rates; XID ages; bounds."""

from __future__ import annotations

import pytest

from aaco.contract import telemetry as m
from aaco.contract.health import HealthJudge, HealthThresholds, XidSeen, overall
from aaco.contract.telemetry import GpuIdentity, GpuSample

S = 10**9


def sample(index: str = "0", **readings: float | dict[str, float]) -> GpuSample:
    """``ecc_uncorrected={"dram": 2}``, ``row_remap_failure=1``, ... (names of contract.telemetry, lower case)."""
    s = GpuSample(GpuIdentity(index, uuid=f"GPU-{index}"))
    for name, value in readings.items():
        metric = getattr(m, name.upper())
        if isinstance(value, dict):
            key = m.SERIES_ATTRIBUTE[metric].replace(".", "_")
            for attr, v in value.items():
                s.add(metric, v, **{key: attr})
        else:
            s.add(metric, value)
    return s


CLEAN = {
    "ecc_uncorrected": {"dram": 0, "sram": 0},
    "ecc_corrected": {"dram": 0, "sram": 0},
    "retired_pages": {"single_bit": 0, "double_bit": 0},
    "retired_pages_pending": 0,
    "row_remap_pending": 0,
    "row_remap_failure": 0,
    "pcie_replays": 0,
}


def judge_of(*samples: tuple[int, GpuSample], t: HealthThresholds | None = None) -> HealthJudge:
    j = HealthJudge(t)
    for ts, s in samples:
        j.observe(ts, s)
    return j


def verdict(**readings) -> tuple[str, list[str]]:
    v = judge_of((0, sample(**{**CLEAN, **readings}))).verdict("0", 0)
    return v.status, [r.code for r in v.reasons]


def test_clean_readings_are_healthy_and_a_gpu_never_read_unknown():
    assert verdict() == ("healthy", [])
    j = judge_of((0, sample("0", power=300.0)))  # no ECC, no remapper (a consumer board): nothing wrong
    assert j.verdict("0", 0).status == "healthy"
    assert j.verdict("1", 0).status == "unknown"
    assert overall([]) == "unknown" and overall(j.verdicts(0)) == "healthy"


@pytest.mark.parametrize(
    ("readings", "status", "code"),
    [
        ({"ecc_uncorrected": {"dram": 2, "sram": 0}}, "unhealthy", "ecc_uncorrected"),
        ({"ecc_uncorrected": {"umc": 1}}, "unhealthy", "ecc_uncorrected"),
        ({"row_remap_failure": 1}, "unhealthy", "row_remap_failure"),
        ({"row_remap_pending": 1}, "warning", "row_remap_pending"),
        ({"retired_pages": {"single_bit": 40, "double_bit": 23}}, "unhealthy", "retired_pages_limit"),
        ({"retired_pages": {"single_bit": 15}, "retired_pages_pending": 1}, "unhealthy", "retired_pages_pending"),
        ({"retired_pages": {"single_bit": 14}, "retired_pages_pending": 1}, "warning", "retired_pages_pending"),
        ({"throttle": {"thermal": 1}}, "warning", "thermal_slowdown"),
    ],
)
def test_each_rule(readings, status, code):
    assert verdict(**readings) == (status, [code])


@pytest.mark.parametrize(
    "readings",
    [
        {"retired_pages": {"single_bit": 40, "double_bit": 22}},  # 62 of 63
        {"retired_pages": {"single_bit": 60}},  # no pending retirement: below the hard limit is fine
        {"throttle": {"thermal": 0, "power": 1}},  # power capping is not a health problem
        {"ecc_corrected": {"dram": 5000}},  # corrected errors count only as a rate
    ],
)
def test_near_misses_stay_healthy(readings):
    assert verdict(**readings) == ("healthy", [])


def test_the_worst_reason_wins_and_comes_first():
    status, codes = verdict(row_remap_pending=1, ecc_uncorrected={"dram": 1})
    assert status == "unhealthy" and codes == ["ecc_uncorrected", "row_remap_pending"]


def test_pcie_replays_rising_is_a_rate_over_at_least_a_minute():
    def replays(*points: tuple[int, float]) -> tuple[str, list[str]]:
        j = judge_of(*((ts * S, sample(**{**CLEAN, "pcie_replays": n})) for ts, n in points))
        v = j.verdict("0", points[-1][0] * S)
        return v.status, [r.code for r in v.reasons]

    assert replays((0, 100), (60, 109)) == ("warning", ["pcie_replays_rising"])  # 9 a minute > 8
    assert replays((0, 100), (60, 108)) == ("healthy", [])  # 8 a minute: the limit itself
    assert replays((0, 100), (30, 200)) == ("healthy", [])  # half a minute: too short to say
    assert replays((0, 5000), (60, 0), (120, 9)) == ("warning", ["pcie_replays_rising"])  # a reset, then 9 a minute
    assert replays((0, 5000), (60, 0), (90, 9)) == ("healthy", [])  # since the reset: 30 s only


def test_corrected_errors_rising_fast():
    j = judge_of((0, sample(**CLEAN)), (3600 * S, sample(**{**CLEAN, "ecc_corrected": {"dram": 80, "sram": 21}})))
    assert [r.code for r in j.verdict("0", 3600 * S).reasons] == ["ecc_corrected_rising"]
    t = HealthThresholds(corrected_per_hour=101)
    j = judge_of((0, sample(**CLEAN)), (3600 * S, sample(**{**CLEAN, "ecc_corrected": {"dram": 80, "sram": 21}})), t=t)
    assert j.verdict("0", 3600 * S).status == "healthy"


def test_xids_by_severity_and_age():
    j = judge_of((0, sample(**CLEAN)))
    j.xid("0", XidSeen(79, "critical", "GPU has fallen off the bus", 1, 1000 * S))
    j.xid("0", XidSeen(13, "warning", "Graphics Engine Exception", 4, None))
    j.xid("0", XidSeen(63, "info", "GPU memory remapping event", 2, 1000 * S))
    v = j.verdict("0", 2000 * S)
    assert v.status == "unhealthy" and [r.code for r in v.reasons] == ["xid_79", "xid_13"]
    later = j.verdict("0", 1000 * S + 86_401 * S)  # a day later the XID 79 is old; the 13 has no time
    assert later.status == "warning" and [r.code for r in later.reasons] == ["xid_13"]


def test_a_lost_gpu_is_unhealthy():
    """The smi source's tracker reports a GPU that stopped answering as aaco.gpu.up 0, its only reading."""
    j = judge_of((0, sample(**CLEAN)), (S, sample(up=0.0)))
    assert [(r.code, r.status) for r in j.verdict("0", S).reasons] == [("gpu_lost", "unhealthy")]


def test_bounded():
    j = HealthJudge(max_gpus=2)
    for i in range(4):
        j.observe(0, sample(str(i), **CLEAN))
    assert [v.gpu for v in j.verdicts(0)] == ["0", "1"] and j.dropped == 2
    j.forget("0")
    j.observe(0, sample("3", **CLEAN))
    assert [v.gpu for v in j.verdicts(0)] == ["1", "3"]


def test_fast_sampling_still_measures_rates_over_a_minute_in_bounded_memory():
    """Sampled every 0.1 s for 2 minutes (replays at 9 a minute): a rate, from a few dozen points."""
    j = HealthJudge()
    for i in range(1200):
        j.observe(i * S // 10, sample(**{**CLEAN, "pcie_replays": i * 9 // 600}))
    assert [r.code for r in j.verdict("0", 120 * S).reasons] == ["pcie_replays_rising"]
    assert len(j._gpus["0"].counters) <= 32
