"""The serving_phases analyzer: kernels marked prefill or decode by their process's request windows, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from aaco.analyzers.base import AgentHints
from aaco.analyzers.registry import ANALYZERS
from aaco.analyzers.serving_phases import (
    FAMILY_SECONDS,
    GPU_SECONDS,
    ServingPhasesAnalyzer,
    ServingPhasesSettings,
    containing,
    create,
)
from aaco.contract.schemas import EventBatch, conform

GEMM = "volta_sgemm_128x64_nn"
FLASH = "flash_fwd_kernel"


def kernels(items: list[tuple]) -> EventBatch:
    """Rows of (pid, launch_ns or None, start_ns, duration_ns, name)."""
    cols: dict[str, list] = {
        "start_ns": [s for _, _, s, _, _ in items],
        "end_ns": [s + d for _, _, s, d, _ in items],
        "node": ["n"] * len(items),
        "pid": [p for p, _, _, _, _ in items],
        "tid": [1] * len(items),
        "device": ["0"] * len(items),
        "stream": [0] * len(items),
        "name": [name for *_, name in items],
        "kind": ["kernel"] * len(items),
        "correlation_id": list(range(len(items))),
        "source": ["test"] * len(items),
        "launch_start_ns": [launch for _, launch, _, _, _ in items],
    }
    return EventBatch("kernels", conform("kernels", cols), "test")


def requests(items: list[dict]) -> EventBatch:
    base = {"node": "n", "pid": 7, "trace_id": "", "span_id": "00" * 8, "source": "otlp", "namespace": "ns", "pod": "p"}
    full = [{**base, **r} for r in items]
    keys = {k for r in full for k in r}
    return EventBatch("requests", conform("requests", {k: [r.get(k) for r in full] for k in keys}), "otlp")


# A: prefill [1100, 1300] (queue + prefill), decode [1300, 1800] (decode latency).
A = {"model": "m", "start_ns": 1000, "end_ns": 1900, "queue_s": 100e-9, "prefill_s": 200e-9, "decode_s": 500e-9}
# B, overlapping A: prefill [1500, 1600] (queue, then up to TTFT), decode [1600, 2500] (up to its end).
B = {"model": "m2", "start_ns": 1200, "end_ns": 2500, "queue_s": 300e-9, "ttft_s": 400e-9}
KERNELS_1 = [
    (7, 1150, 1160, 10, GEMM),  # A prefill
    (7, 1400, 1410, 20, GEMM),  # A decode only
    (7, None, 1250, 5, GEMM),  # no launch time: placed by its start, A prefill
]
KERNELS_2 = [
    (7, 1550, 1560, 40, FLASH),  # A decode and B prefill: prefill (B's)
    (7, 2000, 2010, 80, GEMM),  # B decode
    (7, 3000, 3010, 160, GEMM),  # outside every window
    (8, 1150, 1160, 320, GEMM),  # another process
]
EXPECTED = {"m": (15, 20), "m2": (40, 80)}


def phases(result) -> dict[str, tuple[int, int]]:
    """GPU ns in (prefill, decode) per model."""
    return {m: (round(g.prefill_s * 1e9), round(g.decode_s * 1e9)) for (m, _ns, _pod), g in result.groups.items()}


def test_kernels_before_requests_marked_prefill_over_decode_once_each():
    a = ServingPhasesAnalyzer()
    a.update(kernels(KERNELS_1))
    a.update(kernels(KERNELS_2))
    a.update(requests([A, B]))
    r = a.snapshot()
    assert phases(r) == EXPECTED
    m2 = r.groups[("m2", "ns", "p")]
    assert m2.prefill_share == pytest.approx(40 / 120)
    assert m2.families["prefill"]["attention"].time_s == pytest.approx(40e-9)
    assert m2.families["prefill"]["attention"].share == 1.0
    assert m2.families["decode"] == {"gemm": m2.families["decode"]["gemm"]}
    assert m2.requests == 1
    # The same requests again (a retried export): every kernel in them is already counted.
    a.update(requests([A, B]))
    assert phases(a.snapshot()) == EXPECTED
    assert a.snapshot().groups[("m", "ns", "p")].requests == 2


def test_kernels_after_requests_are_marked_by_the_kept_windows():
    a = ServingPhasesAnalyzer()
    a.update(requests([A, B]))
    a.update(kernels(KERNELS_1 + KERNELS_2))
    assert phases(a.snapshot()) == EXPECTED


def test_a_request_arriving_first_marks_its_decode_before_a_later_prefill():
    """Attribution is final when a kernel is first marked: A ends first and takes the shared kernel as decode."""
    a = ServingPhasesAnalyzer()
    a.update(kernels(KERNELS_1 + KERNELS_2))
    a.update(requests([A]))
    a.update(requests([B]))
    assert phases(a.snapshot()) == {"m": (15, 60), "m2": (0, 80)}


def test_points_and_dict():
    a = ServingPhasesAnalyzer()
    a.update(kernels(KERNELS_1 + KERNELS_2))
    a.update(requests([A, B, {**A, "pid": None}, {**A, "queue_s": None, "prefill_s": None, "ttft_s": None}]))
    r = a.snapshot()
    got = {(p.metric.prom_name, tuple(sorted(p.labels.items()))): p.value for p in r.points()}
    labels = (("model", "m2"), ("namespace", "ns"), ("phase", "prefill"), ("pod", "p"))
    assert got[(GPU_SECONDS.prom_name, labels)] == pytest.approx(40e-9)
    attention = (("family", "attention"), *labels)
    assert got[(FAMILY_SECONDS.prom_name, attention)] == pytest.approx(40e-9)
    fam = {k: v for k, v in got.items() if k[0] == FAMILY_SECONDS.prom_name}
    assert sum(fam.values()) == pytest.approx(155e-9)
    assert r.skipped == {"no_pid": 1, "no_phases": 1}
    d = r.to_dict()
    assert [g["model"] for g in d["groups"]] == ["m", "m2"]
    assert d["groups"][1]["families"]["prefill"]["attention"]["time_s"] == pytest.approx(40e-9)


class Clock:
    """The analyzer's wall clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_ring_bounded_by_count_and_age_counted():
    a = ServingPhasesAnalyzer(max_kernels=3, max_age_s=1e-6, clock=Clock())  # 1000 ns
    a.update(kernels([(7, 1100 + i, 1100 + i, 1, GEMM) for i in range(5)]))
    assert a.unmatched == {"ring_full": 2}
    a.update(kernels([(7, 2103, 2103, 1, GEMM)]))  # 1102 is now more than 1000 ns behind it
    assert a.unmatched == {"ring_full": 2, "aged_out": 1}
    a.update(requests([{**A, "prefill_s": 2000e-9, "decode_s": 0.0}]))  # prefill [1100, 3100]
    assert phases(a.snapshot()) == {"m": (3, 0)}


