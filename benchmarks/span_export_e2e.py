"""Span export end to end: ``aaco replay`` of a Kineto trace with OTLP minus without, against the SDK.

The trace (generated in a temporary directory): ``--iterations`` ProfilerSteps of ``--kernels``
kernels each, every kernel with its ``cudaLaunchKernel``. ``aaco replay`` turns it into one trace per
iteration: the root span, a span per kernel and one per launch (the kernel links to its launch).

- with / without: the whole ``aaco replay`` command (its own process: parse, correlator, lake,
  analyzers) with ``--otlp-endpoint`` and without; the difference is what exporting the spans costs
  a user: correlation context carried, trace assembly, encoding, sending.
- SDK: the OpenTelemetry SDK (``TracerProvider`` + ``BatchSpanProcessor`` + gRPC ``OTLPSpanExporter``,
  queue large enough that it drops nothing) emitting the same spans — names, times, attributes,
  parents and links as AACO sent them, recorded by the receiver in a warm-up run — in its own process,
  timed from the first span to the last one acknowledged (imports and decoding the recording excluded).
- floor: the same spans encoded with the protobuf library alone (opentelemetry-proto's generated
  classes, ``SerializeToString`` per request of 8,192 spans), no network, in this process.

All send to one receiver in another process (it parses every request with the official classes and
counts spans). Same compression on both sides (``--compression``, default none as the SDK's default).
Rounds interleaved (without, with, SDK, floor), medians. Prints one JSON line: seconds of each, the
end-to-end ratio SDK / (with - without) (goal >= 5), and spans/s of AACO's export against the floor's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import tracegen  # noqa: E402 - the generators live with the tests

SAMPLES = ROOT / "examples" / "data"
AACO = str(Path(sys.executable).parent / "aaco")
PER_REQUEST = 8192
_LEN = struct.Struct("<I")


def receiver(port_q: Any, count: Any, record: Any, record_path: str, stop: Any) -> None:
    """A counting OTLP/gRPC receiver (traces and metrics) in its own process; records requests while asked."""
    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    empty = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
    empty_metrics = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()

    def export(request: bytes, _context: object) -> bytes:
        msg = trace_service_pb2.ExportTraceServiceRequest.FromString(request)
        n = sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)
        with record.get_lock():
            if record.value > 0:
                with open(record_path, "ab") as fh:
                    fh.write(_LEN.pack(len(request)) + request)
                record.value -= n
        with count.get_lock():
            count.value += n
        return empty

    def export_metrics(_request: bytes, _context: object) -> bytes:
        return empty_metrics

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.max_receive_message_length", 64 << 20)]
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "opentelemetry.proto.collector.trace.v1.TraceService",
                {"Export": grpc.unary_unary_rpc_method_handler(export)},
            ),
            grpc.method_handlers_generic_handler(
                "opentelemetry.proto.collector.metrics.v1.MetricsService",
                {"Export": grpc.unary_unary_rpc_method_handler(export_metrics)},
            ),
        )
    )
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    stop.wait()
    server.stop(0)


def recorded_requests(path: str) -> list[bytes]:
    """The requests the receiver recorded."""
    data = Path(path).read_bytes()
    out, i = [], 0
    while i < len(data):
        (n,) = _LEN.unpack_from(data, i)
        out.append(data[i + 4 : i + 4 + n])
        i += 4 + n
    return out


def _value(v: Any) -> object:
    return getattr(v, v.WhichOneof("value"))


def decoded_spans(requests: list[bytes]) -> list[tuple[Any, ...]]:
    """(trace, span, parent, name, start, end, attributes, links) of every recorded span, in order."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    out = []
    for raw in requests:
        msg = trace_service_pb2.ExportTraceServiceRequest.FromString(raw)
        for rs in msg.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {kv.key: _value(kv.value) for kv in s.attributes}
                    links = [
                        (ln.trace_id, ln.span_id, {kv.key: _value(kv.value) for kv in ln.attributes}) for ln in s.links
                    ]
                    out.append(
                        (
                            s.trace_id,
                            s.span_id,
                            s.parent_span_id,
                            s.name,
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            attrs,
                            links,
                        )
                    )
    return out


