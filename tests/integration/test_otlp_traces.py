"""OTLP trace export against real receivers built from the opentelemetry-proto stubs."""

from __future__ import annotations

import gzip
import subprocess
import time
from collections import Counter

import grpc
import pytest

from aaco.agent.config import load_config
from aaco.agent.service import AgentService
from aaco.contract.stats import EVENTS_DROPPED, EVENTS_EMITTED, EXPORT_ERRORS
from tests.conftest import get_free_port
from tests.support.otlp_receivers import GrpcReceiver, HttpReceiver

from .helpers import run_aaco

pytestmark = pytest.mark.integration


def attrs(kvs):
    out = {}
    for kv in kvs:
        v = kv.value
        out[kv.key] = v.string_value if v.HasField("string_value") else v.int_value
    return out


def replay_to(aaco_bin, tmp_path, trace, endpoint, env=None):
    proc = run_aaco(aaco_bin, "replay", str(trace), "--out", str(tmp_path / "D"), "--otlp-endpoint", endpoint, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc


def check_mi250(spans):
    by_kind = Counter(attrs(s.attributes).get("gpu.kernel.kind") for _, s in spans)
    assert by_kind["kernel"] == 14 and by_kind["memcpy"] == 2
    roots = [s for _, s in spans if not s.parent_span_id]
    assert sorted(r.name for r in roots) == ["ProfilerStep", "ProfilerStep"]
    assert len({s.trace_id for _, s in spans}) == 2  # one trace per ProfilerStep
    ids = {(s.trace_id, s.span_id) for _, s in spans}
    assert all((s.trace_id, s.parent_span_id) in ids for _, s in spans if s.parent_span_id)  # parents arrived
    assert sum(attrs(r.attributes)["aaco.kernels.total"] for r in roots) == 16
    launches = [s for _, s in spans if attrs(s.attributes).get("aaco.span.kind") == "gpu.launch"]
    assert len(launches) == 16 and all(s.parent_span_id for s in launches)
    resource = attrs(spans[0][0].attributes)
    assert resource["host.name"] and resource["service.name"] == "aaco-agent"


def test_mi250_over_grpc(tmp_path, aaco_bin, samples):
    with GrpcReceiver() as rx:
        replay_to(
            aaco_bin,
            tmp_path,
            samples / "kineto" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
            f"http://127.0.0.1:{rx.port}",
        )
        check_mi250(rx.got.spans())
        assert rx.got.metadata[0].get("user-agent", "").startswith("aaco-agent")


def test_mi250_over_http_protobuf(tmp_path, aaco_bin, samples):
    with HttpReceiver() as rx:
        replay_to(
            aaco_bin,
            tmp_path,
            samples / "kineto" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
            f"http://127.0.0.1:{rx.port}",
            env={"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
        )
        check_mi250(rx.got.spans())
        assert rx.got.metadata[0]["content-encoding"] == "gzip"


def test_ids_are_deterministic_across_replays(tmp_path, aaco_bin, samples):
    trace = samples / "kineto" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    runs = []
    for i in range(2):
        with GrpcReceiver() as rx:
            replay_to(aaco_bin, tmp_path / str(i), trace, f"http://127.0.0.1:{rx.port}")
            runs.append(sorted((s.trace_id, s.span_id, s.parent_span_id) for _, s in rx.got.spans()))
    assert runs[0] == runs[1]


def test_kernels_without_iterations_form_a_capture_window_trace(tmp_path, aaco_bin, samples):
    with GrpcReceiver() as rx:
        replay_to(aaco_bin, tmp_path, samples / "kineto" / "a100_alexnet_trace.json.gz", f"http://127.0.0.1:{rx.port}")
        spans = [s for _, s in rx.got.spans()]
    roots = [s for s in spans if not s.parent_span_id]
    assert [r.name for r in roots] == ["capture window"]
    gpu = [s for s in spans if attrs(s.attributes).get("gpu.kernel.kind")]
    assert len(gpu) == 79 + 16 + 3
    assert {s.trace_id for s in spans} == {roots[0].trace_id}
    assert min(s.start_time_unix_nano for s in gpu) == roots[0].start_time_unix_nano


def service(tmp_path, trace, endpoint, **otlp):
    cfg = load_config(
        None,
        {
            "node": "n1",
            "sources": [{"type": "replay", "paths": [str(trace)]}],
            "exporters": {
                "prometheus": {"enabled": False},
                "lake": {"path": str(tmp_path / "lake")},
                "otlp": {"endpoint": endpoint, **otlp},
            },
        },
        env={},
    )
    return AgentService(cfg)


def run_to_end(svc, timeout=60):
    svc.start()
    deadline = time.monotonic() + timeout
    while not svc.sources_done() and time.monotonic() < deadline:
        time.sleep(0.05)
    svc.shutdown(timeout_s=30)


def test_over_budget_counts_add_up(tmp_path, samples):
    with GrpcReceiver() as rx:
        svc = service(
            tmp_path,
            samples / "kineto" / "a100_alexnet_trace.json.gz",
            f"http://127.0.0.1:{rx.port}",
            max_kernel_spans_per_trace=10,
        )
        run_to_end(svc)
        spans = [s for _, s in rx.got.spans()]
    (root,) = [s for s in spans if not s.parent_span_id]
    a = attrs(root.attributes)
    gpu = [s for s in spans if attrs(s.attributes).get("gpu.kernel.kind")]
    assert a["aaco.kernels.total"] == 98
    assert a["aaco.kernels.exported"] == len(gpu) == 10
    assert a["aaco.kernels.summarized"] + len(gpu) == 98
    assert svc.stats.total(__import__("aaco.exporters.otlp_assembly", fromlist=["x"]).SPANS_SUMMARIZED) == 88


def test_tls_with_a_self_signed_certificate(tmp_path, samples):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    creds = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    with GrpcReceiver(credentials=creds) as rx:
        svc = service(
            tmp_path,
            samples / "kineto" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
            f"https://localhost:{rx.port}",
            tls={"ca_file": str(cert)},
        )
        run_to_end(svc)
        check_mi250(rx.got.spans())


def test_upstream_down_then_back(tmp_path, samples):
    """30 s without a receiver, then one appears: no crash, bounded queue, every span delivered or counted.

    The outage is issue 4's 30 s. Retries are at most 1 s apart (``retry_max_interval_s``, which also caps
    the gRPC channel's reconnect backoff) instead of the default 16 s, so the receiver's return is noticed
    within a second rather than up to 20 s later: the 30 s of failed retries and the delivery are the same.
    """
    port = get_free_port()
    svc = service(
        tmp_path,
        samples / "kineto",
        f"http://127.0.0.1:{port}",
        queue_max_spans=100,
        max_spans_per_request=20,
        retry_max_elapsed_s=120,
        retry_max_interval_s=1.0,
    )
    svc.start()
    time.sleep(30)
    otlp = next(e for e in svc.exporters if e.name == "otlp")
    assert otlp.sender.queued <= 100  # bounded while the upstream is away
    assert svc.stats.get(EXPORT_ERRORS, exporter="otlp") > 0  # the outage was met: failed tries counted
    with GrpcReceiver(port=port) as rx:
        deadline = time.monotonic() + 60
        while not svc.sources_done() and time.monotonic() < deadline:
            time.sleep(0.1)
        svc.shutdown(timeout_s=40)
        received = len(rx.got.spans())
    delivered = svc.stats.get(EVENTS_EMITTED, component="exporter:otlp")
    dropped = svc.stats.total(EVENTS_DROPPED, component="exporter:otlp")
    encoded = svc.stats.total(__import__("aaco.exporters.otlp_assembly", fromlist=["x"]).SPANS_EXPORTED)
    assert received == delivered > 0
    assert delivered + dropped == encoded  # nothing vanished: delivered or counted as dropped


def test_bad_endpoint_is_one_clear_error(tmp_path, aaco_bin, samples):
    proc = run_aaco(
        aaco_bin,
        "replay",
        str(samples / "kineto"),
        "--out",
        str(tmp_path / "D"),
        "--otlp-endpoint",
        "ftp://collector:4317",
    )
    assert proc.returncode == 2
    assert "bad OTLP endpoint" in proc.stderr and "Traceback" not in proc.stderr


# The replays below wait for their shutdown deadline with the upstream down; 2 s instead of the default 10 s
# (the deadline's value is not their point: ending by it, and saying what was lost, is).
SHORT_DEADLINE = {"AACO_PIPELINE_SHUTDOWN_TIMEOUT_S": "2"}


def test_replay_exits_3_when_spans_it_was_asked_to_send_were_dropped(tmp_path, aaco_bin, samples):
    """Upstream down: the replay ends by its shutdown deadline, says how many were lost and why, and exits 3."""
    proc = run_aaco(
        aaco_bin,
        "replay",
        str(samples / "kineto" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
        "--out",
        str(tmp_path / "D"),
        "--otlp-endpoint",
        f"http://127.0.0.1:{get_free_port()}",
        timeout=120,
        env=SHORT_DEADLINE,
    )
    assert proc.returncode == 3, proc.stderr
    assert "34 span(s) not delivered over OTLP (exporter:otlp): not sent within pipeline.shutdown_timeout_s" in (
        proc.stderr
    )
    assert "metric point(s) not delivered over OTLP (exporter:otlp_metrics)" in proc.stderr
    assert "not sent within pipeline.shutdown_timeout_s=2s and dropped: exporter:otlp 34" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "AACO summary" in proc.stdout  # the replay itself went through


def test_replay_with_damaged_input_and_lost_spans_exits_2_and_says_both(tmp_path, aaco_bin, samples):
    whole = gzip.decompress((samples / "kineto" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz").read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    proc = run_aaco(
        aaco_bin,
        "replay",
        str(cut),
        "--out",
        str(tmp_path / "D"),
        "--otlp-endpoint",
        f"http://127.0.0.1:{get_free_port()}",
        timeout=120,
        env=SHORT_DEADLINE,
    )
    assert proc.returncode == 2, proc.stderr
    assert "truncated JSON" in proc.stderr and "span(s) not delivered over OTLP" in proc.stderr
