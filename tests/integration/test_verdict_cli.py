"""`aaco baseline save` and `aaco diff` on real lakes (ONNX Runtime runs) and synthetic ones (exact statistics).

Real regression: the same model name served by a heavier network (SqueezeNet, then ResNet-50: about
ten times the convolution FLOPs), run for real under ONNX Runtime. Real no-regression: one run's
iterations split alternately into two lakes, so both halves saw the same machine load (this machine
is shared: two consecutive runs of one model differ by tens of percent, which a correct test
reports as a regression of the machine, not of the model).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from scipy import stats

from aaco.agent.verdict.lake import read_lake
from aaco.contract import telemetry as tm
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.stats import Stats
from aaco.exporters.lake import LakeConfig, LakeExporter

from .helpers import run_aaco, run_aaco_each

pytestmark = pytest.mark.integration

MS, US = 1_000_000, 1_000
T0 = 1_700_000_000 * 1_000_000_000


def write_lake(root: Path, batches: list[tuple[str, pa.RecordBatch | pa.Table]], sources: list | None = None) -> Path:
    """A lake written by the real lake exporter."""
    lake = LakeExporter(LakeConfig(path=root), Stats())
    lake.start()
    for kind, b in batches:
        for rb in b.to_batches() if isinstance(b, pa.Table) else [b]:
            lake.export(EventBatch(kind, rb, "test"))
    lake.shutdown()
    if sources is not None:
        (root / "sources.json").write_text(json.dumps({"sources": sources}))
    return root


def light_model(tmp: Path, which: str) -> Path:
    """A copy of an onnx-wheel model as ``model.onnx`` (the same model name for every version)."""
    import onnx

    src = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{which}.onnx"
    dst = tmp / which / "model.onnx"
    dst.parent.mkdir(parents=True)
    shutil.copy(src, dst)
    return dst


@pytest.fixture(scope="module")
def ort_lakes(tmp_path_factory, aaco_bin):
    tmp = tmp_path_factory.mktemp("verdict")
    lakes = {}
    for which, n in (("squeezenet", 30), ("resnet50", 20)):
        out = tmp / f"lake_{which}"
        proc = run_aaco(
            aaco_bin,
            "run",
            "-m",
            str(light_model(tmp, which)),
            "-n",
            str(n),
            "--warmup",
            "3",
            "--out",
            str(out),
            "--no-progress",
        )
        assert proc.returncode == 0, proc.stderr
        lakes[which] = out
    return tmp, lakes


def test_baseline_save_records_samples_counts_families_class_and_environment(ort_lakes, aaco_bin):
    tmp, lakes = ort_lakes
    out = tmp / "saved" / "base.json"
    proc = run_aaco(aaco_bin, "baseline", "save", str(lakes["squeezenet"]), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"baseline: {out}" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["format"] == "aaco-baseline/1"
    m = doc["models"]["model"]
    analysis = json.loads((lakes["squeezenet"] / "analysis.json").read_text())
    assert m["iterations"] == 30 and len(m["latency_s"]) == 30
    lat = read_lake(lakes["squeezenet"]).table("iterations")
    assert m["latency_s"] == pytest.approx(((lat["end_ns"].to_numpy() - lat["start_ns"].to_numpy()) / 1e9).tolist())
    assert m["kernels_per_iteration"] == analysis["kar"]["models"]["model"]["kernels_per_iteration"]
    fam = analysis["families"]["models"]["model"]["families"]
    assert m["family_time_per_iteration_s"] == pytest.approx({f: v["per_iteration_s"] for f, v in fam.items()})
    # ONNX Runtime on the CPU: the device (the CPU) is busy ~all of each window running convolutions
    assert m["bottleneck"]["bottleneck_class"] == "compute-bound"
    live = analysis["bottleneck"]["models"]["model"]  # the replay of the lake agrees with the run
    assert m["bottleneck"]["confidence"] == pytest.approx(live["confidence"], abs=1e-3)
    assert [e["signal"] for e in m["bottleneck"]["top_evidence"]] == [e["signal"] for e in live["top_evidence"]]
    assert m["bottleneck"]["signals"] == pytest.approx(live["signals"])
    env = doc["environment"]
    assert env["execution_provider"] == {"value": "cpu", "source": "lake:iterations"}
    assert env["devices"] == {"value": ["cpu"], "source": "lake:kernels"}
    assert env["trace_formats"]["source"] == "lake:sources.json"
    import onnxruntime

    assert env["onnxruntime_version"] == {"value": f"onnxruntime {onnxruntime.__version__}", "source": "machine"}
    no_machine = tmp / "saved" / "nm.json"
    assert (
        run_aaco(
            aaco_bin, "baseline", "save", str(lakes["squeezenet"]), "-o", str(no_machine), "--no-machine"
        ).returncode
        == 0
    )
    assert {e["source"] for e in json.loads(no_machine.read_text())["environment"].values()} <= {
        "lake:iterations",
        "lake:kernels",
        "lake:sources.json",
    }


def test_a_heavier_model_is_a_compute_bound_regression(ort_lakes, aaco_bin):
    tmp, lakes = ort_lakes
    base = tmp / "squeeze.json"
    assert run_aaco(aaco_bin, "baseline", "save", str(lakes["squeezenet"]), "-o", str(base)).returncode == 0
    verdict_file = tmp / "verdict.json"
    proc = run_aaco(
        aaco_bin, "diff", "--baseline", str(base), "--session", str(lakes["resnet50"]), "--out", str(verdict_file)
    )
    assert proc.returncode == 1, proc.stderr  # a regression: CI fails
    v = json.loads(proc.stdout)
    assert json.loads(verdict_file.read_text()) == v
    assert v["regression"] is True and v["severity"] == "critical"
    assert v["suspected_cause"] == "compute-bound"
    assert v["recommendation"].startswith("More compute per iteration")
    assert v["latency_delta_pct"] > 100 and v["latency_delta_ci95_pct"][0] > 50 and v["p_value"] < 1e-4
    # the kernel counts are the graphs' (KAR in each run's analysis.json), the delta their ratio
    kpi = {
        w: json.loads((lakes[w] / "analysis.json").read_text())["kar"]["models"]["model"]["kernels_per_iteration"]
        for w in lakes
    }
    assert v["kernels"]["per_iteration"]["baseline"] == kpi["squeezenet"]
    assert v["kernels"]["per_iteration"]["session"] == kpi["resnet50"]
    assert v["evidence"]["kernel_launch_count_delta"] == f"{(kpi['resnet50'] / kpi['squeezenet'] - 1) * 100:+.0f}%"
    conv = v["kernels"]["family_time_per_iteration_s"]["convolution"]
    assert conv["session"] > 3 * conv["baseline"]
    assert v["attribution_per_iteration_s"]["compute_kernels_s"] > 0.5 * v["attribution_per_iteration_s"]["latency_s"]
    assert v["bottleneck"] == {"baseline": "compute-bound", "session": "compute-bound"}
    assert v["environment_differences"] == [] and "environment differs" not in proc.stderr
    # the p-value is Mann-Whitney's on the two lakes' latencies
    lat = {w: read_lake(lakes[w]).table("iterations") for w in lakes}
    secs = {w: (t["end_ns"].to_numpy() - t["start_ns"].to_numpy()) / 1e9 for w, t in lat.items()}
    assert v["p_value"] == pytest.approx(
        stats.mannwhitneyu(secs["resnet50"], secs["squeezenet"], alternative="greater").pvalue
    )


def split_alternately(src: Path, a: Path, b: Path) -> None:
    """Even iterations (and their kernels) to ``a``, odd ones to ``b``: two samples of the same run."""
    lake = read_lake(src)
    it, k = lake.table("iterations"), lake.table("kernels")
    order = pc.sort_indices(it, [("start_ns", "ascending")])
    it = it.take(order)
    even = np.arange(it.num_rows) % 2 == 0
    sources = json.loads((src / "sources.json").read_text())["sources"]
    for dst, mask in ((a, even), (b, ~even)):
        half = it.filter(pa.array(mask))
        ks = k.filter(pc.is_in(k["trace_id"], half["trace_id"]))
        write_lake(dst, [("iterations", conform("iterations", half)), ("kernels", conform("kernels", ks))], sources)


def test_the_same_model_is_not_a_regression(ort_lakes, aaco_bin):
    tmp, lakes = ort_lakes
    a, b = tmp / "even", tmp / "odd"
    split_alternately(lakes["squeezenet"], a, b)
    proc = run_aaco(aaco_bin, "diff", "-b", str(a), "-s", str(b))  # a lake directory works as the baseline
    assert proc.returncode == 0, proc.stdout + proc.stderr
    v = json.loads(proc.stdout)
    assert v["regression"] is False and v["severity"] == "none" and v["suspected_cause"] is None
    assert v["kernels"]["per_iteration"]["baseline"] == v["kernels"]["per_iteration"]["session"]
    assert v["evidence"]["kernel_launch_count_delta"] == "+0%"
    # one lake against itself: no change at all
    proc = run_aaco(aaco_bin, "diff", "-b", str(lakes["resnet50"]), "-s", str(lakes["resnet50"]))
    assert proc.returncode == 0, proc.stderr
    v = json.loads(proc.stdout)
    assert v["latency_delta_pct"] == 0.0 and v["latency_delta_ci95_pct"][0] <= 0 <= v["latency_delta_ci95_pct"][1]
    assert v["p_value"] > 0.4


# -- synthetic lakes: exact statistics ---------------------------------------------------------------


def synthetic(
    n_it: int, latency_ms: np.ndarray, kernels_per_it: int, kernel_us: float, launch_us: float, model: str = "bert"
):
    """Iterations with the given latencies; in each, kernels back to back from its start, each after a launch call."""
    starts = T0 + np.concatenate([[0], np.cumsum((latency_ms[:-1] * MS).astype(np.int64) + MS)])
    ends = starts + (latency_ms * MS).astype(np.int64)
    tids = [f"{i:032x}" for i in range(n_it)]
    it = conform(
        "iterations",
        {
            "start_ns": pa.array(starts, pa.int64()),
            "end_ns": pa.array(ends, pa.int64()),
            "node": ["n1"] * n_it,
            "pid": pa.array([7] * n_it, pa.int64()),
            "model": [model] * n_it,
            "run_id": ["r"] * n_it,
            "trace_id": tids,
            "span_id": [f"{i:016x}" for i in range(n_it)],
            "source": ["test"] * n_it,
            "iteration": pa.array(range(n_it), pa.int64()),
        },
    )
    step = int((kernel_us + launch_us) * US)
    ks = (starts[:, None] + step * np.arange(kernels_per_it)[None, :] + int(launch_us * US)).ravel()
    n = ks.size
    k = conform(
        "kernels",
        {
            "start_ns": pa.array(ks, pa.int64()),
            "end_ns": pa.array(ks + int(kernel_us * US), pa.int64()),
            "node": ["n1"] * n,
            "pid": pa.array([7] * n, pa.int64()),
            "tid": pa.array([7] * n, pa.int64()),
            "device": ["0"] * n,
            "stream": pa.array([0] * n, pa.int64()),
            "name": ["void at::native::vectorized_elementwise_kernel<4>"] * n,
            "kind": ["kernel"] * n,
            "correlation_id": pa.array(range(n), pa.int64()),
            "source": ["test"] * n,
            "launch_start_ns": pa.array(ks - int(launch_us * US), pa.int64()),
            "launch_end_ns": pa.array(ks, pa.int64()),
            "model": [model] * n,
            "run_id": ["r"] * n,
            "iteration": pa.array(np.repeat(np.arange(n_it), kernels_per_it), pa.int64()),
            "trace_id": list(np.repeat(np.array(tids, dtype=object), kernels_per_it)),
        },
    )
    return it, k


def gpu_telemetry(product: str, clock_hz: float) -> pa.RecordBatch:
    s = tm.GpuSample(tm.GpuIdentity("0", model=product, vendor="amd"))
    s.add(tm.UTILIZATION, 0.9)
    s.add(tm.CLOCK, clock_hz, clock="graphics")
    s.add(tm.CLOCK_MAX, 1.7e9, clock="graphics")
    return conform("telemetry", tm.to_table([s], ts_ns=T0, node="n1", source="smi"))


LAT = 10.0 * (1 + 0.02 * np.sin(np.arange(40)))  # ms, 40 iterations


@pytest.fixture(scope="module")
def synthetic_lakes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("synthetic")
    base = write_lake(
        tmp / "base",
        [
            ("telemetry", gpu_telemetry("AMD Instinct MI250X", 1.7e9)),
            *(
                (kind, b)
                for kind, b in zip(("iterations", "kernels"), synthetic(40, LAT, 100, 30.0, 20.0), strict=True)
            ),
        ],
    )
    # a graph split into more, shorter kernels: 167 per iteration of 19.5 us; every iteration 20 % longer
    launchy = write_lake(
        tmp / "launchy",
        [
            ("telemetry", gpu_telemetry("AMD Instinct MI250X", 1.7e9)),
            *(
                (kind, b)
                for kind, b in zip(("iterations", "kernels"), synthetic(40, LAT * 1.2, 167, 19.5, 20.0), strict=True)
            ),
        ],
    )
    # the same kernels, 25 % slower, on another GPU model running at 1.275 of its 1.7 GHz
    hot = write_lake(
        tmp / "hot",
        [
            ("telemetry", gpu_telemetry("AMD Instinct MI300X", 1.275e9)),
            *(
                (kind, b)
                for kind, b in zip(("iterations", "kernels"), synthetic(40, LAT * 1.25, 100, 37.5, 20.0), strict=True)
            ),
        ],
    )
    return tmp, base, launchy, hot


def test_exact_statistics_and_the_launch_bound_cause(synthetic_lakes, aaco_bin):
    _, base, launchy, _ = synthetic_lakes
    proc = run_aaco(aaco_bin, "diff", "-b", str(base), "-s", str(launchy), "--no-machine")
    assert proc.returncode == 1, proc.stderr
    v = json.loads(proc.stdout)
    assert v["model"] == "bert"
    assert v["latency_delta_pct"] == pytest.approx(20.0, abs=0.01)  # every latency x1.2: the median too
    lo, hi = v["latency_delta_ci95_pct"]
    assert lo <= 20.0 <= hi and lo > 5
    b, s = LAT / 1e3, LAT * 1.2 / 1e3
    assert v["p_value"] == pytest.approx(stats.mannwhitneyu(s, b, alternative="greater").pvalue, rel=1e-6)
    assert v["regression"] is True and v["severity"] == "high" and v["confidence"] == 1.0
    assert v["suspected_cause"] == "launch-bound"
    assert v["evidence"]["kernel_launch_count_delta"] == "+67%"
    assert v["evidence"]["avg_kernel_duration_delta"] == "-35%"
    # CPU time in launch calls over iteration time: 100 x 20 us / ~10 ms vs 167 x 20 us / ~12 ms
    expected = (167 * 20 / (LAT * 1.2 * 1e3).mean()) / (100 * 20 / (LAT * 1e3).mean()) - 1
    assert v["evidence"]["cpu_overhead_delta"] == f"{expected * 100:+.0f}%"
    assert v["recommendation"].startswith("More and shorter kernels per iteration: investigate graph partitioning")
    assert v["environment_differences"] == []


def test_environment_differences_warn_and_lower_clocks_are_throttling(synthetic_lakes, aaco_bin):
    tmp, base, _, hot = synthetic_lakes
    saved = tmp / "b.json"
    assert run_aaco(aaco_bin, "baseline", "save", str(base), "-o", str(saved), "--no-machine").returncode == 0
    proc = run_aaco(aaco_bin, "diff", "-b", str(saved), "-s", str(hot), "--no-machine")
    assert proc.returncode == 1
    assert "warning: environment differs" in proc.stderr
    assert "gpu_model: AMD Instinct MI250X -> AMD Instinct MI300X" in proc.stderr
    assert "clocks.graphics.median_hz" in proc.stderr
    v = json.loads(proc.stdout)
    assert {d["key"] for d in v["environment_differences"]} == {"gpu_model", "clocks.graphics.median_hz"}
    assert v["suspected_cause"] == "throttled" and v["clock_drop"] == pytest.approx(0.25)
    assert v["latency_delta_pct"] == pytest.approx(25.0, abs=0.01)


# -- bad input: one line naming the file, exit 2 -----------------------------------------------------


def assert_bad(proc, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in proc.stderr.replace("\n", ""), (n, proc.stderr)


def test_missing_and_damaged_inputs(synthetic_lakes, aaco_bin, tmp_path):
    _, base, launchy, _ = synthetic_lakes
    missing = tmp_path / "nope"
    damaged = tmp_path / "damaged"
    shutil.copytree(launchy, damaged)
    part = sorted((damaged / "kernels").rglob("part-*.parquet"))[0]
    part.write_bytes(b"PAR1 this is not parquet")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something-else", "models": {}}))
    bad_sources = tmp_path / "bad_sources"
    shutil.copytree(launchy, bad_sources)
    (bad_sources / "sources.json").write_text("[")
    cases = [  # (command, what its error must name); the commands are independent and run side by side
        (("diff", "-b", str(base), "-s", str(missing)), (str(missing), "no such lake directory")),
        (("baseline", "save", str(missing)), (str(missing),)),
        (("diff", "-b", str(base), "-s", str(damaged)), (str(part), "not a readable Parquet part")),
        (("diff", "-b", str(bad_json), "-s", str(launchy)), (str(bad_json), "not valid JSON")),
        (("diff", "-b", str(other), "-s", str(launchy)), (str(other), "not an AACO baseline")),
        (("baseline", "save", str(bad_sources)), (str(bad_sources / "sources.json"),)),
        (("diff", "-b", str(base), "-s", str(launchy), "--model", "gpt"), ("--model", "gpt", "bert")),
        (("diff", "-b", str(base)), ("--session",)),  # usage error
    ]
    for (_, needles), proc in zip(cases, run_aaco_each(aaco_bin, *(c for c, _ in cases)), strict=True):
        assert_bad(proc, *needles)


def test_lakes_without_enough_iterations(samples, aaco_bin, tmp_path):
    lake, two = tmp_path / "kineto", tmp_path / "two"
    replays = run_aaco_each(  # a lake each: side by side, and so are the two commands that read them
        aaco_bin,
        ("replay", str(samples / "kineto" / "a100_alexnet_trace.json.gz"), "--out", str(lake)),
        ("replay", str(samples / "kineto" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"), "--out", str(two)),
    )
    assert [proc.returncode for proc in replays] == [0, 0], [proc.stderr for proc in replays]
    save, diff = run_aaco_each(aaco_bin, ("baseline", "save", str(lake)), ("diff", "-b", str(two), "-s", str(two)))
    assert_bad(save, str(lake / "iterations"), "no iterations")
    assert_bad(diff, "at least 5 iterations", str(two))


def test_a_session_of_another_model_is_bad_input_unless_allowed(synthetic_lakes, aaco_bin):
    tmp, base, _, _ = synthetic_lakes
    other = write_lake(
        tmp / "other_model",
        [
            ("telemetry", gpu_telemetry("AMD Instinct MI250X", 1.7e9)),
            *(
                (kind, b)
                for kind, b in zip(
                    ("iterations", "kernels"), synthetic(40, LAT, 100, 30.0, 20.0, model="gpt"), strict=True
                )
            ),
        ],
    )
    out = tmp / "verdict_other.json"
    proc = run_aaco(aaco_bin, "diff", "-b", str(base), "-s", str(other), "--no-machine", "-o", str(out))
    assert_bad(proc, "'bert'", "'gpt'", "--allow-model-change")
    assert not out.exists()
    allowed = run_aaco(aaco_bin, "diff", "-b", str(base), "-s", str(other), "--no-machine", "--allow-model-change")
    assert allowed.returncode == 0, allowed.stderr
    v = json.loads(allowed.stdout)
    assert (v["baseline_model"], v["model"]) == ("bert", "gpt")
