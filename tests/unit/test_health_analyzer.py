"""The health analyzer: telemetry rows to aaco_gpu_health{gpu,status}, and a finding with a trace when it changes."""

from __future__ import annotations

from aaco.analyzers.health import HEALTH, REASON, HealthAnalyzer, HealthSettings
from aaco.analyzers.registry import AnalyzersConfig
from aaco.contract.schemas import EventBatch
from aaco.contract.telemetry import to_table

from .builders import assert_points_valid, kernels
from .test_health_verdict import CLEAN, sample

S = 10**9


def telemetry(ts_s: int, *samples) -> EventBatch:
    return EventBatch("telemetry", to_table(samples, ts_ns=ts_s * S, node="n1", source="smi"), "smi")


def statuses(a: HealthAnalyzer) -> dict[str, str]:
    points = a.snapshot().points()
    assert_points_valid(points)
    return {p.labels["gpu"]: p.labels["status"] for p in points if p.metric is HEALTH and p.value == 1.0}


def test_a_gpu_that_turns_unhealthy_gives_a_finding_with_the_running_jobs_trace():
    a = HealthAnalyzer()
    a.update(telemetry(1, sample("0", **CLEAN), sample("1", **CLEAN)))
    assert statuses(a) == {"0": "healthy", "1": "healthy"}
    assert a.drain_findings() == []  # healthy from the start: nothing to say
    b = kernels([2 * S], [3 * S], device=["1"], trace_id=["ab" * 16], node=["n1"])
    a.update(EventBatch("kernels", b, "test"))
    a.update(telemetry(4, sample("0", **CLEAN), sample("1", **{**CLEAN, "ecc_uncorrected": {"dram": 2}})))
    assert statuses(a) == {"0": "healthy", "1": "unhealthy"}
    (f,) = a.drain_findings()
    assert (f.subject, f.severity, f.trace_id, f.ts_ns) == ("gpu 1", "critical", "ab" * 16, 4 * S)
    assert "healthy -> unhealthy" in f.summary and "2 uncorrected ECC error(s) in dram" in f.summary
    reasons = {p.labels["reason"] for p in a.snapshot().points() if p.metric is REASON}
    assert reasons == {"ecc_uncorrected"}
    a.update(telemetry(5, sample("1", **{**CLEAN, "ecc_uncorrected": {"dram": 2}})))
    assert a.drain_findings() == []  # still unhealthy: said once


def test_every_status_is_a_series_and_the_bound_holds():
    a = HealthAnalyzer(HealthSettings(max_gpus=2))
    a.update(telemetry(1, *(sample(str(i), **CLEAN) for i in range(3))))
    points = [p for p in a.snapshot().points() if p.metric is HEALTH]
    assert {p.labels["gpu"] for p in points} == {"1", "2"}  # the least recently seen made room
    assert len(points) == 2 * 4


def test_the_thresholds_are_the_analyzers_configuration():
    cfg = AnalyzersConfig.model_validate({"health": {"max_retired_pages": 10}})
    a = HealthAnalyzer(cfg.health)
    a.update(telemetry(1, sample("0", **{**CLEAN, "retired_pages": {"single_bit": 10}})))
    assert statuses(a) == {"0": "unhealthy"}


def test_findings_queue_across_updates_until_drained():
    a = HealthAnalyzer()
    a.update(telemetry(1, sample("0", **{**CLEAN, "row_remap_pending": 1})))
    a.update(telemetry(2, sample("0", **{**CLEAN, "row_remap_failure": 1})))
    a.update(telemetry(3, sample("0", **CLEAN)))
    assert [f.severity for f in a.drain_findings()] == ["warning", "critical", "info"]


def test_a_gpu_is_its_pci_address_so_two_sources_gpu_0_stay_apart_and_xids_meet_their_gpu():
    from dataclasses import replace

    from aaco.contract.telemetry import ATTR_XID_LAST, XID_ERRORS, GpuIdentity, GpuSample, Reading

    def on(pci: str, **readings) -> GpuSample:
        s = sample("0", **readings)
        return replace(s, gpu=GpuIdentity("0", uuid=f"GPU-{pci}", pci_bus=pci))

    a = HealthAnalyzer()
    a.update(telemetry(1, on("0000:18:00.0", **CLEAN)))  # one source's GPU 0
    bad = to_table([on("0000:9b:00.0", **{**CLEAN, "ecc_uncorrected": {"dram": 1}})], ts_ns=S, node="n1", source="b")
    a.update(EventBatch("telemetry", bad, "b"))  # another source's GPU 0, elsewhere on the bus
    verdicts = {v.uuid: v.status for _, v in a.snapshot().verdicts}
    assert verdicts == {"GPU-0000:18:00.0": "healthy", "GPU-0000:9b:00.0": "unhealthy"}
    xid = GpuSample(GpuIdentity("0", pci_bus="0000:18:00.0"))
    xid.readings.append(Reading(XID_ERRORS, 1.0, ((ATTR_XID_LAST, ""), ("xid", "79"))))
    a.update(EventBatch("telemetry", to_table([xid], ts_ns=2 * S, node="n1", source="xid"), "xid"))
    verdicts = {v.uuid: (v.gpu, v.status) for _, v in a.snapshot().verdicts}
    assert verdicts == {"GPU-0000:18:00.0": ("0", "unhealthy"), "GPU-0000:9b:00.0": ("0", "unhealthy")}


def test_each_gpu_keeps_its_last_kernels_trace_in_the_order_of_its_last_kernel():
    """What reading the rows one by one gives: the last non-empty trace per (node, device), newest GPU last."""
    rows = [("n1", "0", "a"), ("n1", "1", "b"), ("n2", "0", ""), ("n1", "0", None), ("n2", "0", "c"), ("n1", "1", "d")]
    rows += [("n1", None, "e"), ("n1", "2", "f"), ("n1", "0", "g"), ("n2", "1", "")]
    b = kernels(
        list(range(len(rows))),
        node=[r[0] for r in rows],
        device=[r[1] for r in rows],
        trace_id=[r[2] for r in rows],
    )
    expected: dict[tuple[str, str], str] = {}
    for node, device, trace in rows:
        if trace and device is not None:
            expected.pop((node, device), None)
            expected[(node, device)] = trace
    a = HealthAnalyzer(HealthSettings(max_gpus=3))
    a.update(EventBatch("kernels", b, "test"))
    assert list(a._traces.items()) == list(expected.items())[-3:]
