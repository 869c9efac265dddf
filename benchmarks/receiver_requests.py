"""The node's OTLP receiver taking vLLM-shaped request spans: reading them into serving metrics vs forwarding only.

Both arms run the same receiver (``OtlpReceiver``, OTLP/HTTP) and the same trace exporter behind it
(``OtlpTraceExporter``, which holds application spans ``link_window_s`` for linking, then forwards
them over gRPC to a counting upstream in another process). They differ only in the reading:

- ``reading``: the receiver is given the agent's bus (``Bus``), reads every ``llm_request`` span into a
  ``requests`` row and offers it; a thread drains the bus into the serving analyzer (``ServingAnalyzer``),
  as the pipeline worker does.
- ``forwarding`` (the baseline): no bus; the spans are forwarded without being read.

Clients are separate processes (their CPU is not counted), each on its own keep-alive connection,
posting pre-serialised ExportTraceServiceRequests of ``--per-request`` spans shaped as vLLM's (the
attributes of ``agent/sources/ort/llm_requests.py``, two models, ``process.pid`` on the resource).
A round ends when the upstream has counted every span. Rounds alternate the arms (the order flips
each round); the figures are medians. CPU is this process's (receiver, exporter, analyzer).

Prints one JSON line: spans/s and CPU seconds per 100k spans of each arm, and reading/forwarding ratios.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import statistics
import threading
import time
from typing import Any

from span_export import receiver as upstream  # the same counting OTLP/gRPC upstream process (benchmarks/ on sys.path)

from aaco.agent.pipeline.bus import Bus
from aaco.agent.receivers.config import OtlpReceiverConfig
from aaco.agent.receivers.otlp import OtlpReceiver
from aaco.analyzers.serving import ServingAnalyzer
from aaco.contract.stats import Stats
from aaco.exporters.otlp_settings import OtlpConfig
from aaco.exporters.otlp_traces import OtlpTraceExporter

T0 = 1_795_000_000_000_000_000
_PAYLOAD: list[bytes] = []


def request_payload(client: int, per_request: int) -> bytes:
    """One ExportTraceServiceRequest of ``per_request`` llm_request spans (vLLM's attributes), serialised."""
    import random

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    rng = random.Random(client)
    msg = trace_service_pb2.ExportTraceServiceRequest()
    rs = msg.resource_spans.add()
    for key, value in (("service.name", "bench-llm-server"), ("process.pid", 40_000 + client)):
        kv = rs.resource.attributes.add()
        kv.key = key
        if isinstance(value, int):
            kv.value.int_value = value
        else:
            kv.value.string_value = value
    ss = rs.scope_spans.add()
    ss.scope.name = "vllm.llm_engine"
    for i in range(per_request):
        queue, prefill, out = rng.uniform(0, 0.2), rng.uniform(0.01, 0.3), rng.randint(1, 256)
        decode = (out - 1) * rng.uniform(0.01, 0.05)
        model = ("demo-llm-a", "demo-llm-b")[i % 2]
        span = ss.spans.add()
        span.trace_id = rng.randbytes(16)
        span.span_id = rng.randbytes(8)
        span.name = "llm_request"
        span.kind = trace_pb2.Span.SPAN_KIND_SERVER
        span.start_time_unix_nano = T0 + i * 1_000_000
        span.end_time_unix_nano = span.start_time_unix_nano + int((queue + prefill + decode) * 1e9)
        attrs: list[tuple[str, Any]] = [
            ("gen_ai.response.model", model),
            ("gen_ai.request.id", f"cmpl-{client}-{i}"),
            ("gen_ai.request.max_tokens", 256),
            ("gen_ai.usage.prompt_tokens", rng.randint(16, 2048)),
            ("gen_ai.usage.completion_tokens", out),
            ("gen_ai.latency.time_in_queue", queue),
            ("gen_ai.latency.time_to_first_token", queue + prefill),
            ("gen_ai.latency.e2e", queue + prefill + decode),
            ("gen_ai.latency.time_in_model_prefill", prefill),
            ("gen_ai.latency.time_in_model_decode", decode),
            ("gen_ai.latency.time_in_model_inference", prefill + decode),
        ]
        for key, value in attrs:
            kv = span.attributes.add()
            kv.key = key
            if isinstance(value, str):
                kv.value.string_value = value
            elif isinstance(value, int):
                kv.value.int_value = value
            else:
                kv.value.double_value = value
        kv = span.attributes.add()
        kv.key = "gen_ai.response.finish_reasons"
        kv.value.array_value.values.add().string_value = "length" if out == 256 else "stop"
    return msg.SerializeToString()


def client_init(client_ids: Any, per_request: int) -> None:
    """Build this client process's payload once (outside the measured time)."""
    with client_ids.get_lock():
        client_ids.value += 1
        client = client_ids.value
    _PAYLOAD[:] = [request_payload(client, per_request)]


def post_all(port: int, requests: int) -> int:
    """POST ``requests`` copies of this client's payload on one keep-alive connection; returns the 200s."""
    body = _PAYLOAD[0]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    ok = 0
    headers = {"Content-Type": "application/x-protobuf"}
    for _ in range(requests):
        while True:
            conn.request("POST", "/v1/traces", body, headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status == 200:
                ok += 1
                break
            time.sleep(0.01)  # over budget (503): back off as an SDK would
    conn.close()
    return ok


def run_arm(reading: bool, upstream_port: int, count: Any, pool: Any, clients: int, requests: int, per: int) -> dict:
    """One round of one arm: (wall s, CPU s, spans delivered, rows read)."""
    stats = Stats()
    exporter = OtlpTraceExporter(
        OtlpConfig(endpoint=f"http://127.0.0.1:{upstream_port}", queue_max_spans=10**7),
        stats,
        "bench",
        env={},
        link_window_s=0.05,
        receiving=True,
    )
    exporter.start()
    bus = Bus(stats, 4096, 10_000_000) if reading else None
    rx_cfg = OtlpReceiverConfig(enabled=True, grpc_port=0, http_port=0, rate_limit_rps=1e9, max_workers=4)
    receiver = OtlpReceiver(rx_cfg, stats, {"host.name": "bench"}, exporter, None, None, bus=bus, node="bench")
    receiver.start()
    analyzer = ServingAnalyzer()
    done = threading.Event()
    rows = [0]

    def drain() -> None:  # the pipeline worker's part: bus -> analyzer
        assert bus is not None
        while not done.is_set() or bus.depth:
            item = bus.get(0.05)
            if item is not None:
                analyzer.update(item)
                rows[0] += item.rows

    def tick() -> None:  # the pipeline's idle tick: forward application spans whose link window passed
        while not done.wait(0.01):
            exporter.tick()

    threads = [threading.Thread(target=tick, daemon=True)]
    if reading:
        threads.append(threading.Thread(target=drain, daemon=True))
    total = clients * requests * per
    target = count.value + total
    w0, c0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    accepted = sum(pool.starmap(post_all, [(receiver.http_port, requests)] * clients))
    deadline = time.monotonic() + 300
    while count.value < target and time.monotonic() < deadline:
        time.sleep(0.005)
    done.set()
    for t in threads:
        t.join(30)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    receiver.shutdown(5)
    exporter.shutdown(10)
    delivered = count.value - (target - total)
    return {
        "wall": wall,
        "cpu": cpu,
        "spans": total,
        "accepted": accepted * per,
        "delivered": delivered,
        "read": rows[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4, help="client processes, one connection each")
    ap.add_argument("--requests", type=int, default=250, help="OTLP requests per client per round")
    ap.add_argument("--per-request", type=int, default=100, help="spans per OTLP request")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    port_q, count, stop, ids = ctx.Queue(), ctx.Value("q", 0), ctx.Event(), ctx.Value("i", 0)
    proc = ctx.Process(target=upstream, args=(port_q, count, stop), daemon=True)
    proc.start()
    port = port_q.get(timeout=30)
    runs: dict[str, list[dict]] = {"reading": [], "forwarding": []}
    try:
        with ctx.Pool(args.clients, initializer=client_init, initargs=(ids, args.per_request)) as pool:
            for r in range(args.rounds):
                order = ("reading", "forwarding") if r % 2 == 0 else ("forwarding", "reading")
                for arm in order:
                    runs[arm].append(
                        run_arm(arm == "reading", port, count, pool, args.clients, args.requests, args.per_request)
                    )
    finally:
        stop.set()
        proc.join(10)

    def summary(arm: str) -> dict[str, Any]:
        rs = runs[arm]
        return {
            "spans_per_round": rs[0]["spans"],
            "delivered_all": all(x["delivered"] == x["spans"] for x in rs),
            "read_all": all(x["read"] == x["spans"] for x in rs) if arm == "reading" else None,
            "spans_per_s": round(statistics.median(x["spans"] / x["wall"] for x in rs)),
            "cpu_s_per_100k": round(statistics.median(x["cpu"] / x["spans"] * 1e5 for x in rs), 3),
            "rounds_spans_per_s": [round(x["spans"] / x["wall"]) for x in rs],
        }

    reading, forwarding = summary("reading"), summary("forwarding")
    print(
        json.dumps(
            {
                "benchmark": "receiver_requests",
                "clients": args.clients,
                "per_request": args.per_request,
                "rounds": args.rounds,
                "reading": reading,
                "forwarding": forwarding,
                "ratio_spans_per_s": round(reading["spans_per_s"] / forwarding["spans_per_s"], 3),
                "ratio_cpu_per_span": round(reading["cpu_s_per_100k"] / forwarding["cpu_s_per_100k"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
