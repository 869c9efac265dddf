"""Baselines and verdicts over in-memory lakes: model pairing, several models, the headline, input errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from aaco.agent.verdict.baselines import build_baseline, diff, load_baseline, pair_models, save_baseline
from aaco.agent.verdict.lake import Lake
from aaco.contract.errors import AacoError

from .builders import iterations, kernels

MS = 1_000_000


def lake(root: Path, models: dict[str, float]) -> Lake:
    """A lake with 20 iterations per model of ``ms`` (+-1 %), each with one 1 ms GEMM kernel."""
    its, ks = [], []
    for i, (model, ms) in enumerate(sorted(models.items())):
        base = i * 10**12
        lengths = (ms * MS * (1 + 0.01 * np.sin(np.arange(20)))).astype(np.int64)
        starts = base + np.cumsum([0, *lengths[:-1]]) + np.arange(20) * MS
        b = iterations(list(zip(starts.tolist(), (starts + lengths).tolist(), strict=True)), model=model, run_id=model)
        its.append(b)
        ks.append(
            kernels(
                starts.tolist(),
                (starts + MS).tolist(),
                name=["Cijk_gemm"] * 20,
                model=[model] * 20,
                run_id=[model] * 20,
                trace_id=b.column("trace_id"),
                iteration=list(range(20)),
            )
        )
    out = Lake(root)
    out.tables["iterations"] = pa.Table.from_batches(its)
    out.tables["kernels"] = pa.Table.from_batches(ks)
    return out


def test_several_models_headline_the_worst_and_regression_is_any(tmp_path):
    base = build_baseline(lake(tmp_path / "a", {"bert": 10.0, "resnet": 20.0}), machine=False)
    assert set(base["models"]) == {"bert", "resnet"}
    assert base["models"]["bert"]["kernels_per_iteration"] == 1.0
    # 1 ms of GEMM per 10 ms iteration: the device idles 90 % of the window, the host sets the pace
    assert base["models"]["bert"]["bottleneck"]["bottleneck_class"] == "CPU-bound"
    verdict, warnings = diff(base, lake(tmp_path / "b", {"bert": 10.0, "resnet": 30.0}), machine=False)
    assert warnings == []
    assert verdict["model"] == "resnet" and verdict["regression"] is True
    assert verdict["latency_delta_pct"] == pytest.approx(50.0, abs=0.01)
    assert verdict["models"]["bert"]["regression"] is False and verdict["models"]["bert"]["latency_delta_pct"] == 0.0
    only, _ = diff(base, lake(tmp_path / "c", {"bert": 10.0, "resnet": 30.0}), model="bert", machine=False)
    assert only["regression"] is False and "models" not in only


def test_pairing_rules():
    assert pair_models({"a": 1, "b": 1}, {"b": 1, "c": 1}, None) == ([("b", "b")], [])
    pairs, warnings = pair_models({"v1": 1}, {"v2": 1}, None)
    assert pairs == [("v1", "v2")] and "comparing model 'v1'" in warnings[0]
    with pytest.raises(AacoError, match="no model in both"):
        pair_models({"a": 1, "b": 1}, {"c": 1}, None)
    with pytest.raises(AacoError, match="not in the session"):
        pair_models({"a": 1}, {"c": 1}, "a")


def test_saved_baselines_load_back_and_bad_ones_are_named(tmp_path):
    doc = build_baseline(lake(tmp_path / "a", {"bert": 10.0}), models=["bert"], machine=False)
    path = tmp_path / "saved" / "b.json"
    save_baseline(doc, path)
    assert load_baseline(path)["models"]["bert"]["latency_s"] == doc["models"]["bert"]["latency_s"]
    with pytest.raises(AacoError, match="--model"):
        build_baseline(lake(tmp_path / "x", {"bert": 10.0}), models=["gpt"], machine=False)
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "aaco-baseline/1", "models": {"bert": {"latency_s": ["x"]}}}')
    with pytest.raises(AacoError, match="latency_s is not a list of numbers") as err:
        load_baseline(broken)
    assert str(broken) in str(err.value)
    with pytest.raises(AacoError, match="no iterations"):
        build_baseline(Lake(tmp_path / "empty"), machine=False)
