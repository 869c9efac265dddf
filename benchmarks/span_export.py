"""200,000 kernel spans to a loopback OTLP/gRPC receiver: AACO's exporter vs the OpenTelemetry SDK.

Both send the same spans (iteration roots and 2,000 kernels per iteration, same names, times and
attributes: gpu.kernel.name, kind, device, stream, correlation, thread, grid and workgroup) to the
same receiver, which runs in another process (parsing every request with the official protobuf
classes and counting spans) so that only the exporters' own CPU is measured here.

- AACO: Arrow batches through ``OtlpTraceExporter`` (encoded straight from the columns).
- SDK: ``TracerProvider`` + ``BatchSpanProcessor`` + ``OTLPSpanExporter`` (gRPC), one span per kernel
  (queue large enough that it drops nothing), fed from the same rows.

Prints one JSON line: spans/s of each, CPU seconds per 100k spans, and the throughput ratio (goal >= 5).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from concurrent import futures

import numpy as np
import pyarrow as pa

from aaco.contract.ids import span_id, trace_id
from aaco.contract.kernels import families
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.stats import Stats
from aaco.exporters.otlp_settings import OtlpConfig
from aaco.exporters.otlp_traces import OtlpTraceExporter

NAMES = [
    "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1",
    "void at::native::vectorized_elementwise_kernel<4>",
    "ampere_sgemm_128x64_tn",
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm>",
    "MIOpenConvUni",
    "void at::native::reduce_kernel<512, 1>",
    "fmha_fwd_kernel",
    "void at::native::softmax_warp_forward",
    "ncclDevKernel_AllReduce_Sum_f16_RING_LL",
    "void at::native::layer_norm_kernel",
]
T0 = 1_795_000_000_000_000_000


def receiver(port_q: mp.Queue, count: mp.Value, stop: mp.Event) -> None:
    """A counting OTLP/gRPC receiver (its own process)."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    empty = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()

    def export(request: bytes, _context: object) -> bytes:
        msg = trace_service_pb2.ExportTraceServiceRequest.FromString(request)
        n = sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)
        with count.get_lock():
            count.value += n
        return empty

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.max_receive_message_length", 64 << 20)]
    )
    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService", {"Export": grpc.unary_unary_rpc_method_handler(export)}
    )
    server.add_generic_rpc_handlers((handler,))
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    stop.wait()
    server.stop(0)


def workload(spans: int, per_trace: int) -> tuple[pa.Table, pa.Table]:
    """Iterations and their kernels (trace context set, as the correlator leaves them)."""
    rng = np.random.default_rng(0)
    n_it = spans // per_trace
    it_start = T0 + np.arange(n_it, dtype=np.int64) * 10_000_000
    tids = [trace_id("bench", i) for i in range(n_it)]
    sids = [span_id("bench", i) for i in range(n_it)]
    iterations = conform(
        "iterations",
        {
            "start_ns": it_start,
            "end_ns": it_start + 9_000_000,
            "node": ["bench"] * n_it,
            "pid": [4242] * n_it,
            "model": ["resnet"] * n_it,
            "run_id": ["r"] * n_it,
            "trace_id": tids,
            "span_id": sids,
            "source": ["bench"] * n_it,
            "iteration": np.arange(n_it),
            "tid": [4243] * n_it,
            "name": ["model_run"] * n_it,
        },
    )
    k = np.arange(spans)
    it = k // per_trace
    start = it_start[it] + (k % per_trace) * 4_000
    kernels = conform(
        "kernels",
        {
            "start_ns": start,
            "end_ns": start + rng.integers(500, 3_500, spans),
            "node": ["bench"] * spans,
            "pid": np.full(spans, 4242),
            "tid": np.full(spans, 4243),
            "device": [str(d) for d in k % 2],
            "stream": k % 4,
            "name": [NAMES[i] for i in rng.integers(0, len(NAMES), spans)],
            "kind": ["kernel"] * spans,
            "correlation_id": k,
            "source": ["bench"] * spans,
            "grid_x": np.full(spans, 1024),
            "grid_y": np.ones(spans),
            "grid_z": np.ones(spans),
            "workgroup_x": np.full(spans, 256),
            "workgroup_y": np.ones(spans),
            "workgroup_z": np.ones(spans),
            "trace_id": [tids[i] for i in it],
            "parent_span_id": [sids[i] for i in it],
            "model": ["resnet"] * spans,
            "run_id": ["r"] * spans,
            "iteration": it,
        },
    )
    return pa.Table.from_batches([iterations]), pa.Table.from_batches([kernels])


