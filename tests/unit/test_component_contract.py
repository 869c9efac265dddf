"""Every registered component through its lifecycle, as the OpenTelemetry Collector's componenttest does.

The cases are built from the registries themselves: a source, analyzer, exporter or receiver that is
registered without a configuration below fails ``test_every_registered_component_has_a_case``, so
a new component is covered the moment it is added. Sources run on real samples (and the embedded
ONNX model), and what they publish is what the analyzers and exporters are then given.

- sources: run, publish, stop within the deadline, stop again, stop before they start;
- analyzers: fold real batches of every kind they take, snapshot (JSON and metric points), and a
  later update leaves an earlier snapshot unchanged;
- exporters and receivers: start, work, shutdown within the deadline, shutdown twice, shutdown before
  start (contract.component).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from aaco.agent.pipeline.bus import Bus
from aaco.agent.receivers.base import ReceiverContext
from aaco.agent.receivers.registry import RECEIVERS
from aaco.agent.sources import SOURCES
from aaco.agent.sources.base import Journal, SourceContext
from aaco.analyzers.base import DerivedAnalyzer
from aaco.analyzers.registry import ANALYZERS, AgentHints
from aaco.contract.budget import ByteBudget
from aaco.contract.component import Component, Flushing
from aaco.contract.schemas import EventBatch, empty
from aaco.contract.snapshot import AnalysisSnapshot
from aaco.contract.stats import Stats
from aaco.exporters.context import ExporterContext
from aaco.exporters.otlp_forward import forwarder
from aaco.exporters.otlp_settings import OtlpConfig
from aaco.exporters.perfetto import PerfettoExporter
from aaco.exporters.registry import EXPORTERS
from tests.support.processes import sleepers

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "examples" / "data"
KINETO = SAMPLES / "kineto" / "a100_alexnet_trace.json.gz"
DEADLINE_S = 3.0
SLACK_S = 2.0  # the machines are shared: the bound checked is the deadline plus this, never a speed
# force_flush's own timeout: only its answer (a bool) is checked; against an endpoint nobody serves the
# flush cannot succeed and waits all of it, so it is shorter than the shutdown deadline.
FLUSH_S = 0.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_endpoint() -> str:
    """An OTLP endpoint nobody listens on: exporters must still keep their deadline."""
    return f"http://127.0.0.1:{free_port()}"


# -- sources -----------------------------------------------------------------------------------------

SOURCE_CASES: dict[str, Callable[[Path], dict[str, Any]]] = {
    "capture": lambda tmp: {  # a profiler that copies a real rocprofv3 capture where it would write one
        "command": f"cp {SAMPLES / 'rocprofv3' / 'kernel_trace.csv'} {{out}}/{{pid}}_kernel_trace.csv",
        "out_dir": str(tmp / "captures"),
        "interval_s": 0.2,
        "min_gap_s": 0,
        "targets": [SLEEPER[0]],
    },
    "counters": lambda tmp: {"paths": [str(ROOT / "tests" / "data" / "rocprof-compute" / "vcopy" / "MI200")]},
    "gpu_processes": lambda tmp: {  # a real pmon capture of five processes sharing a GPU
        "backend": "file",
        "file": str(ROOT / "tests" / "data" / "gpu-processes" / "pmon-datarhei-process_1.txt"),
        "interval_s": 0.2,
        "kubelet_socket": None,
        "kubelet_logs": None,
    },
    "llm_requests": lambda tmp: {
        "provider": "cpu",
        "requests_per_cycle": 2,
        "max_tokens": 2,
        "endpoint": closed_endpoint(),
    },
    "ort": lambda tmp: {"provider": "cpu", "iterations": 2, "warmup": 0, "cycles": 1},
    "replay": lambda tmp: {"paths": [str(KINETO)]},
    "sched": lambda tmp: {"backend": "proc", "interval_s": 0.2, "pids": [os.getpid()], "include_self": True},
    "smi": lambda tmp: {
        "backend": "file",
        "file": str(SAMPLES / "amd-smi" / "amd-smi-metric.json"),
        "interval_s": 0.2,
        "kubelet_socket": None,
    },
    "trace_dir": lambda tmp: {"path": str(tmp / "traces"), "poll_interval_s": 0.1, "settle_s": 0.1},
    "xid": lambda tmp: {  # a real kernel log with an XID 79, followed
        "path": str(ROOT / "tests" / "data" / "kernel-log" / "gpud-sxid-readme-xid79.log"),
        "interval_s": 0.2,
        "sysfs_root": str(tmp),
    },
}
SLEEPER: list[int] = []  # the capture source's target: a process of this test's own


@pytest.fixture(scope="module", autouse=True)
def sleeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with sleepers(tmp_path_factory.mktemp("sleeper"), 1) as pids:
        SLEEPER[:] = pids
        yield


def make_source(kind: str, tmp: Path) -> tuple[Any, SourceContext, Bus]:
    (tmp / "traces").mkdir(exist_ok=True)
    shutil.copy(KINETO, tmp / "traces" / KINETO.name)
    reg = SOURCES[kind]
    config = reg.config.model_validate({"type": kind, **SOURCE_CASES[kind](tmp)})
    stats = Stats()
    bus = Bus(stats, 4096, 10_000_000)
    return reg.factory(config, kind), SourceContext("contract-node", stats, bus, Journal(stats)), bus


def drain(bus: Bus) -> list[EventBatch]:
    out = []
    while (item := bus.get(0.0)) is not None:
        out.append(item)
    return out


def run_source(kind: str, tmp: Path) -> dict[str, Any]:
    """Start, let it work, stop within the deadline; what it published and how long stopping took."""
    source, ctx, bus = make_source(kind, tmp)
    thread = threading.Thread(target=source.run, args=(ctx,), daemon=True)
    thread.start()
    published: list[EventBatch] = []
    until = time.monotonic() + 60
    while time.monotonic() < until and thread.is_alive() and not published:
        published += drain(bus)
        time.sleep(0.05)
    t0 = time.monotonic()
    ctx.stop.set()
    thread.join(DEADLINE_S + SLACK_S)
    stopped_in = time.monotonic() - t0
    alive = thread.is_alive()
    ctx.stop.set()  # stopping again is harmless
    published += drain(bus)
    return {"published": published, "stopped_in": stopped_in, "alive": alive}


@pytest.fixture(scope="module")
def source_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {kind: run_source(kind, tmp_path_factory.mktemp(kind)) for kind in SOURCES.kinds()}


def received_requests(tmp: Path) -> list[EventBatch]:
    """``requests`` rows come from the OTLP receiver: vLLM-shaped spans made by the OpenTelemetry SDK, read by it."""
    spans = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"k8s.pod.name": "vllm-0"}))
    provider.add_span_processor(SimpleSpanProcessor(spans))
    for i in range(3):
        with provider.get_tracer("vllm").start_as_current_span("llm_request", kind=SpanKind.SERVER) as span:
            span.set_attribute("gen_ai.response.model", "contract-llm")
            span.set_attribute("gen_ai.usage.completion_tokens", 5 + i)
            span.set_attribute("gen_ai.latency.time_to_first_token", 0.1)
            span.set_attribute("gen_ai.latency.e2e", 0.5)
    stats = Stats()
    bus = Bus(stats)
    reg = RECEIVERS["otlp"]
    config = reg.config.model_validate(RECEIVER_CASES["otlp"](tmp))
    receiver = reg.factory(config, ReceiverContext(stats=stats, traces=Sink(), bus=bus, node="contract-node"))
    receiver.handle("traces", encode_spans(spans.get_finished_spans()).SerializeToString())  # type: ignore[union-attr]
    got = [bus.get(0.0) for _ in range(bus.depth)]
    return [b for b in got if b is not None]


@pytest.fixture(scope="module")
def batches(
    source_runs: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[EventBatch]]:
    """Real batches by kind, as the sources published them (and the receiver read them)."""
    by_kind: dict[str, list[EventBatch]] = defaultdict(list)
    for run in source_runs.values():
        for b in run["published"]:
            by_kind[b.kind].append(b)
    by_kind["requests"] += received_requests(tmp_path_factory.mktemp("requests"))
    return by_kind


@pytest.mark.parametrize("kind", SOURCES.kinds())
def test_source_works_and_stops_within_its_deadline(kind: str, source_runs: dict[str, dict[str, Any]]) -> None:
    run = source_runs[kind]
    assert not run["alive"], f"source {kind} did not return within {DEADLINE_S + SLACK_S} s of stop"
    assert run["stopped_in"] <= DEADLINE_S + SLACK_S
    assert sum(b.rows for b in run["published"]) > 0, f"source {kind} published nothing"


@pytest.mark.parametrize("kind", SOURCES.kinds())
def test_source_stopped_before_it_starts_returns(kind: str, tmp_path: Path) -> None:
    source, ctx, _ = make_source(kind, tmp_path)
    ctx.stop.set()
    thread = threading.Thread(target=source.run, args=(ctx,), daemon=True)
    thread.start()
    thread.join(DEADLINE_S + SLACK_S)
    assert not thread.is_alive(), f"source {kind} ignored a stop set before it ran"


# -- analyzers ---------------------------------------------------------------------------------------


def build_analyzer(kind: str) -> Any:
    reg = ANALYZERS[kind]
    return reg.factory(reg.config(), AgentHints(), 16)


@pytest.mark.parametrize("kind", ANALYZERS.kinds())
def test_analyzer_folds_real_batches_and_snapshots(kind: str, batches: dict[str, list[EventBatch]]) -> None:
    analyzer = build_analyzer(kind)
    if isinstance(analyzer, DerivedAnalyzer):
        others = {}
        for other in ANALYZERS.kinds():
            a = build_analyzer(other)
            if isinstance(a, DerivedAnalyzer):
                continue
            for k in a.kinds:
                for b in batches[k]:
                    a.update(b)
            others[other] = a.snapshot()
        result = analyzer.derive(others)
    else:
        assert analyzer.kinds, f"analyzer {kind} takes no kind of event"
        for k in sorted(analyzer.kinds):
            analyzer.update(EventBatch(k, empty(k), "contract"))
            for b in batches[k]:
                analyzer.update(b)
        result = analyzer.snapshot()
        before = json.dumps(result.to_dict(), sort_keys=True, default=str)
        for k in sorted(analyzer.kinds):
            for b in batches[k]:
                analyzer.update(b)
        assert json.dumps(result.to_dict(), sort_keys=True, default=str) == before, "a snapshot changed later"
    json.dumps(result.to_dict(), default=str)
    assert isinstance(list(result.points()), list)
    analyzer.drain_findings()


def test_the_sources_feed_every_kind_an_analyzer_takes(batches: dict[str, list[EventBatch]]) -> None:
    """Guards the analyzer cases: each kind of event some analyzer folds arrives from a real source."""
    wanted = {k for kind in ANALYZERS.kinds() for k in build_analyzer(kind).kinds}
    assert wanted <= {k for k, bs in batches.items() if any(b.rows for b in bs)}


# -- exporters and receivers -------------------------------------------------------------------------

EXPORTER_CASES: dict[str, Callable[[Path], dict[str, Any]]] = {
    "prometheus": lambda tmp: {"address": "127.0.0.1", "port": 0},
    "otlp_traces": lambda tmp: {"endpoint": closed_endpoint(), "protocol": "http/protobuf", "timeout_s": 1.0},
    "otlp_metrics": lambda tmp: {"endpoint": closed_endpoint(), "protocol": "http/protobuf", "timeout_s": 1.0},
    "lake": lambda tmp: {"path": str(tmp / "lake")},
}
RECEIVER_CASES: dict[str, Callable[[Path], dict[str, Any]]] = {
    "otlp": lambda tmp: {"enabled": True, "grpc_port": 0, "http_port": 0},
}


def build_exporter(kind: str, tmp: Path) -> Component:
    reg = EXPORTERS[kind]
    config = reg.config.model_validate(EXPORTER_CASES[kind](tmp))
    exporter = reg.factory(config, ExporterContext(node="contract-node", stats=Stats(), env={}))
    assert exporter is not None, f"exporter {kind} was left off by its case's settings"
    return exporter


class Sink:
    """The trace exporter's side of a receiver: what it was handed."""

    def __init__(self) -> None:
        self.spans = 0

    def accept_spans(self, request: Any, spans: int, nbytes: int = 0) -> None:
        self.spans += spans


