"""The capture source: scheduled and on-demand windows, bounded, ingested (rocprofv3 cannot run here:
the command copies a real sample where rocprofv3 would write). A capture is named by its process:
the targets run ``python train_sleeper.py``, so their kernels are the model ``train_sleeper``.
Who may ask for a capture is tested in test_admin_auth.py; here ``aaco capture`` sends the token."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pyarrow.compute as pc
import pytest
import yaml

from aaco.agent.sources.capture import CAPTURES, MODEL_FILE
from tests.conftest import get_free_port
from tests.support.processes import sleepers as running_sleepers

from .helpers import http_get, metric_value, read_lake, run_aaco, start_aaco, wait_for

pytestmark = pytest.mark.integration


MODEL = "train_sleeper"  # what the targets' command line, python train_sleeper.py, names


@pytest.fixture
def sleepers(tmp_path):
    with running_sleepers(tmp_path, 2, MODEL) as pids:
        yield pids


def source(tmp_path, samples, targets, interval_s, command=None, **extra):
    """A capture source copying a real rocprofv3 sample where the profiler would write."""
    sample = samples / "rocprofv3" / "kernel_trace.csv"
    return {
        "type": "capture",
        "command": command or f"cp {sample} {{out}}/{{pid}}_kernel_trace.csv",
        "out_dir": str(tmp_path / "captures"),
        "targets": targets,
        "interval_s": interval_s,
        "min_gap_s": 120,
        "duration_ms": 100,
        **extra,
    }


def config(tmp_path, samples, port, targets, interval_s, command=None, sources=None, **extra):
    """The agent's configuration: one capture source (or ``sources``), its admin token in tmp_path."""
    path = tmp_path / "agent.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "node": "cap-node",
                "sources": sources or [source(tmp_path, samples, targets, interval_s, command, **extra)],
                "admin": {"token_file": str(tmp_path / "admin-token")},
                "exporters": {
                    "prometheus": {"port": port},
                    "lake": {"path": str(tmp_path / "lake"), "flush_interval_s": 0.3},
                },
                "pipeline": {"snapshot_interval_s": 0.5},
            }
        )
    )
    return path


def ok_captures(base: str, source: str) -> float | None:
    return metric_value(http_get(base + "/metrics")[1], "aaco_captures_total", source=source, outcome="ok")


def test_scheduled_and_on_demand_captures(tmp_path, aaco_bin, samples, sleepers):
    port = get_free_port()
    first, second = sleepers
    # one source captures its target on a schedule, the other only when asked (each only its own target);
    # each in its own out_dir (a source takes whatever it finds in its out_dir at start as its own leftovers)
    scheduled = {**source(tmp_path, samples, [first], interval_s=0.5), "name": "scheduled"}
    on_demand = {**source(tmp_path, samples, [second], interval_s=0), "name": "on-demand"}
    on_demand["out_dir"] = str(tmp_path / "captures-on-demand")
    cfg = config(tmp_path, samples, port, None, 0, sources=[scheduled, on_demand])
    agent = start_aaco(aaco_bin, "agent", "--config", str(cfg), log=tmp_path / "agent.log")
    base = f"http://127.0.0.1:{port}"
    ask = ("capture", "--agent", base, "--token-file", str(tmp_path / "admin-token"), "--source", "on-demand")
    try:
        wait_for(lambda: http_get(base + "/readyz")[0] == 200, 60, what="ready")
        wait_for(lambda: ok_captures(base, "scheduled") == 1, 60, what="the scheduled capture")
        # on demand, through the command line, with the token the agent generated
        proc = run_aaco(aaco_bin, *ask, "--pid", str(second))
        assert proc.returncode == 0, proc.stderr
        assert f"pid {second}" in proc.stdout
        wait_for(lambda: ok_captures(base, "on-demand") == 1, 60, what="the requested capture")
        # bounded: the same pid again within min_gap_s is refused, and counted
        again = run_aaco(aaco_bin, *ask, "--pid", str(second))
        assert again.returncode == 2 and "429" in again.stderr and "captured" in again.stderr
        gone = run_aaco(aaco_bin, *ask, "--pid", "999999999")
        assert gone.returncode == 2 and "404" in gone.stderr and "no process with pid" in gone.stderr
        metrics = http_get(base + "/metrics")[1]
        for outcome in ("refused_rate", "refused_gone"):
            assert metric_value(metrics, "aaco_captures_total", source="on-demand", outcome=outcome) == 1
        wait_for(
            lambda: (metric_value(http_get(base + "/metrics")[1], "aaco_kernels_total", kind="kernel") or 0) == 18,
            30,
            what="both captures in the pipeline",
        )
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(20) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
    k = read_lake(tmp_path / "lake", "kernels")
    assert k.num_rows == 18
    assert sorted(set(k.column("pid").to_pylist())) == sorted([first, second])  # attributed to the captured pids
    # named by the captured process, not by the files ({pid}_kernel_trace): one model for both windows
    assert set(k.column("model").to_pylist()) == {MODEL}
    assert sorted(k["source"].to_pylist()) == ["on-demand"] * 9 + ["scheduled"] * 9
    for out_dir in ("captures", "captures-on-demand"):
        assert not list((tmp_path / out_dir).iterdir())  # outputs removed once ingested


def test_no_agent_is_a_clear_error(aaco_bin, tmp_path):
    token = tmp_path / "token"
    token.write_text("t" * 40)
    agent = f"http://127.0.0.1:{get_free_port()}"
    proc = run_aaco(aaco_bin, "capture", "--pid", "1", "--agent", agent, "--token-file", str(token))
    assert proc.returncode == 2 and "no agent answers" in proc.stderr and "Traceback" not in proc.stderr