def wait_for(count: mp.Value, target: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while count.value < target and time.monotonic() < deadline:
        time.sleep(0.01)


def run_aaco(port: int, iterations: pa.Table, kernels: pa.Table, count: mp.Value) -> tuple[float, float, int]:
    cfg = OtlpConfig(
        endpoint=f"http://127.0.0.1:{port}",
        max_spans_per_second=1e9,
        max_kernel_spans_per_trace=10**6,
        queue_max_spans=10**7,
    )
    exp = OtlpTraceExporter(cfg, Stats(), "bench", env={})
    exp.start()
    target = count.value + iterations.num_rows + kernels.num_rows
    w0, c0 = time.perf_counter(), time.process_time()
    for b in iterations.to_batches():
        exp.export(EventBatch("iterations", b, "bench"))
    for b in kernels.to_batches(max_chunksize=65_536):
        exp.export(EventBatch("kernels", b, "bench"))
    exp.force_flush(120)
    wait_for(count, target)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    exp.shutdown(10)
    return wall, cpu, count.value


def run_sdk(port: int, iterations: pa.Table, kernels: pa.Table, count: mp.Value) -> tuple[float, float, int]:
    from opentelemetry import trace as otel
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "aaco-agent", "host.name": "bench"}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True),
            max_queue_size=kernels.num_rows + iterations.num_rows,
            max_export_batch_size=8192,
            schedule_delay_millis=100,
        )
    )
    tracer = provider.get_tracer("bench")
    target = count.value + iterations.num_rows + kernels.num_rows
    w0, c0 = time.perf_counter(), time.process_time()
    parents = {}
    for r in iterations.to_pylist():
        ctx = otel.set_span_in_context(
            otel.NonRecordingSpan(
                otel.SpanContext(
                    int(r["trace_id"], 16), int(r["span_id"], 16), is_remote=True, trace_flags=otel.TraceFlags(1)
                )
            )
        )
        parents[r["trace_id"]] = ctx
        root = tracer.start_span(
            r["name"],
            start_time=r["start_ns"],
            attributes={"aaco.model": r["model"], "aaco.iteration": r["iteration"], "process.pid": r["pid"]},
        )
        root.end(end_time=r["end_ns"])
    fams = families(kernels.column("name"), kernels.column("kind"))
    cols = kernels.select(
        [
            "trace_id",
            "start_ns",
            "end_ns",
            "name",
            "kind",
            "device",
            "stream",
            "correlation_id",
            "tid",
            "grid_x",
            "grid_y",
            "grid_z",
            "workgroup_x",
            "workgroup_y",
            "workgroup_z",
        ]
    ).to_pydict()
    for i in range(kernels.num_rows):
        span = tracer.start_span(
            fams[i],
            context=parents[cols["trace_id"][i]],
            start_time=cols["start_ns"][i],
            attributes={
                "gpu.kernel.name": cols["name"][i],
                "gpu.kernel.kind": cols["kind"][i],
                "gpu.device.id": cols["device"][i],
                "gpu.correlation.id": cols["correlation_id"][i],
                "gpu.stream.id": cols["stream"][i],
                "thread.id": cols["tid"][i],
                "gpu.grid.x": cols["grid_x"][i],
                "gpu.grid.y": cols["grid_y"][i],
                "gpu.grid.z": cols["grid_z"][i],
                "gpu.workgroup.x": cols["workgroup_x"][i],
                "gpu.workgroup.y": cols["workgroup_y"][i],
                "gpu.workgroup.z": cols["workgroup_z"][i],
            },
        )
        span.end(end_time=cols["end_ns"][i])
    provider.force_flush(120_000)
    wait_for(count, target)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    provider.shutdown()
    return wall, cpu, count.value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--per-trace", type=int, default=2000)
    args = ap.parse_args()
    iterations, kernels = workload(args.spans, args.per_trace)
    ctx = mp.get_context("spawn")
    port_q, count, stop = ctx.Queue(), ctx.Value("q", 0), ctx.Event()
    proc = ctx.Process(target=receiver, args=(port_q, count, stop), daemon=True)
    proc.start()
    port = port_q.get(timeout=30)
    try:
        before = count.value
        a_wall, a_cpu, after = run_aaco(port, iterations, kernels, count)
        a_got = after - before
        s_wall, s_cpu, after2 = run_sdk(port, iterations, kernels, count)
        s_got = after2 - after
    finally:
        stop.set()
        proc.join(10)
    total = iterations.num_rows + kernels.num_rows
    print(
        json.dumps(
            {
                "benchmark": "span_export",
                "spans": total,
                "aaco": {
                    "delivered": a_got,
                    "wall_s": round(a_wall, 3),
                    "spans_per_s": round(a_got / a_wall),
                    "cpu_s_per_100k": round(a_cpu / total * 1e5, 3),
                },
                "sdk": {
                    "delivered": s_got,
                    "wall_s": round(s_wall, 3),
                    "spans_per_s": round(s_got / s_wall),
                    "cpu_s_per_100k": round(s_cpu / total * 1e5, 3),
                },
                "ratio_spans_per_s": round((a_got / a_wall) / (s_got / s_wall), 2),
                "ratio_cpu": round(s_cpu / a_cpu, 2),
                "goal_ratio": 5.0,
                "goal_met": (a_got / a_wall) / (s_got / s_wall) >= 5.0 and a_got == s_got == total,
            }
        )
    )


if __name__ == "__main__":
    main()