def build_receiver(kind: str, tmp: Path, sink: Sink) -> Component:
    reg = RECEIVERS[kind]
    config = reg.config.model_validate(RECEIVER_CASES[kind](tmp))
    stats = Stats()
    receiver = reg.factory(config, ReceiverContext(stats=stats, budget=ByteBudget(64 << 20, stats), traces=sink))
    assert receiver is not None, f"receiver {kind} was left off by its case's settings"
    return receiver


def timed(call: Callable[[], Any]) -> float:
    t0 = time.monotonic()
    call()
    return time.monotonic() - t0


def lifecycle(build: Callable[[], Component], work: Callable[[Component], None]) -> None:
    """start, work, shutdown within the deadline, shutdown again, and shutdown before start."""
    component = build()
    assert isinstance(component, Component)
    component.start()
    try:
        work(component)
        if isinstance(component, Flushing):
            assert isinstance(component.force_flush(FLUSH_S), bool)
    finally:
        took = timed(lambda: component.shutdown(DEADLINE_S))
    assert took <= DEADLINE_S + SLACK_S, f"shutdown took {took:.1f} s against a {DEADLINE_S} s deadline"
    assert timed(lambda: component.shutdown(DEADLINE_S)) <= SLACK_S
    never_started = build()
    assert timed(lambda: never_started.shutdown(DEADLINE_S)) <= SLACK_S