def test_a_hung_profiler_is_killed(tmp_path, samples, sleepers):
    from aaco.agent.config import load_config
    from aaco.agent.service import AgentService

    cfg = load_config(
        config(
            tmp_path,
            samples,
            get_free_port(),
            [sleepers[0]],
            interval_s=0.2,
            command=f"{sys.executable} -c 'import time; time.sleep(601)' {{out}}",
            timeout_s=0.5,
        ),
        env={},
    )
    svc = AgentService(cfg)
    svc.start()
    try:
        wait_for(lambda: svc.stats.get(CAPTURES, source="capture", outcome="timeout") >= 1, 30, what="the timeout")
    finally:
        svc.shutdown(timeout_s=10)
    out = subprocess.run(["pgrep", "-f", "time.sleep.601"], capture_output=True, text=True, check=False)
    assert out.stdout.strip() == ""  # the whole process group is gone


def test_placeholders_never_reach_a_shell(tmp_path, samples, sleepers):
    """A hostile-looking template argument stays one argument: no shell, no injection."""
    from aaco.agent.config import load_config
    from aaco.agent.service import AgentService

    marker = tmp_path / "pwned"
    cfg = load_config(
        config(
            tmp_path, samples, get_free_port(), [sleepers[0]], interval_s=0.2, command=f"echo {{out}}; touch {marker}"
        ),
        env={},
    )
    svc = AgentService(cfg)
    svc.start()
    try:
        wait_for(lambda: svc.stats.get(CAPTURES, source="capture", outcome="ok") >= 1, 30, what="the capture")
    finally:
        svc.shutdown(timeout_s=10)
    assert not marker.exists()
    time.sleep(0.1)


def test_captures_left_by_a_crash_are_ingested_at_start(tmp_path, samples, sleepers):
    from aaco.agent.config import load_config
    from aaco.agent.service import AgentService

    # One window kept the name of the process it captured; one (an older run's) did not: its pid now
    # belongs to a process named otherwise, which must not name it.
    named, unnamed = sleepers
    left = [tmp_path / "captures" / f"{pid}-1700000000000" for pid in (named, unnamed)]
    for pid, out in zip((named, unnamed), left, strict=True):
        out.mkdir(parents=True)
        (out / f"{pid}_kernel_trace.csv").write_text((samples / "rocprofv3" / "kernel_trace.csv").read_text())
    (left[0] / MODEL_FILE).write_text("resnet_train\n")
    cfg = load_config(config(tmp_path, samples, get_free_port(), [named], interval_s=0), env={})
    svc = AgentService(cfg)
    svc.start()
    try:
        wait_for(lambda: not any(out.exists() for out in left), 30, what="the leftover captures ingested and removed")
    finally:
        svc.shutdown(timeout_s=10)
    k = read_lake(tmp_path / "lake", "kernels")
    assert k.num_rows == 18
    models = {pid: set(k.filter(pc.equal(k["pid"], pid))["model"].to_pylist()) for pid in (named, unnamed)}
    assert models == {named: {"resnet_train"}, unnamed: {f"{unnamed}_kernel_trace"}}


def test_counter_groups_take_turns_and_land_in_the_counters_dataset(tmp_path, samples, sleepers):
    """``pmc``: each window adds the next group as --pmc ...; the counter collection it writes becomes counter rows.

    The "profiler" writes the real rocprofv3 --pmc output of an MI210 (tests/data/rocprofv3-pmc-mi210) and
    the arguments it was given, so the test sees both the options and the rows.
    """
    from aaco.agent.config import load_config
    from aaco.agent.service import AgentService

    pmc = samples.parent.parent / "tests" / "data" / "rocprofv3-pmc-mi210"
    script = (
        f'cp {pmc}/782163_counter_collection.csv {pmc}/782163_agent_info.csv "$1"/ && '
        'shift && echo "$*" > "$(dirname "$0")/argv-$$"'
    )
    argv_dir = tmp_path / "argv"
    argv_dir.mkdir()
    (argv_dir / "profiler.sh").write_text(script + "\n")
    cfg = load_config(
        config(
            tmp_path,
            samples,
            get_free_port(),
            sleepers,
            interval_s=0.2,
            command=f"sh {argv_dir / 'profiler.sh'} {{out}} -- python3 app.py",
            pmc=[["SQ_WAVES", "SQ_INSTS_VALU"], ["TCC_HIT_sum"]],
        ),
        env={},
    )
    svc = AgentService(cfg)
    svc.start()
    try:
        wait_for(lambda: svc.stats.get(CAPTURES, source="capture", outcome="ok") >= 2, 60, what="two windows")
        time.sleep(1.0)  # the lake's next flush
    finally:
        svc.shutdown(timeout_s=10)
    argvs = sorted(p.read_text().split() for p in argv_dir.glob("argv-*"))
    # the options before the profiled command's "--", one group per window in turn
    assert argvs == [
        ["--pmc", "SQ_WAVES", "SQ_INSTS_VALU", "--", "python3", "app.py"],
        ["--pmc", "TCC_HIT_sum", "--", "python3", "app.py"],
    ]
    rows = read_lake(tmp_path / "lake", "counters").to_pylist()
    assert {r["arch"] for r in rows} == {"gfx90a"}  # from the agent_info.csv beside the counters
    gemm = [r for r in rows if r["kernel"].startswith("Cijk_") and r["dispatch_id"] == 4]
    assert {r["counter"]: r["value"] for r in gemm}.items() >= {("SQ_WAVES", 2048.0), ("SQ_INSTS_MFMA", 8388608.0)}
    assert {(r["start_ns"], r["end_ns"]) for r in gemm} == {(2277394169315057, 2277394170476180)}
