"""`aaco replay --perfetto FILE`: a Chrome-trace JSON that Perfetto's UI opens."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from .helpers import run_aaco

pytestmark = pytest.mark.integration


def test_perfetto_export_of_a_replay(tmp_path, aaco_bin, samples):
    out = tmp_path / "trace.json"
    proc = run_aaco(
        aaco_bin,
        "replay",
        str(samples / "kineto" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
        "--out",
        str(tmp_path / "D"),
        "--perfetto",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    cats = Counter(e.get("cat") for e in events if e["ph"] == "X")
    assert cats["kernel"] == 14 and cats["memcpy"] == 2 and cats["iteration"] == 2 and cats["launch"] == 16
    starts = {e["id"] for e in events if e["ph"] == "s"}
    ends = {e["id"] for e in events if e["ph"] == "f"}
    assert starts == ends and len(starts) == 16  # every launch has its arrow to the GPU work
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert "GPU 2" in names
    for e in events:  # the trace-event format's required fields
        assert {"ph", "pid"} <= set(e)
        if e["ph"] in ("X", "s", "f", "C"):
            assert isinstance(e["ts"], float | int) and e["ts"] > 1.7e15  # epoch microseconds
        if e["ph"] == "X":
            assert e["dur"] >= 0 and "tid" in e