@pytest.mark.parametrize("kind", EXPORTERS.kinds())
def test_exporter_lifecycle(kind: str, tmp_path: Path, batches: dict[str, list[EventBatch]]) -> None:
    snapshot = AnalysisSnapshot(time.time_ns(), "contract-node", {})

    def work(exporter: Any) -> None:
        for bs in batches.values():
            for b in bs[:3]:
                exporter.export(b)
        exporter.export_snapshot(snapshot)

    lifecycle(lambda: build_exporter(kind, tmp_path), work)


def send_one_span(receiver: Any) -> None:
    """One span over OTLP/HTTP, as an application's SDK sends it."""
    request = trace_service_pb2.ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes(range(1, 17)), bytes(range(1, 9)), "contract"
    span.start_time_unix_nano, span.end_time_unix_nano = time.time_ns() - 1000, time.time_ns()
    url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
    req = urllib.request.Request(url, request.SerializeToString(), {"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=10) as reply:
        assert reply.status == 200


RECEIVER_WORK: dict[str, Callable[[Any], None]] = {"otlp": send_one_span}


def test_perfetto_exporter_lifecycle(tmp_path: Path, batches: dict[str, list[EventBatch]]) -> None:
    """The one exporter built by the command line (``--perfetto FILE``) rather than from the registry."""

    def work(exporter: Any) -> None:
        for b in batches["kernels"][:3]:
            exporter.export(b)

    lifecycle(lambda: PerfettoExporter(tmp_path / "trace.perfetto-trace", Stats()), work)
    assert (tmp_path / "trace.perfetto-trace").stat().st_size > 0


@pytest.mark.parametrize("signal", ["metrics", "logs"])
def test_forwarder_lifecycle(signal: str) -> None:
    """The queues the service opens to forward what the receiver took in: to an endpoint nobody serves."""
    config = OtlpConfig(endpoint=closed_endpoint(), protocol="http/protobuf", timeout_s=1.0)

    def build() -> Component:
        stats = Stats()
        sender = forwarder(config, signal, stats, ByteBudget(64 << 20, stats))  # type: ignore[arg-type]
        assert sender is not None
        return sender

    lifecycle(build, lambda sender: sender.enqueue(b"\x0a\x00", 1))


@pytest.mark.parametrize("kind", RECEIVERS.kinds())
def test_receiver_lifecycle(kind: str, tmp_path: Path) -> None:
    sink = Sink()
    lifecycle(lambda: build_receiver(kind, tmp_path, sink), RECEIVER_WORK[kind])
    assert sink.spans == 1


def cases() -> Iterator[tuple[str, list[str], dict[str, Any]]]:
    yield "source", SOURCES.kinds(), SOURCE_CASES
    yield "analyzer", ANALYZERS.kinds(), {k: None for k in ANALYZERS.kinds()}
    yield "exporter", EXPORTERS.kinds(), EXPORTER_CASES
    yield "receiver", RECEIVERS.kinds(), RECEIVER_CASES
    yield "receiver work for", RECEIVERS.kinds(), RECEIVER_WORK


def test_every_registered_component_has_a_case() -> None:
    missing = [f"{what} {k}" for what, kinds, table in cases() for k in kinds if k not in table]
    assert not missing, "registered without a lifecycle case here: " + ", ".join(missing)
