"""The ``llm_requests`` source: LLM-shaped requests through the embedded ONNX model, sent as vLLM's spans.

Each cycle opens an ONNX Runtime session with profiling on, warms it up, serves the cycle's requests
(``llm_requests.py``: a prefill run, then one decode run per further output token, token counts from
a seeded rule) and ends profiling. The profile is published as the ``ort`` source publishes its own
(iterations then kernels; warmup runs left out), under the cycle's model name; then one ``llm_request``
span (kind SERVER, vLLM's ``gen_ai.*`` attributes) per finished request goes by the OpenTelemetry SDK
over OTLP to ``endpoint`` (the agent's own receiver), with resource attributes ``service.name`` and
``process.pid``, so that the receiver links each request to the iterations it ran. Cycles take the
names in ``models`` in turn (the same graph under each name). See docs/llm-demo.md.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, conint, model_validator

from aaco.agent.sources.base import Source, SourceContext
from aaco.agent.sources.ort.inputs import make_inputs
from aaco.agent.sources.ort.llm_requests import plan_requests, serve, span_attributes
from aaco.agent.sources.ort.models import load_model, resolve_model
from aaco.agent.sources.ort.onnx_graph import summarize
from aaco.agent.sources.ort.profiles import publish_profile
from aaco.agent.sources.ort.session import make_session, resolve_provider
from aaco.agent.sources.ort.source import Provider
from aaco.contract.config_base import StrictModel
from aaco.contract.errors import AacoError

log = logging.getLogger("aaco.sources.llm_requests")


class LlmRequestsConfig(StrictModel):
    """LLM-shaped requests (prefill + decode runs) through an ONNX model, sent as vLLM request spans over OTLP."""

    type: Literal["llm_requests"] = "llm_requests"
    name: str | None = Field(None, description="Source name in metrics and logs (default: the type).")
    model: Path | None = Field(
        None, description="The .onnx model run for every token; default: light_resnet50.onnx from the onnx wheel."
    )
    models: list[str] = Field(
        ["demo-llm-a", "demo-llm-b"],
        min_length=1,
        description="Model names the cycles take in turn (the same graph under each name).",
    )
    requests_per_cycle: conint(ge=1, le=1000) = Field(8, description="Requests served per cycle.")  # type: ignore[valid-type]
    input_tokens_min: conint(ge=1) = Field(16, description="Fewest prompt tokens a request draws.")  # type: ignore[valid-type]
    input_tokens_max: conint(ge=1) = Field(512, description="Most prompt tokens a request draws.")  # type: ignore[valid-type]
    max_tokens: conint(ge=1, le=1000) = Field(  # type: ignore[valid-type]
        12, description="max_tokens of every request: at most this many output tokens (model runs)."
    )
    mean_interarrival_s: NonNegativeFloat = Field(
        0.05, description="Mean gap between arrivals within a cycle (Poisson; 0: all arrive at once)."
    )
    warmup: NonNegativeInt = Field(2, description="Untimed warmup runs per cycle (not published).")
    cycles: conint(ge=1) | None = Field(None, description="Cycles to run; null runs until the agent stops.")  # type: ignore[valid-type]
    interval_s: NonNegativeFloat = Field(5.0, description="Pause between cycles, in seconds.")
    provider: Provider = Field("auto", description="Execution provider; auto takes the best one present.")
    intra_op_threads: NonNegativeInt = Field(0, description="ONNX Runtime intra-op threads (0: its default).")
    seed: int = Field(0, description="Seed of the token rule, the arrivals and the model's inputs.")
    endpoint: str = Field(
        "http://127.0.0.1:4318",
        description="OTLP endpoint the spans go to (the agent's receiver: HTTP 4318, gRPC 4317).",
    )
    protocol: Literal["http", "grpc"] = Field("http", description="OTLP protocol of endpoint.")
    service_name: str = Field("demo-llm-server", description="service.name of the spans' resource.")
    export_timeout_s: PositiveFloat = Field(2.0, description="Longest wait for the spans of one cycle to be sent.")

    @model_validator(mode="after")
    def _token_range(self) -> LlmRequestsConfig:
        if self.input_tokens_min > self.input_tokens_max:
            raise ValueError("input_tokens_min must not exceed input_tokens_max")
        return self


def tracer_provider(config: LlmRequestsConfig) -> tuple[Any, Callable[[], int]]:
    """An SDK tracer provider sending to ``config.endpoint`` in batches, resource naming this process.

    Also returns a function giving the number of spans the endpoint has not accepted so far (the
    source reports them as a problem, once, instead of the SDK's log line per batch).
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        inner: Any = GrpcExporter(
            endpoint=config.endpoint.split("://", 1)[-1],
            insecure=not config.endpoint.startswith("https://"),
            timeout=config.export_timeout_s,
        )
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        inner = HttpExporter(endpoint=config.endpoint.rstrip("/") + "/v1/traces", timeout=config.export_timeout_s)
    logging.getLogger(type(inner).__module__).setLevel(logging.CRITICAL)  # failures are counted below instead
    failed = [0]

    class CountingExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            result = inner.export(spans)
            if result is not SpanExportResult.SUCCESS:
                failed[0] += len(spans)
            return result

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return inner.force_flush(timeout_millis)

    resource = Resource.create({"service.name": config.service_name, "process.pid": os.getpid()})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(
        BatchSpanProcessor(
            CountingExporter(), max_queue_size=4096, schedule_delay_millis=200, max_export_batch_size=512
        )
    )
    return provider, lambda: failed[0]


class LlmRequestsSource(Source):
    """Serves seeded LLM-shaped requests through an ONNX model, cycle after cycle, and sends their spans."""

    type = "llm_requests"

    def __init__(self, config: LlmRequestsConfig, name: str) -> None:
        super().__init__(name)
        self.config = config
        self.finite = config.cycles is not None
        self.model_path = resolve_model(config.model)
        self.sent = 0  # request spans handed to the SDK

    def run(self, ctx: SourceContext) -> None:
        """Run cycles until done or stopped; a model that cannot be loaded is a fatal problem."""
        cfg = self.config
        subject = os.fspath(self.model_path)
        try:
            graph = summarize(load_model(self.model_path, given_as="the source's model key"))
            provider = resolve_provider(cfg.provider)
        except AacoError as exc:
            ctx.problem(self.name, subject, "model", str(exc), fatal=True, count=1)
            return
        tracer_prov, failed = tracer_provider(cfg)
        reported = 0
        tracer = tracer_prov.get_tracer("aaco.demo.llm_requests")
        log.info(
            "llm_requests: %d requests per cycle as %s on %s, spans to %s (%s)",
            cfg.requests_per_cycle,
            ", ".join(cfg.models),
            provider,
            cfg.endpoint,
            cfg.protocol,
        )
        try:
            with tempfile.TemporaryDirectory(prefix="aaco-llm-") as tmp:
                cycle = 0
                while not ctx.stop.is_set() and (cfg.cycles is None or cycle < cfg.cycles):
                    model = cfg.models[cycle % len(cfg.models)]
                    try:
                        served, profile, start_ns = self._cycle(ctx.stop, cycle, provider, Path(tmp))
                    except AacoError as exc:
                        ctx.problem(self.name, subject, "run", str(exc), fatal=True, count=1)
                        return
                    self._publish(ctx, profile, start_ns, model, graph.running_nodes, provider)
                    self._send(tracer, served, model)
                    tracer_prov.force_flush(int(cfg.export_timeout_s * 1000))
                    lost = failed() - reported
                    if lost:
                        ctx.problem(
                            self.name,
                            cfg.endpoint,
                            "export",
                            f"{lost} request span(s) not accepted by {cfg.endpoint} "
                            "(is the agent's OTLP receiver on, on that port?)",
                            fatal=False,
                            count=lost,
                        )
                        reported += lost
                    cycle += 1
                    if (cfg.cycles is not None and cycle >= cfg.cycles) or ctx.sleep(cfg.interval_s):
                        break
        finally:
            tracer_prov.shutdown()

    def _cycle(self, stop: threading.Event, cycle: int, provider: str, tmp: Path) -> tuple[list, Path, int]:
        """Warm up and serve one cycle's requests under the profiler: (served, profile file, profiling start ns)."""
        cfg = self.config
        session = make_session(
            self.model_path,
            provider,
            profile_prefix=tmp / f"aaco-llm-{os.getpid()}-{time.time_ns()}",
            intra_op_threads=cfg.intra_op_threads,
        )
        feeds = make_inputs(session.get_inputs(), 1, cfg.seed)
        start_ns = session.get_profiling_start_time_ns()
        try:
            for _ in range(cfg.warmup):
                session.run(None, feeds)
            plans = plan_requests(
                cfg.seed,
                cycle,
                cfg.requests_per_cycle,
                input_tokens=(cfg.input_tokens_min, cfg.input_tokens_max),
                max_tokens=cfg.max_tokens,
                mean_interarrival_s=cfg.mean_interarrival_s,
            )
            served = serve(plans, lambda: session.run(None, feeds), stop)
        finally:
            profile = Path(session.end_profiling())
        return served, profile, start_ns

    def _publish(
        self, ctx: SourceContext, profile: Path, start_ns: int, model: str, running_nodes: int, provider: str
    ) -> None:
        """Publish the cycle's profile: the warmup runs left out, every request's runs as iterations."""
        publish_profile(
            ctx,
            self.name,
            profile,
            start_ns,
            identity=f"llm:{os.getpid()}:{start_ns}",
            model=model,
            skip_runs=self.config.warmup,
            graph_nodes=running_nodes,
            provider=provider,
        )

    def _send(self, tracer: Any, served: list, model: str) -> None:
        """One ``llm_request`` SERVER span per finished request, from its arrival to its last token."""
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind

        for plan, timing in served:
            span = tracer.start_span(
                "llm_request",
                context=Context(),  # a root span, as vLLM's is without an incoming traceparent
                kind=SpanKind.SERVER,
                start_time=timing.arrival_ns,
                attributes=span_attributes(plan, timing, model),
            )
            span.end(end_time=timing.last_token_ns)
            self.sent += 1


def create(config: LlmRequestsConfig, name: str) -> LlmRequestsSource:
    """Factory used by the source registry."""
    return LlmRequestsSource(config, name)
