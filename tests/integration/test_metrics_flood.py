"""/metrics and its probes under hostile local clients (issue 27): nothing a local process does starves them.

A real ``aaco agent`` serves /metrics with basic auth (a cost-10 bcrypt hash, as htpasswd writes by
default). For 20 s, 16 clients send scrapes with a wrong password as fast as they are answered, and
64 connections each send half a request and wait (reconnecting when closed); meanwhile a scraper
with the right password and a prober of /healthz and /readyz come every half second, each on a new
connection (the harder case: no kept-alive connection to hide behind). Every one of theirs must be
answered 200 within 2 s.
"""

from __future__ import annotations

import socket
import threading
import time

import bcrypt
import pytest
import yaml

from tests.conftest import get_free_port
from tests.support.pki import basic

from .helpers import http_get, metric_value, start_aaco, wait_for

pytestmark = pytest.mark.integration

USER, PASSWORD = "prometheus", "the-right-password"
FLOOD_S, WRONG_CLIENTS, HALF_OPEN = 20.0, 16, 64


def request(port: int, path: str, auth: str | None) -> tuple[int, float]:
    """GET ``path`` on a new connection: (status, seconds); status 0 when the connection failed."""
    t0 = time.monotonic()
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    head += f"Authorization: {auth}\r\n" if auth else ""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall((head + "\r\n").encode())
            first = sock.recv(64)
            while sock.recv(65536):
                pass
        return int(first.split()[1]), time.monotonic() - t0
    except (OSError, IndexError, ValueError):
        return 0, time.monotonic() - t0


def test_scrapes_and_probes_are_answered_under_wrong_passwords_and_half_open_connections(tmp_path, aaco_bin, samples):
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {USER: hashed}}))
    port = get_free_port()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "sources": [{"type": "replay", "paths": [str(samples / "kineto")]}],
                "exporters": {"prometheus": {"port": port}, "lake": {"path": str(tmp_path / "lake")}},
            }
        )
    )
    agent = start_aaco(aaco_bin, "agent", "--config", str(cfg), "--web-config-file", str(web), log=tmp_path / "log")
    stop = threading.Event()
    legit: list[tuple[str, int, float]] = []
    floods = [0, 0]  # wrong-password answers, half-open connections made

    def wrong_password() -> None:
        while not stop.is_set():
            request(port, "/metrics", basic(USER, "wrong"))
            floods[0] += 1

    def half_open() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the rest
                    floods[1] += 1
                    while not stop.is_set():
                        try:
                            if not sock.recv(4096):
                                break  # closed (evicted, or timed out): come back at once
                        except TimeoutError:
                            continue
            except OSError:
                time.sleep(0.05)

    def scraper_and_prober() -> None:
        while not stop.is_set():
            legit.append(("/metrics", *request(port, "/metrics", basic(USER, PASSWORD))))
            for probe in ("/healthz", "/readyz"):
                legit.append((probe, *request(port, probe, None)))
            time.sleep(0.5)

    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200, timeout=60, what="a ready agent")
        threads = [threading.Thread(target=wrong_password) for _ in range(WRONG_CLIENTS)]
        threads += [threading.Thread(target=half_open) for _ in range(HALF_OPEN)]
        for t in threads:
            t.start()
        time.sleep(2)  # the flood is on before the first measured request
        measured = threading.Thread(target=scraper_and_prober)
        measured.start()
        time.sleep(FLOOD_S)
        stop.set()
        measured.join(30)
        for t in threads:
            t.join(30)
        status, text = http_get(f"http://127.0.0.1:{port}/metrics", auth=basic(USER, PASSWORD))
    finally:
        stop.set()
        agent.terminate()
        agent.wait(30)
    assert floods[0] > 100 and floods[1] >= HALF_OPEN, floods  # the flood was real
    assert len(legit) >= 3 * 20, len(legit)
    late = [(path, status, round(s, 2)) for path, status, s in legit if status != 200 or s > 2.0]
    assert late == [], f"{len(late)} of {len(legit)} scrapes and probes failed or took over 2 s: {late[:10]}"
    assert status == 200 and agent.returncode == 0
    evicted = metric_value(text, "aaco_http_connections_total", port="metrics", outcome="evicted")
    refused = metric_value(text, "aaco_metrics_server_refused_total", reason="bad_credentials")
    assert evicted and evicted > HALF_OPEN and refused and refused > 100, (evicted, refused)
