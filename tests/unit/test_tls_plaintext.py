"""The answer TLS ports give plain HTTP (``contract/tls.py``): what counts as plain HTTP, the URL it names."""

from __future__ import annotations

import pytest

from aaco.contract.tls import plaintext_answer

CLIENT_HELLO = bytes.fromhex("160301020001") + bytes(64)  # a TLS handshake record's header, then its body


def body_of(answer: bytes | None) -> str:
    assert answer is not None
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in head
    assert f"Content-Length: {len(body)}".encode() in head
    return body.decode()


@pytest.mark.parametrize("first", [CLIENT_HELLO, b"\x16", b"", b"get / HTTP/1.1\r\n", b"\x80\x2e\x01", b"G\x00"])
def test_a_tls_handshake_or_anything_else_is_left_to_the_handshake(first):
    assert plaintext_answer(first, ("127.0.0.1", 4318)) is None


def test_the_host_and_path_the_client_asked_for_are_named():
    request = b"POST /v1/traces?x=1 HTTP/1.1\r\nHost: otel.example:4318\r\nContent-Length: 2\r\n\r\n{}"
    assert body_of(plaintext_answer(request, ("10.0.0.5", 4318))).endswith(
        "this port speaks TLS; use https://otel.example:4318/v1/traces?x=1\n"
    )


@pytest.mark.parametrize(
    ("first", "local", "url"),
    [
        (b"GET /metrics HTTP/1.0\r\n\r\n", ("127.0.0.1", 9464), "https://127.0.0.1:9464/metrics"),
        (b"GE", ("::1", 9464, 0, 0), "https://[::1]:9464/"),  # only the method's start has come yet
        (b"HEAD / HTTP/1.1\r\nHost: <script>\r\n\r\n", ("127.0.0.1", 1), "https://127.0.0.1:1/"),  # not a host
    ],
)
def test_without_a_usable_host_header_the_address_reached_is_named(first, local, url):
    assert body_of(plaintext_answer(first, local)).endswith(f"use {url}\n")