def sdk_child(port: int, record_path: str, compression: str, count: Any, result: Any) -> None:
    """The SDK emitting the recorded spans (its own process); puts (wall s, cpu s, spans) on ``result``."""
    from opentelemetry import trace as otel
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import Compression, OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    spans = decoded_spans(recorded_requests(record_path))
    provider = TracerProvider(resource=Resource.create({"service.name": "aaco-agent", "host.name": "bench"}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(
                endpoint=f"127.0.0.1:{port}",
                insecure=True,
                compression=Compression.Gzip if compression == "gzip" else Compression.NoCompression,
            ),
            max_queue_size=max(len(spans), PER_REQUEST),
            max_export_batch_size=PER_REQUEST,
            schedule_delay_millis=100,
        )
    )
    tracer = provider.get_tracer("aaco")
    flags = otel.TraceFlags(1)
    target = count.value + len(spans)
    w0, c0 = time.perf_counter(), time.process_time()
    contexts: dict[tuple[bytes, bytes], Any] = {}
    for trace, _span, parent, name, start, end, attrs, links in spans:
        ctx = None
        if parent:
            ctx = contexts.get((trace, parent))
            if ctx is None:
                remote = otel.SpanContext(
                    int.from_bytes(trace, "big"), int.from_bytes(parent, "big"), is_remote=True, trace_flags=flags
                )
                ctx = contexts[(trace, parent)] = otel.set_span_in_context(otel.NonRecordingSpan(remote))
        span_links = [
            otel.Link(otel.SpanContext(int.from_bytes(t, "big"), int.from_bytes(s, "big"), False, flags), a)
            for t, s, a in links
        ]
        tracer.start_span(name, context=ctx, start_time=start, attributes=attrs, links=span_links).end(end_time=end)
    provider.force_flush(300_000)
    deadline = time.monotonic() + 300
    while count.value < target and time.monotonic() < deadline:
        time.sleep(0.005)
    result.put((time.perf_counter() - w0, time.process_time() - c0, len(spans)))
    provider.shutdown()


