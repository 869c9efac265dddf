"""``aaco capture --pid P``: ask the running agent for a capture window of one process."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Annotated

import typer

from .cli import app, err_console, out_console
from .errors import AacoError


@app.command()
def capture(
    pid: Annotated[int, typer.Option("--pid", "-p", min=1, help="The GPU process to capture.")],
    agent: Annotated[str, typer.Option("--agent", help="The agent's metrics address (on this host).")] = (
        "http://127.0.0.1:9464"
    ),
    source: Annotated[str | None, typer.Option("--source", help="Which capture source (default: the first).")] = None,
) -> None:
    """Queue a capture of PID on the running agent (its `capture` source runs the profiler and ingests the result)."""
    query = {"pid": str(pid), **({"source": source} if source else {})}
    url = f"{agent.rstrip('/')}/api/v1/capture?{urllib.parse.urlencode(query)}"
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            doc = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        doc = json.loads(exc.read() or b"{}")
        err_console.print(f"[bold red]error:[/] {doc.get('error', exc.reason)}", highlight=False)
        raise typer.Exit(2) from None
    except (urllib.error.URLError, OSError) as exc:
        raise _no_agent(agent, exc) from None
    out_console.print(f"queued a capture of pid {doc['pid']} on source {doc['source']}", highlight=False)


def _no_agent(agent: str, exc: Exception) -> typer.Exit:
    err = AacoError(
        f"no agent answers ({getattr(exc, 'reason', exc)})",
        subject=agent,
        hint="is `aaco agent` running here with a capture source and metrics enabled?",
    )
    err_console.print(f"[bold red]error:[/] {err}", highlight=False)
    return typer.Exit(2)
