"""The OTLP receiver over TLS: the OpenTelemetry SDK sends through it, client certificates are enforced."""

from __future__ import annotations

import http.client
import os
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from aaco.agent.config import load_config
from aaco.agent.receivers.config import OtlpReceiverConfig
from aaco.agent.receivers.otlp import OtlpReceiver
from aaco.agent.service import AgentService
from aaco.contract.errors import AacoError
from aaco.contract.http_app import HTTP_CONNECTIONS
from aaco.contract.stats import Stats
from tests.conftest import get_free_port
from tests.support.otlp_json import rich_request, to_json
from tests.support.otlp_receivers import GrpcReceiver
from tests.support.pki import Pki, make_pki

pytestmark = pytest.mark.integration

TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


@pytest.fixture
def pki(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pki:
    """A throwaway CA, a server certificate for localhost/127.0.0.1 and a client certificate (never committed)."""
    # requests lets these variables override a session's own CA file, which the SDK's certificate_file sets
    # (psf/requests#3829): without them the exporter trusts the file it is given.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    return make_pki(tmp_path / "pki")


def agent(tmp_path: Path, upstream_port: int, tls: dict, grpc_port: int, http_port: int) -> AgentService:
    cfg = load_config(
        None,
        {
            "node": "gpu-node-1",
            "sources": [],
            "exporters": {
                "prometheus": {"enabled": False},
                "lake": {"path": str(tmp_path / "lake")},
                "otlp": {"endpoint": f"http://127.0.0.1:{upstream_port}", "trace_window_s": 0.5},
            },
            "receivers": {
                "otlp": {
                    "enabled": True,
                    "grpc_port": grpc_port,
                    "http_port": http_port,
                    "link_window_s": 0.5,
                    "tls": tls,
                }
            },
        },
        env={},
    )
    return AgentService(cfg)


def send_span(exporter, name: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "inference-api", "process.pid": os.getpid()}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("test").start_as_current_span(name):
        pass
    provider.shutdown()


def wait_for(cond, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sdk_spans_over_tls_arrive_upstream(tmp_path, pki, protocol):
    grpc_port, http_port = get_free_port(), get_free_port()
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    exporter = (
        GrpcSpanExporter(
            endpoint=f"localhost:{grpc_port}", credentials=grpc.ssl_channel_credentials((pki.ca).read_bytes())
        )
        if protocol == "grpc"
        else HttpSpanExporter(endpoint=f"https://localhost:{http_port}/v1/traces", certificate_file=str(pki.ca))
    )
    with GrpcReceiver() as upstream:
        svc = agent(tmp_path, upstream.port, tls, grpc_port, http_port)
        svc.start()
        try:
            send_span(exporter, f"POST /v1/infer over {protocol}")
        finally:
            svc.shutdown(timeout_s=20)
        assert [s.name for _, s in upstream.got.spans()] == [f"POST /v1/infer over {protocol}"]


def test_client_certificates_are_required_when_a_client_ca_is_set(tmp_path, pki):
    grpc_port, http_port = get_free_port(), get_free_port()
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), "client_ca_file": str(pki.ca)}
    ca = pki.ca.read_bytes()
    with GrpcReceiver() as upstream:
        svc = agent(tmp_path, upstream.port, tls, grpc_port, http_port)
        svc.start()
        try:
            send_span(
                HttpSpanExporter(
                    endpoint=f"https://localhost:{http_port}/v1/traces",
                    certificate_file=str(pki.ca),
                    client_certificate_file=str(pki.client_cert),
                    client_key_file=str(pki.client_key),
                ),
                "with a client certificate",
            )
            mutual = grpc.ssl_channel_credentials(ca, (pki.client_key).read_bytes(), (pki.client_cert).read_bytes())
            with grpc.secure_channel(f"localhost:{grpc_port}", mutual) as channel:
                channel.unary_unary(TRACES)(b"", timeout=10)  # accepted
            with grpc.secure_channel(f"localhost:{grpc_port}", grpc.ssl_channel_credentials(ca)) as channel:
                with pytest.raises(grpc.RpcError) as err:
                    channel.unary_unary(TRACES)(b"", timeout=10)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            https = http.client.HTTPSConnection(
                "localhost", http_port, timeout=10, context=ssl.create_default_context(cafile=str(pki.ca))
            )
            with pytest.raises((ssl.SSLError, ConnectionError)):
                https.request("POST", "/v1/traces", b"", {"Content-Type": "application/x-protobuf"})
                https.getresponse()
            https.close()
            wait_for(lambda: svc.stats.get(HTTP_CONNECTIONS, port="otlp_http", outcome="client_cert") == 1)
        finally:
            svc.shutdown(timeout_s=20)
        assert [s.name for _, s in upstream.got.spans()] == ["with a client certificate"]


@pytest.mark.parametrize("missing", ["cert_file", "key_file", "client_ca_file"])
def test_a_tls_file_that_cannot_be_read_names_the_file_and_the_setting(pki, missing):
    tls = {"cert_file": pki.server_cert, "key_file": pki.server_key, "client_ca_file": pki.ca}
    tls[missing] = pki.ca.with_name("nope.pem")
    config = OtlpReceiverConfig(enabled=True, grpc_port=0, http_port=0, tls=tls)
    rx = OtlpReceiver(config, Stats(), {}, None, None, None)
    with pytest.raises(AacoError, match=f"receivers.otlp.tls.{missing}") as err:
        rx.start()
    assert "nope.pem" in str(err.value)


def test_plain_http_to_the_tls_port_is_answered_400_naming_the_https_url(pki):
    """As Go's net/http does: a request line where a TLS handshake belongs gets a hint, not a silent close."""
    tls = {"cert_file": pki.server_cert, "key_file": pki.server_key}
    stats = Stats()
    rx = OtlpReceiver(OtlpReceiverConfig(enabled=True, grpc_port=0, http_port=0, tls=tls), stats, {}, None, None, None)
    rx.start()
    try:
        body, ctype = to_json(rich_request()), {"Content-Type": "application/json"}
        plain = urllib.request.Request(f"http://127.0.0.1:{rx.http_port}/v1/traces", body, ctype, method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(plain, timeout=10)
        assert err.value.code == 400
        hint = err.value.read().decode()
        assert hint == (
            "Client sent an HTTP request to an HTTPS server: this port speaks TLS; "
            f"use https://127.0.0.1:{rx.http_port}/v1/traces\n"
        )
        assert stats.get(HTTP_CONNECTIONS, port="otlp_http", outcome="plaintext_http") == 1
        https = urllib.request.Request(f"https://localhost:{rx.http_port}/v1/traces", body, ctype, method="POST")
        context = ssl.create_default_context(cafile=str(pki.ca))
        with urllib.request.urlopen(https, timeout=10, context=context) as r:
            assert (r.status, r.headers["Content-Type"], r.read()) == (200, "application/json", b"{}")
        assert stats.get(HTTP_CONNECTIONS, port="otlp_http", outcome="tls_failed") == 0
    finally:
        rx.shutdown(5)