def floor_encode(spans: list[tuple[Any, ...]]) -> float:
    """Seconds to encode ``spans`` into requests with the protobuf classes alone."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2

    def set_attrs(target: Any, attrs: dict[str, object]) -> None:
        for k, v in attrs.items():
            kv = target.add(key=k)
            if isinstance(v, bool):
                kv.value.bool_value = v
            elif isinstance(v, int):
                kv.value.int_value = v
            elif isinstance(v, float):
                kv.value.double_value = v
            else:
                kv.value.string_value = str(v)

    t0 = time.perf_counter()
    size = 0
    for i in range(0, len(spans), PER_REQUEST):
        req = trace_service_pb2.ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        set_attrs(rs.resource.attributes, {"service.name": "aaco-agent", "host.name": "bench"})
        ss = rs.scope_spans.add(scope=common_pb2.InstrumentationScope(name="aaco"))
        for trace, span, parent, name, start, end, attrs, links in spans[i : i + PER_REQUEST]:
            s = ss.spans.add(
                trace_id=trace,
                span_id=span,
                parent_span_id=parent,
                name=name,
                kind=1,
                start_time_unix_nano=start,
                end_time_unix_nano=end,
            )
            set_attrs(s.attributes, attrs)
            for t, sid, a in links:
                ln = s.links.add(trace_id=t, span_id=sid)
                set_attrs(ln.attributes, a)
        size += len(req.SerializeToString())
    assert size > 0
    return time.perf_counter() - t0


def replay(trace: Path, lake: Path, port: int | None, compression: str) -> tuple[float, float]:
    """(wall s, CPU s) of one ``aaco replay`` process; fails loudly if it fails."""
    args = [AACO, "replay", str(trace), "--out", str(lake), "--force"]
    env = dict(os.environ, AACO_PIPELINE_SHUTDOWN_TIMEOUT_S="600")  # time to deliver every span on a busy machine
    if port is not None:
        args += ["--otlp-endpoint", f"http://127.0.0.1:{port}"]
        env.update(
            {
                "AACO_EXPORTERS_OTLP_MAX_SPANS_PER_SECOND": "1e12",  # no rate budget: every span sent
                "AACO_EXPORTERS_OTLP_QUEUE_MAX_SPANS": "10000000",
                "AACO_EXPORTERS_OTLP_COMPRESSION": compression,
            }
        )
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"aaco replay failed ({os.waitstatus_to_exitcode(status)}): {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--kernels", type=int, default=2000, help="kernels per iteration")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compression", choices=["none", "gzip"], default="none")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trace = work / "trace.json"
        kernels, _ = tracegen.kineto(SAMPLES, trace, args.iterations * args.kernels, per_step=args.kernels)
        record_path = str(work / "recorded.bin")
        port_q, count, record, stop = ctx.Queue(), ctx.Value("q", 0), ctx.Value("q", 0), ctx.Event()
        proc = ctx.Process(target=receiver, args=(port_q, count, record, record_path, stop), daemon=True)
        proc.start()
        port = port_q.get(timeout=60)
        try:
            record.value = 1 << 62  # warm-up run, recorded: the spans the SDK and the floor emit
            before = count.value
            replay(trace, work / "lake_warm", port, args.compression)
            expected = count.value - before
            record.value = 0
            spans = decoded_spans(recorded_requests(record_path))
            if len(spans) != expected:
                raise SystemExit(f"recorded {len(spans)} spans, received {expected}")
            runs: dict[str, list[float]] = {"without": [], "with": [], "sdk": [], "floor": []}
            cpu: dict[str, list[float]] = {"without": [], "with": [], "sdk": []}
            for i in range(args.rounds):
                wall, c = replay(trace, work / f"lake_without{i}", None, args.compression)
                runs["without"].append(wall)
                cpu["without"].append(c)
                before = count.value
                wall, c = replay(trace, work / f"lake_with{i}", port, args.compression)
                if count.value - before != expected:
                    raise SystemExit(f"round {i}: AACO delivered {count.value - before} of {expected} spans")
                runs["with"].append(wall)
                cpu["with"].append(c)
                result = ctx.Queue()
                before = count.value
                child = ctx.Process(target=sdk_child, args=(port, record_path, args.compression, count, result))
                child.start()
                child.join(600)
                if child.exitcode != 0 or result.empty():
                    raise SystemExit(f"round {i}: the SDK process failed ({child.exitcode})")
                wall, c, n = result.get(timeout=10)
                if count.value - before != expected or n != expected:
                    raise SystemExit(f"round {i}: SDK delivered {count.value - before} of {expected} spans")
                runs["sdk"].append(wall)
                cpu["sdk"].append(c)
                runs["floor"].append(floor_encode(spans))
        finally:
            stop.set()
            proc.join(10)
    med = {k: statistics.median(v) for k, v in runs.items()}
    mcpu = {k: statistics.median(v) for k, v in cpu.items()}
    export_s = med["with"] - med["without"]
    export_cpu = mcpu["with"] - mcpu["without"]
    print(
        json.dumps(
            {
                "benchmark": "span_export_e2e",
                "iterations": args.iterations,
                "kernels": kernels,
                "spans": expected,
                "compression": args.compression,
                "rounds": args.rounds,
                "with_s": round(med["with"], 3),
                "without_s": round(med["without"], 3),
                "export_s": round(export_s, 3),
                "sdk_s": round(med["sdk"], 3),
                "floor_s": round(med["floor"], 3),
                "export_cpu_s": round(export_cpu, 3),
                "sdk_cpu_s": round(mcpu["sdk"], 3),
                "ratio_e2e": round(med["sdk"] / export_s, 2),
                "ratio_cpu": round(mcpu["sdk"] / export_cpu, 2),
                "aaco_spans_per_s": round(expected / export_s),
                "floor_spans_per_s": round(expected / med["floor"]),
                "aaco_vs_floor": round(med["floor"] / export_s, 2),
                "goal_ratio": 5.0,
                "goal_met": med["sdk"] / export_s >= 5.0,
            }
        )
    )


if __name__ == "__main__":
    main()
