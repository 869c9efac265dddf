"""Kineto's CUPTI profiler ranges against Holistic Trace Analysis' ``get_cupti_counter_data_with_operators``.

HTA's answers on its own sample (``examples/data/kineto-hta/cupti_profiler_trace.json.gz``, a
ResNet-style benchmark with the nine SASS FLOP counters per kernel) are those HTA 0.5.0 wrote
(``tests/data/cupti_hta``: HTA's call graph does not run on pandas 3, so they were written by
``hta_cupti_oracle.py`` under pandas 2); AACO reads the same file with its counters reader: every
kernel's counters, its name and its top-level and innermost operators equal HTA's, kernel by kernel
in time order.
"""

from __future__ import annotations

import json

import pytest

from aaco.agent.sources.counters.kineto import read_kineto_counters
from aaco.contract.counters import dispatches
from aaco.contract.roofline import sass_flops
from tests.conftest import ROOT, SAMPLES

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TRACE = SAMPLES / "kineto-hta" / "cupti_profiler_trace.json.gz"
FLOP_COUNTERS = [
    f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum"
    for op in ("ffma", "fmul", "fadd", "hfma", "hmul", "hadd", "dfma", "dmul", "dadd")
]


@pytest.fixture(scope="module")
def hta_rows() -> list[dict]:
    return json.loads((ROOT / "tests" / "data" / "cupti_hta" / "hta-0.5.0.json").read_text())["rows"]


def test_every_kernel_s_counters_and_operators_equal_hta_s(hta_rows: list[dict]):
    problems: list[str] = []
    ours = sorted(dispatches(read_kineto_counters(TRACE, problems)), key=lambda d: d.dispatch_id)
    assert problems == []
    assert len(ours) == len(hta_rows) == 77
    rows = {(r.dispatch_id, r.counter): r for r in read_kineto_counters(TRACE)}
    for d, theirs in zip(ours, hta_rows, strict=True):
        assert d.kernel == theirs["name"]
        assert {n: d.counters[n] for n in FLOP_COUNTERS} == theirs["counters"], d.dispatch_id
        assert rows[(d.dispatch_id, FLOP_COUNTERS[0])].top_op == theirs["top_level_op"]
        assert rows[(d.dispatch_id, FLOP_COUNTERS[0])].op_name == theirs["bottom_level_op"]


def test_the_sixth_kernel_as_hta_s_own_test_reads_it():
    """HTA's test_cupti_profiler: the 6th kernel is fft2d_r2c_32x32 under aten::conv2d / aten::cudnn_convolution."""
    rows = [r for r in read_kineto_counters(TRACE) if r.dispatch_id == 5]
    fadd = {r.counter: r.value for r in rows}["smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"]
    assert fadd == 86114304
    assert "fft2d_r2c_32x32" in rows[0].kernel
    assert (rows[0].top_op, rows[0].op_name) == ("aten::conv2d", "aten::cudnn_convolution")
    # FLOPs as HTA's CUDA_SASS_INSTRUCTION_COUNTER_FLOPS counts them: an FMA two, the rest one
    (d,) = [d for d in dispatches(rows)]
    assert sass_flops(d.counters) == 2 * 61734912 + 25362432 + 86114304
