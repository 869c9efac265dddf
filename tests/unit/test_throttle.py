"""Throttling: episodes per GPU from telemetry (vendor status, clocks under a power cap, temperature), and
the latency impact of episodes on iterations (ratio of medians with a bootstrap interval)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from aaco.agent.sources.smi.capture import read_capture
from aaco.analyzers.stats import bootstrap_medians
from aaco.analyzers.throttle import ThrottleAnalyzer
from aaco.analyzers.throttle_settings import ThrottleSettings
from aaco.contract.schemas import ATTRS, EventBatch, conform
from aaco.contract.telemetry import to_table

from .builders import assert_points_valid, item, iterations, kernels

S = 1_000_000_000
T0 = 1_700_000_000 * S


def tele(rows: list[tuple]) -> EventBatch:
    """Telemetry rows: (t seconds after T0, gpu, metric, value[, {attribute: value}])."""
    cols: dict[str, list] = {k: [] for k in ("ts_ns", "node", "device", "metric", "value", "unit", "attributes")}
    for r in rows:
        t, gpu, metric, value = r[:4]
        attrs = r[4] if len(r) > 4 else {}
        cols["ts_ns"].append(T0 + int(t * S))
        cols["node"].append("node-a")
        cols["device"].append(str(gpu))
        cols["metric"].append(metric)
        cols["value"].append(float(value))
        cols["unit"].append("1")
        cols["attributes"].append(list(attrs.items()))
    table = pa.table(
        {**{k: v for k, v in cols.items() if k != "attributes"}, "attributes": pa.array(cols["attributes"], ATTRS)}
    )
    return EventBatch("telemetry", conform("telemetry", table), "smi")


def vendor(t: float, gpu: int, reason: str, on: bool) -> tuple:
    return (t, gpu, "aaco.gpu.throttle.active", 1.0 if on else 0.0, {"reason": reason})


def loaded(t: float, gpu: int, util: float = 0.9) -> tuple:
    return (t, gpu, "hw.gpu.utilization", util)


def points(result) -> dict:
    return {(p.metric.prom_name, tuple(sorted(p.labels.items()))): p.value for p in result.points()}


def gauge(result, name: str, **labels: str) -> float:
    pts = points(result)
    hits = [v for (n, lb), v in pts.items() if n == name and all(dict(lb).get(k) == w for k, w in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


# --- episodes ----------------------------------------------------------------------------------


def test_vendor_status_episodes_open_and_close_exactly_as_the_samples_say():
    a = ThrottleAnalyzer()
    states = [0, 0, 1, 1, 1, 0, 0, 1, 1, 0]
    a.update(tele([r for t, on in enumerate(states, start=1) for r in (vendor(t, 0, "power", on), loaded(t, 0))]))
    res = a.snapshot()
    (g,) = res.to_dict()["gpus"]
    assert g["throttled"] == [] and g["open"] == []
    eps = [(e["start_ns"], e["end_ns"], e["reason"], e["basis"], e["samples"]) for e in g["recent"]]
    assert eps == [
        (T0 + 3 * S, T0 + 6 * S, "power", ["vendor"], 3),
        (T0 + 8 * S, T0 + 10 * S, "power", ["vendor"], 2),
    ]
    assert g["episodes_total"]["power"] == 2 and g["throttled_seconds"]["power"] == pytest.approx(5.0)
    assert gauge(res, "aaco_throttle_episodes", gpu="0", reason="power") == 2.0
    assert gauge(res, "aaco_throttle_seconds", gpu="0", reason="power") == pytest.approx(5.0)
    assert gauge(res, "aaco_throttle_active", gpu="0", reason="power") == 0.0
    findings = a.drain_findings()
    assert [(f.evidence["state"], f.ts_ns) for f in findings] == [
        ("open", T0 + 3 * S),
        ("closed", T0 + 6 * S),
        ("open", T0 + 8 * S),
        ("closed", T0 + 10 * S),
    ]
    assert all(f.subject == "gpu 0" and f.analyzer == "throttle" and f.severity == "warning" for f in findings)
    assert findings[1].evidence["duration_s"] == 3.0 and "after 3 s" in findings[1].summary
    assert_points_valid(res.points())


def test_an_open_episode_is_active_and_split_batches_continue_it():
    a = ThrottleAnalyzer()
    a.update(tele([vendor(1, 0, "thermal", True), loaded(1, 0)]))
    a.update(tele([vendor(2, 0, "thermal", True), loaded(2, 0)]))
    res = a.snapshot()
    assert gauge(res, "aaco_throttle_active", gpu="0", reason="thermal") == 1.0
    assert gauge(res, "aaco_throttle_active", gpu="0", reason="power") == 0.0
    (ep,) = res.to_dict()["gpus"][0]["open"]
    assert ep["start_ns"] == T0 + S and ep["end_ns"] is None and ep["samples"] == 2
    assert [f.evidence["state"] for f in a.drain_findings()] == ["open"]


def test_samples_sent_one_batch_each_are_folded_like_one_batch_of_them_all():
    def sample(t: int, gpu: int) -> list[tuple]:
        hot = t in (3, 4, 5) and gpu == 1
        return [
            vendor(t, gpu, "power", t in (2, 3)),
            vendor(t, gpu, "thermal", False),
            loaded(t, gpu, 0.5 + 0.05 * t),
            (t, gpu, "hw.temperature", 104.0 if hot else 60.0, {"sensor": "junction"}),
            (t, gpu, "hw.temperature", 50.0, {"sensor": "edge"}),
        ]

    times = range(1, 9)
    each, whole = ThrottleAnalyzer(), ThrottleAnalyzer()
    for t in times:  # the same rows every second: the grouping of the first is kept
        each.update(tele([r for gpu in (0, 1) for r in sample(t, gpu)]))
    each.update(tele([r for gpu in (0, 1) for r in sample(4, gpu)]))  # late: same rows, older
    each.update(tele(sample(9, 1)))  # GPU 0 went missing: other rows, grouped again
    whole.update(tele([r for t in times for gpu in (0, 1) for r in sample(t, gpu)]))
    whole.update(tele([r for gpu in (0, 1) for r in sample(4, gpu)]))
    whole.update(tele(sample(9, 1)))
    assert each.snapshot().to_dict() == whole.snapshot().to_dict()
    assert [f.summary for f in each.drain_findings()] == [f.summary for f in whole.drain_findings()]
    doc = each.snapshot().to_dict()
    assert doc["dropped"]["late_telemetry"] == 10
    assert [e["reason"] for g in doc["gpus"] for e in g["recent"]] == ["power", "power", "thermal"]


def clocks(t: float, gpu: int, mhz: float, max_mhz: float = 1700.0, domain: str = "graphics") -> list[tuple]:
    return [
        (t, gpu, "aaco.gpu.clock.frequency", mhz * 1e6, {"clock": domain}),
        (t, gpu, "aaco.gpu.clock.max", max_mhz * 1e6, {"clock": domain}),
    ]


def power_sample(t: float, gpu: int, watts: float, mhz: float, util: float = 0.95, **kw: str) -> list[tuple]:
    return [(t, gpu, "hw.power", watts), loaded(t, gpu, util), *clocks(t, gpu, mhz, **kw)]


def test_power_throttling_inferred_from_clock_below_max_under_load_at_the_cap():
    a = ThrottleAnalyzer(ThrottleSettings(power_cap_w=300.0))
    rows = (
        power_sample(1, 0, 200, 1700)  # below the cap, full clock
        + power_sample(2, 0, 296, 1100)  # at the cap (within 5 %), clock at 65 %, loaded: critical
        + power_sample(3, 0, 299, 1400)
        + power_sample(4, 0, 299, 1700)  # at the cap but full clock: not throttled
        + power_sample(5, 0, 298, 1200, util=0.1)  # clock down but idle: not throttling
        + power_sample(6, 0, 298, 1200, domain="sm")  # NVIDIA: the sm domain stands in for graphics
    )
    a.update(tele(rows))
    g = a.snapshot().to_dict()["gpus"][0]
    (ep,) = g["recent"]
    assert (ep["start_ns"], ep["end_ns"], ep["basis"]) == (T0 + 2 * S, T0 + 4 * S, ["clock_power"])
    assert ep["min_clock_ratio"] == pytest.approx(1100 / 1700) and ep["max_power_w"] == 299.0
    assert ep["severity"] == "critical"
    assert g["throttled"] == ["power"] and g["open"][0]["start_ns"] == T0 + 6 * S


def test_power_inference_needs_a_cap_and_takes_the_gpus_own_limit_first():
    rows = power_sample(1, 0, 296, 1100)
    a = ThrottleAnalyzer()
    a.update(tele(rows))
    assert a.snapshot().to_dict()["gpus"][0]["throttled"] == []  # no cap known: only the vendor's word
    b = ThrottleAnalyzer(ThrottleSettings(power_cap_w=1000.0))
    b.update(tele([*rows, (1, 0, "aaco.gpu.power.limit", 300.0)]))
    g = b.snapshot().to_dict()["gpus"][0]
    assert g["throttled"] == ["power"] and g["power_cap_w"] == 300.0


def test_thermal_episodes_near_the_limit_and_severity():
    a = ThrottleAnalyzer()  # junction limit 105 C, margin 5 C
    temp = lambda t, c: (t, 0, "hw.temperature", c, {"sensor": "junction"})  # noqa: E731
    a.update(tele([temp(1, 95), loaded(1, 0), temp(2, 100), loaded(2, 0), temp(3, 106), loaded(3, 0)]))
    a.update(tele([temp(4, 99.5), loaded(4, 0)]))
    (ep,) = a.snapshot().to_dict()["gpus"][0]["recent"]
    assert (ep["start_ns"], ep["end_ns"], ep["reason"], ep["basis"]) == (
        T0 + 2 * S,
        T0 + 4 * S,
        "thermal",
        ["temperature"],
    )
    assert ep["peak_temperature_c"] == 106.0 and ep["severity"] == "critical"  # reached its limit under load
    b = ThrottleAnalyzer(ThrottleSettings(temperature_limits_c={"junction": 90.0}))
    b.update(tele([temp(1, 86), loaded(1, 0)]))
    assert b.snapshot().to_dict()["gpus"][0]["throttled"] == ["thermal"]
    c = ThrottleAnalyzer()
    c.update(tele([temp(1, 86), (1, 0, "aaco.gpu.temperature.limit", 88.0, {"sensor": "junction"})]))
    assert c.snapshot().to_dict()["gpus"][0]["throttled"] == ["thermal"]


def test_an_idle_gpu_throttled_is_info_and_unknown_load_a_warning():
    a = ThrottleAnalyzer()
    a.update(tele([vendor(1, 0, "other", True), loaded(1, 0, util=0.0), vendor(1, 1, "other", True)]))
    sev = {f.subject: f.severity for f in a.drain_findings()}
    assert sev == {"gpu 0": "info", "gpu 1": "warning"}


def test_a_silent_gpu_ends_its_episodes_at_its_last_sample():
    a = ThrottleAnalyzer(ThrottleSettings(stale_s=30))
    a.update(tele([vendor(1, 0, "power", True), vendor(2, 0, "power", True), vendor(2, 1, "power", False)]))
    a.update(tele([vendor(20, 1, "power", False)]))
    assert a.snapshot().to_dict()["gpus"][0]["throttled"] == ["power"]  # 18 s of silence: not yet
    a.update(tele([vendor(40, 1, "power", False)]))
    g0 = a.snapshot().to_dict()["gpus"][0]
    assert g0["throttled"] == []
    (ep,) = g0["recent"]
    assert ep["end_ns"] == T0 + 2 * S and ep["ended_by"] == "silence"


def test_late_telemetry_is_dropped_and_counted():
    a = ThrottleAnalyzer()
    a.update(tele([vendor(5, 0, "power", False)]))
    a.update(tele([vendor(3, 0, "power", True)]))
    res = a.snapshot()
    assert res.to_dict()["gpus"][0]["episodes_total"]["power"] == 0
    assert gauge(res, "aaco_throttle_dropped", reason="late_telemetry") == 1.0


def test_bounded_devices():
    a = ThrottleAnalyzer(ThrottleSettings(max_devices=2))
    a.update(tele([vendor(1, g, "power", True) for g in range(4)]))
    res = a.snapshot()
    assert len(res.to_dict()["gpus"]) == 2 and res.to_dict()["dropped"]["max_devices"] == 2


def smi_batch(path: Path, ts: int) -> EventBatch:
    table = to_table(read_capture(path).gpus, ts_ns=ts, node="node-a", source="smi")
    return EventBatch("telemetry", conform("telemetry", table), "smi")


def test_real_amd_smi_sample_is_throttled_without_a_reason_at_idle(samples: Path):
    a = ThrottleAnalyzer()
    a.update(smi_batch(samples / "amd-smi" / "amd-smi-metric.json", T0))  # power.throttle_status THROTTLED
    res = a.snapshot()
    (g,) = res.to_dict()["gpus"]
    assert g["gpu"] == "0" and g["throttled"] == ["other"]
    (ep,) = g["open"]
    assert ep["basis"] == ["vendor"] and ep["start_ns"] == T0
    assert ep["severity"] == "info"  # gfx_activity 0 %: idle at 60 MHz, nothing lost
    assert ep["min_clock_ratio"] == pytest.approx(60 / 1760) and ep["max_power_w"] == 34.0
    assert gauge(res, "aaco_throttle_active", gpu="0", reason="other") == 1.0
    assert gauge(res, "aaco_throttle_active", gpu="0", reason="power") == 0.0
    (f,) = a.drain_findings()
    assert f.summary == "gpu 0: other throttling started" and f.severity == "info"
    assert_points_valid(res.points())


def test_real_nvidia_smi_sample_is_not_throttled(samples: Path):
    a = ThrottleAnalyzer()
    a.update(smi_batch(samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz", T0))  # clocks_event_reasons: Not Active
    res = a.snapshot()
    assert res.to_dict()["gpus"] and all(g["throttled"] == [] for g in res.to_dict()["gpus"])
    assert a.drain_findings() == []
    assert_points_valid(res.points())


# --- latency impact ----------------------------------------------------------------------------


def throttled_timeline(a: ThrottleAnalyzer, seconds: int, episodes: list[tuple[int, int]], gpu: int = 0) -> None:
    rows = []
    for t in range(seconds + 1):
        on = any(s <= t < e for s, e in episodes)
        rows += [vendor(t, gpu, "power", on), loaded(t, gpu)]
    a.update(tele(rows))


def iteration_spans(seconds: int, episodes: list[tuple[int, int]], slow: float, seed: int = 0) -> tuple[list, int, int]:
    """An iteration every 250 ms: 10 ms (+-0.5) outside episodes, ``slow`` x inside. Returns spans, inside, outside."""
    rng = np.random.default_rng(seed)
    spans, inside = [], 0
    for k in range(4 * seconds):
        start = T0 + k * S // 4 + 1
        ovl = any(T0 + s * S < start + 10_000_000 and start < T0 + e * S for s, e in episodes)
        lat = int((0.010 * (slow if ovl else 1.0) + 0.0005 * rng.standard_normal()) * S)
        spans.append((start, start + lat))
        inside += ovl
    return spans, inside, len(spans) - inside


def test_latency_impact_ratio_with_a_confidence_interval_and_a_finding():
    episodes = [(50, 100), (150, 170)]
    a = ThrottleAnalyzer()
    throttled_timeline(a, 200, episodes)
    spans, n_in, n_out = iteration_spans(199, episodes, slow=1.3)
    a.update(item("iterations", iterations(spans)))
    res = a.snapshot()
    imp = res.to_dict()["impact"]["m"]
    assert imp["iterations"] == {"inside": n_in, "outside": n_out, "unknown": 0}
    assert n_in == 4 * 70 and n_out == 4 * 129  # 199 s of iterations; episodes 50-100 s and 150-170 s
    assert imp["ratio"] == pytest.approx(1.3, rel=0.03)
    lo, hi = imp["ci"]
    assert 1.2 < lo < imp["ratio"] < hi < 1.4 and imp["significant"] and imp["gpus_from"] == "node"
    assert gauge(res, "aaco_throttle_latency_impact_ratio", model="m") == imp["ratio"]
    assert gauge(res, "aaco_throttle_latency_impact_ci_low_ratio", model="m") == lo
    assert gauge(res, "aaco_throttle_iterations", model="m", state="inside") == n_in
    assert res.latency_impact("node-a", "m") == pytest.approx(imp["ratio"] - 1.0)  # as the bottleneck rules read it
    assert res.latency_impact("node-a", "other") is None
    impact_findings = [f for f in a.drain_findings() if f.subject == "m"]
    assert len(impact_findings) == 1  # once, when it became significant
    f = impact_findings[0]
    assert f.severity == "warning" and f.evidence["gpus"] == ["0"] and f.evidence["ratio"] > 1.2
    assert_points_valid(res.points())


def test_no_impact_when_latency_does_not_change():
    episodes = [(20, 60)]
    a = ThrottleAnalyzer()
    throttled_timeline(a, 100, episodes)
    spans, _, _ = iteration_spans(99, episodes, slow=1.0)
    a.update(item("iterations", iterations(spans)))
    imp = a.snapshot().to_dict()["impact"]["m"]
    assert imp["ci"][0] < 1.0 < imp["ci"][1] and not imp["significant"]
    assert a.snapshot().latency_impact("node-a", "m") == 0.0  # measured: no impact
    assert not [f for f in a.drain_findings() if f.subject == "m"]


def test_the_estimate_is_reproducible():
    def run() -> dict:
        a = ThrottleAnalyzer(ThrottleSettings(reservoir=64))  # reservoirs overflow: sampling is seeded too
        throttled_timeline(a, 100, [(20, 60)])
        a.update(item("iterations", iterations(iteration_spans(99, [(20, 60)], slow=1.2)[0])))
        return a.snapshot().to_dict()["impact"]

    assert run() == run()


def test_iterations_map_to_the_gpus_of_their_kernels():
    a = ThrottleAnalyzer()
    throttled_timeline(a, 100, [(0, 100)], gpu=0)  # gpu 0 throttled all along
    throttled_timeline(a, 100, [], gpu=1)
    spans, _, _ = iteration_spans(99, [], slow=1.0)
    b = kernels([T0 + S], model=["m"], device=["1"])  # model m runs on gpu 1
    a.update(item("kernels", b))
    a.update(item("iterations", iterations(spans)))
    imp = a.snapshot().to_dict()["impact"]["m"]
    assert imp["gpus_from"] == "kernels"
    assert imp["iterations"] == {"inside": 0, "outside": len(spans), "unknown": 0}


def test_iterations_wait_for_telemetry_and_older_ones_are_unknown():
    a = ThrottleAnalyzer()
    a.update(tele([vendor(10, 0, "power", False)]))
    early = (T0 + 5 * S, T0 + 6 * S)  # before the first sample: cannot tell
    later = (T0 + 11 * S, T0 + 12 * S)  # after the last sample: waits
    a.update(item("iterations", iterations([early, later])))
    imp = a.snapshot().to_dict()["impact"]["m"]
    assert imp["iterations"] == {"inside": 0, "outside": 0, "unknown": 1}
    assert a.snapshot().to_dict()["settings"]["pending_iterations"] == 1
    a.update(tele([vendor(13, 0, "power", True)]))  # covers its end: scored outside (the episode starts at 13 s)
    imp = a.snapshot().to_dict()["impact"]["m"]
    assert imp["iterations"] == {"inside": 0, "outside": 1, "unknown": 1}


def test_pending_iterations_are_bounded():
    a = ThrottleAnalyzer(ThrottleSettings(max_pending=3))
    a.update(tele([vendor(1, 0, "power", False)]))
    a.update(item("iterations", iterations([(T0 + (10 + k) * S, T0 + (10 + k) * S + 1000) for k in range(5)])))
    assert a.snapshot().to_dict()["dropped"]["pending_overflow"] == 2


def test_iterations_without_any_telemetry_are_unknown():
    a = ThrottleAnalyzer()
    a.update(item("iterations", iterations([(T0, T0 + 1000), (T0 + 2000, T0 + 3000)])))
    imp = a.snapshot().to_dict()["impact"]["m"]
    assert imp["iterations"] == {"inside": 0, "outside": 0, "unknown": 2} and imp["ratio"] is None
    assert_points_valid(a.snapshot().points())


@pytest.mark.parametrize("n", [301, 300])  # odd and even sizes (the even median averages two order statistics)
def test_bootstrap_medians_match_resampling(n):
    rng = np.random.default_rng(9)
    sample = np.sort(rng.lognormal(0.0, 0.5, n))
    exact = bootstrap_medians(sample, 20_000, np.random.default_rng(1))
    brute = np.median(sample[np.random.default_rng(2).integers(0, n, (20_000, n))], axis=1)
    for q in (2.5, 25, 50, 75, 97.5):
        assert np.percentile(exact, q) == pytest.approx(np.percentile(brute, q), rel=0.01)
    if n % 2:
        assert set(np.unique(exact)) <= set(sample)  # an odd resample's median is one of the values