def test_processes_and_groups_bounded():
    a = ServingPhasesAnalyzer(max_groups=1, max_processes=1)
    a.update(kernels(KERNELS_1 + KERNELS_2))  # pid 8 is over the process bound
    assert a.unmatched == {"process_limit": 1}
    a.update(requests([A, B]))
    assert phases(a.snapshot()) == {"m": (15, 60)}
    assert a.skipped == {"group_limit": 1}


def test_containing_picks_a_window_holding_each_time():
    lo = np.array([10, 0, 30, 5], np.int64)
    hi = np.array([20, 12, 40, 4], np.int64)  # the last is empty (hi < lo)
    t = np.array([-1, 0, 11, 15, 21, 30, 40, 41, 5], np.int64)
    assert containing(t, lo, hi).tolist() == [-1, 1, 0, 0, -1, 2, 2, -1, 1]


def test_registered_with_settings():
    assert "serving_phases" in ANALYZERS
    an = create(ServingPhasesSettings(max_kernels=9), AgentHints(), 4)
    assert isinstance(an, ServingPhasesAnalyzer) and an._max_kernels == 9 and an._max_groups == 4


def test_kernel_bound_is_shared_the_largest_ring_gives_way():
    a = ServingPhasesAnalyzer(max_kernels=4)
    a.update(kernels([(7, 1100 + i, 1100 + i, 1, GEMM) for i in range(4)] + [(8, 1150, 1150, 100, GEMM)]))
    assert a.unmatched == {"ring_full": 1}  # pid 7's oldest; pid 8's one kernel stays
    a.update(requests([{**A, "pid": 8}, A]))
    assert phases(a.snapshot()) == {"m": (103, 0)}


def test_processes_left_with_nothing_free_their_slot():
    clock = Clock()
    a = ServingPhasesAnalyzer(max_processes=1, max_age_s=1e-6, clock=clock)  # 1000 ns, 1 µs of wall time
    a.update(kernels([(7, 1150, 1150, 10, GEMM), (7, 5000, 5000, 20, GEMM)]))  # 1150 ages out behind 5000
    a.update(kernels([(8, 5000, 5000, 20, GEMM)]))  # over the process bound
    assert a.unmatched == {"aged_out": 1, "process_limit": 1}
    clock.now = 1.0  # pid 7 had no batch for longer than max_age_s: its slot and its kernel go
    a.update(kernels([(8, 5001, 5001, 30, GEMM)]))  # pid 8 takes the slot
    assert a.unmatched == {"aged_out": 2, "process_limit": 1}
    a.update(requests([{**A, "pid": 8, "start_ns": 4000, "end_ns": 6000, "queue_s": 0.0, "prefill_s": 2000e-9}]))
    assert phases(a.snapshot()) == {"m": (30, 0)}


def test_each_process_ages_by_its_own_clock():
    """A replayed capture with later timestamps beside a live process does not age the live one's kernels."""
    clock = Clock()
    a = ServingPhasesAnalyzer(max_age_s=1e-6, clock=clock)  # 1000 ns
    a.update(kernels([(7, 1150, 1150, 10, GEMM), (7, 1400, 1410, 20, GEMM)]))  # live, waiting for its request
    a.update(kernels([(9, 10**15 + i, 10**15 + i, 1, GEMM) for i in range(3)]))  # a replay, far ahead
    assert a.unmatched == {}
    a.update(requests([A]))  # within max_age_s of wall time: both processes stay
    assert phases(a.snapshot()) == {"m": (10, 20)}
    clock.now = 2.0  # both idle: the replay's kernels leave counted, pid 7's slot (its windows) with them
    a.update(kernels([(7, 1500, 1500, 40, GEMM)]))
    assert a.unmatched == {"aged_out": 3}
    assert set(a._rings) == {("n", 7)} and a._rings[("n", 7)].size == 1
    assert phases(a.snapshot()) == {"m": (10, 20)}


def test_no_kernel_is_held_when_no_request_span_can_arrive():
    """With the receiver off (hints.request_spans false) kernels cost nothing: none is held or counted."""
    off = create(ServingPhasesSettings(), AgentHints(request_spans=False), 4)
    on = create(ServingPhasesSettings(), AgentHints(), 4)
    for an in (off, on):
        an.update(kernels([(7, 10, 100, 7, GEMM)]))
    assert sum(r.size for r in off._rings.values()) == 0
    assert sum(r.size for r in on._rings.values()) == 1
