"""The bottleneck class of real traces, replayed through the agent into a lake.

- MI250 training loop (Kineto, ROCm 6.2): 10 of its 14 kernels run under 10 us (mean 7.9 us), and
  the HIP launch calls fill 72 % of the step time while the GPU is idle 98 % of its window. The
  GPU finishes each kernel faster than the host can launch the next: launch-bound.
- A100 AlexNet benchmark (Kineto, CUPTI), no profiler steps and a process named only ``python3.10``
  (an interpreter says nothing), so the model is the file's stem, ``a100_alexnet_trace``. Over its
  12.9 s window the GPU is busy 0.5 % of the time, its kernels are long (mean 135 us) and few.
  Whatever the host does, the GPU waits for it: CPU-bound (no scheduler data: with less confidence).
"""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest

from .helpers import read_lake, run_aaco

pytestmark = pytest.mark.integration

MI250 = "mi250_minitoy_train_ROCm6_2_kineto"
A100 = "a100_alexnet_trace"  # the file stem (see the module doc)


@pytest.fixture(scope="module")
def kineto_lake(tmp_path_factory, samples, aaco_bin):
    out = tmp_path_factory.mktemp("bn") / "lake"
    proc = run_aaco(aaco_bin, "replay", str(samples / "kineto"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def test_real_kineto_traces_are_classified(kineto_lake):
    doc = json.loads((kineto_lake / "analysis.json").read_text())["bottleneck"]["models"]
    mi = doc[MI250]
    assert mi["bottleneck_class"] == "launch-bound"
    assert mi["signals"]["microkernel_pct"] == pytest.approx(10 / 14)
    assert mi["signals"]["avg_kernel_duration_us"] == pytest.approx(7.92, abs=0.01)
    assert mi["signals"]["cpu_overhead_ratio"] == pytest.approx(0.721, abs=0.001)
    assert mi["top_evidence"][0] == {"signal": "microkernel_pct", "value": 0.7143, "weight": 0.3}
    assert 0.3 < mi["confidence"] < 1
    assert set(doc) == {MI250, A100}
    alex = doc[A100]
    assert alex["bottleneck_class"] == "CPU-bound"
    assert alex["signals"]["gpu_idle_ratio"] == pytest.approx(0.9949, abs=1e-4)
    assert alex["top_evidence"][0]["signal"] == "gpu_idle_ratio"
    # memory-bound is gated off: 84 % of its busy time is copies, but the device is idle
    assert alex["signals"]["memory_ops_ratio"] > 0.8 and alex["scores"]["memory-bound"] == 0.0
    assert "sched_interference_index" in alex["missing_signals"]
    assert alex["coverage"]["CPU-bound"] == pytest.approx(0.4)


def test_findings_reach_the_lake(kineto_lake):
    findings = read_lake(kineto_lake, "findings")
    mine = findings.filter(pc.equal(findings["analyzer"], "bottleneck")).to_pylist()
    by_subject = {f["subject"]: f for f in mine}
    assert set(by_subject) == {MI250, A100}
    f = by_subject[MI250]
    assert f["severity"] == "info" and "launch-bound" in f["summary"]
    assert json.loads(f["evidence_json"])["bottleneck_class"] == "launch-bound"
    assert f["ts_ns"] == 1739836029612561813  # the trace's own time (its last profiler step's end), not the replay's
