"""What ``aaco agent`` loads for GPU telemetry alone: no OTLP stack, no rich, Arrow on malloc.

Each of these costs the daemon's memory (docs/performance.md, "Memory and CPU budget"): the
OpenTelemetry SDK, gRPC and protobuf ~14 MiB, rich with typer's help formatting ~7 MiB, scipy ~70 MiB,
mimalloc's retained pages ~6-9 MiB. The agent runs in a subprocess with an smi-only configuration
until it serves its first GPU sample; the modules it holds then are checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

KEPT_OUT = ("opentelemetry", "grpc", "google.protobuf", "rich", "markdown_it", "pygments", "scipy", "pandas")

RUN_AGENT = """
import json, os, signal, sys, threading, time, urllib.request
from aaco.agent.cli import main

port, out = sys.argv[1], sys.argv[2]
seen = {}

def watch():
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                body = resp.read().decode()
        except OSError:
            body = ""
        if 'aaco_gpu_up{' in body:
            import pyarrow as pa

            seen["modules"] = sorted(sys.modules)
            seen["arrow_pool"] = pa.default_memory_pool().backend_name
            break
        time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=watch, daemon=True).start()
sys.argv = ["aaco", "agent", "--config", sys.argv[3]]
try:
    main()
except SystemExit as exc:
    seen["exit"] = exc.code
with open(out, "w") as fh:
    json.dump(seen, fh)
"""


def test_an_smi_only_agent_loads_no_otlp_stack_no_rich_and_uses_malloc_for_arrow(
    samples: Path, tmp_path: Path, free_port: int
) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"""node: n1
sources:
  - type: smi
    backend: file
    file: {samples / "sysfs" / "amdgpu_card0.ttar"}
    interval_s: 0.2
    kubelet_socket: null
exporters:
  prometheus: {{port: {free_port}}}
  lake: {{path: {tmp_path / "lake"}}}
log_level: warning
"""
    )
    out = tmp_path / "seen.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ARROW_DEFAULT"))}
    proc = subprocess.run(
        [sys.executable, "-c", RUN_AGENT, str(free_port), str(out), str(cfg)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    seen = json.loads(out.read_text())
    assert "modules" in seen, f"the agent never served a GPU sample: {proc.stderr[-3000:]}"
    assert seen["exit"] in (0, None), proc.stderr[-3000:]
    loaded = [m for m in seen["modules"] if any(m == k or m.startswith(k + ".") for k in KEPT_OUT)]
    assert loaded == []
    assert "aaco.exporters.prometheus" in seen["modules"] and "aaco.exporters.lake" in seen["modules"]
    assert seen["arrow_pool"] == "system"
