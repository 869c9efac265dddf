"""``aaco capture --pid P``: ask the running agent for a capture window of one process.

The request carries an admin credential: the bearer token of ``--token-file`` (the agent's
``admin.token_file``) to the metrics port, or, with ``--socket``, none but the caller's own uid,
which the agent reads from the Unix socket (it must be in ``admin.allowed_uids``). Both default to
the environment variables that set the agent's own (``AACO_ADMIN_TOKEN_FILE``, ``AACO_ADMIN_SOCKET``),
so where the agent runs with them, ``aaco capture --pid P`` needs no flag.
"""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from aaco.agent.cli.common import AsJson, fail, out_console, print_error
from aaco.contract.errors import AacoError

if TYPE_CHECKING:
    import http.client

TIMEOUT_S = 10.0
# The agent's default admin.token_file: aaco.agent.admin imports pydantic (~0.1 s), so aaco --help does not
# import it for this; tests/unit/test_cli_behaviour.py keeps the two equal.
DEFAULT_TOKEN_FILE = Path("/var/lib/aaco/admin-token")


def capture(
    pid: Annotated[int, typer.Option("--pid", "-p", min=1, help="The GPU process to capture.")],
    agent: Annotated[str, typer.Option("--agent", help="The agent's metrics address (on this host).")] = (
        "http://127.0.0.1:9464"
    ),
    source: Annotated[str | None, typer.Option("--source", help="Which capture source (default: the first).")] = None,
    token_file: Annotated[
        Path,
        typer.Option(
            "--token-file", envvar="AACO_ADMIN_TOKEN_FILE", help="The agent's admin token (its admin.token_file)."
        ),
    ] = DEFAULT_TOKEN_FILE,
    socket_path: Annotated[
        Path | None,
        typer.Option(
            "--socket",
            envvar="AACO_ADMIN_SOCKET",
            help="Ask over the agent's admin.socket instead (no token: your uid is checked).",
        ),
    ] = None,
    cacert: Annotated[
        Path | None,
        typer.Option("--cacert", help="CA certificate that signed the agent's TLS certificate (an https --agent)."),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Queue a capture of PID on the running agent (its `capture` source runs the profiler and ingests the result)."""
    import http.client

    from aaco.agent.admin import read_token
    from aaco.agent.admin_socket import UnixHTTPConnection

    query = {"pid": str(pid), **({"source": source} if source else {})}
    target = "/api/v1/capture?" + urllib.parse.urlencode(query)
    headers = {"Content-Length": "0"}
    where = str(socket_path) if socket_path is not None else agent
    try:
        if socket_path is not None:
            conn: http.client.HTTPConnection = UnixHTTPConnection(socket_path, timeout=TIMEOUT_S)
        else:
            conn = _tcp(agent, cacert)
            headers["Authorization"] = f"Bearer {read_token(token_file)}"
        try:
            conn.request("POST", target, headers=headers)
            resp = conn.getresponse()
            status, body = resp.status, resp.read()
        finally:
            conn.close()
    except AacoError as exc:
        raise fail(exc) from None
    except (OSError, http.client.HTTPException) as exc:
        raise _no_agent(where, exc) from None
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        doc = {"error": body[:200].decode(errors="replace")}
    if status >= 300:
        print_error(f"{status}: {doc.get('error', 'refused')}")
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    out_console.print(f"queued a capture of pid {doc['pid']} on source {doc['source']}", highlight=False)


def _tcp(agent: str, cacert: Path | None) -> http.client.HTTPConnection:
    import http.client
    import ssl

    url = urllib.parse.urlsplit(agent if "://" in agent else f"http://{agent}")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise AacoError("expected http://HOST:PORT or https://HOST:PORT", subject="--agent")
    if url.scheme == "http":
        return http.client.HTTPConnection(url.hostname, url.port, timeout=TIMEOUT_S)
    try:
        context = ssl.create_default_context(cafile=cacert)
    except (OSError, ssl.SSLError) as exc:
        raise AacoError(f"cannot read the CA certificate: {exc}", subject=str(cacert), hint="check --cacert") from exc
    return http.client.HTTPSConnection(url.hostname, url.port, timeout=TIMEOUT_S, context=context)


def _no_agent(agent: str, exc: Exception) -> typer.Exit:
    err = AacoError(
        f"no agent answers ({exc})",
        subject=agent,
        hint="is `aaco agent` running here with a capture source and metrics enabled (or admin.socket set)?",
    )
    return fail(err)
