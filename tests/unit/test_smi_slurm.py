"""Slurm jobs on GPUs (docs/jobs.md, "Slurm"): dcgm-exporter's job mapping directory, AMD
device-metrics-exporter's JSON files, and the environment of real processes holding GPU device nodes.

What is simulated: no GPU and no Slurm here. The mapping files are written as the exporters'
prolog scripts write them; the "device nodes" are plain files under a temporary directory given
as the device root, which real child processes open (their ``/proc/<pid>/fd`` links and
``/proc/<pid>/environ`` are the kernel's own), with a Slurm environment set by the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from aaco.agent.pipeline.bus import Bus
from aaco.agent.sources.base import Journal, SourceContext
from aaco.agent.sources.smi import SmiSource, SmiSourceConfig
from aaco.agent.sources.smi.backends import BackendOptions, open_backend
from aaco.agent.sources.smi.slurm import (
    MAX_JOBS,
    SlurmAttribution,
    SlurmJob,
    device_index,
    environment_jobs,
    gpu_processes,
    merge,
    read_amd_dir,
    read_dcgm_dir,
)
from aaco.analyzers.telemetry import TelemetryAnalyzer
from aaco.contract.jobs import ATTR_JOB, ATTR_JOB_PARTITION, ATTR_JOB_USER
from aaco.contract.schemas import EventBatch
from aaco.contract.stats import Stats
from aaco.contract.telemetry import GpuIdentity, to_table
from tests.conftest import ROOT

H100 = ROOT / "examples" / "data" / "nvidia-smi" / "h100-sxm5-v13.xml.gz"
A100_MIG = ROOT / "examples" / "data" / "nvidia-smi" / "a100-sxm4-v12.xml.gz"  # MIG devices 0/3/0 .. 0/6/0


def dcgm_dir(root: Path) -> Path:
    """A job mapping directory as dcgm-exporter's documented prolog writes it."""
    d = root / "dcgm-job-map"
    d.mkdir()
    (d / "0").write_text("1234\n")
    (d / "1").write_text("1236\n1235\n")  # two jobs sharing GPU 1
    (d / "0.1").write_text("2001\n")  # GPU 0's GPU instance 1 (MIG)
    (d / "3").write_text("\n")  # an emptied file: no job
    (d / "README").write_text("42\n")  # not a GPU's name: skipped, as dcgm-exporter skips it
    (d / "5").mkdir()  # a directory: skipped
    return d


def test_dcgm_directory_is_read_as_dcgm_exporter_reads_it(tmp_path: Path):
    got = read_dcgm_dir(dcgm_dir(tmp_path))
    assert got == {
        ("0", None): [SlurmJob("1234")],
        ("1", None): [SlurmJob("1236"), SlurmJob("1235")],
        ("0", "1"): [SlurmJob("2001")],
    }
    assert read_dcgm_dir(tmp_path / "absent") == {}


def test_mapping_directory_labels_the_right_gpus_and_mig_instances(tmp_path: Path):
    slurm = SlurmAttribution(mapping_dir=dcgm_dir(tmp_path))
    got = slurm.lookup([GpuIdentity("0"), GpuIdentity("1"), GpuIdentity("2"), GpuIdentity("3")])
    assert got == {"0": {ATTR_JOB: "slurm-1234"}, "1": {ATTR_JOB: "slurm-1235,slurm-1236"}}
    # a MIG device is looked up by (its parent GPU's index, its GPU instance id): file 0.1
    assert slurm.jobs("0", "1") == [SlurmJob("2001")]
    mig = [GpuIdentity(f"0/{gi}/0", parent="0", gpu_instance=str(gi)) for gi in (1, 2)]
    assert slurm.lookup(mig) == {"0/1/0": {ATTR_JOB: "slurm-2001"}}


def test_jobs_on_one_gpu_are_ordered_numerically_and_bounded(tmp_path: Path):
    d = tmp_path / "map"
    d.mkdir()
    (d / "0").write_text("100\n9\n33\n2\n10\n5\n9\n")
    got = SlurmAttribution(mapping_dir=d).lookup([GpuIdentity("0")])
    assert MAX_JOBS == 4
    assert got["0"][ATTR_JOB] == "slurm-2,slurm-5,slurm-9,slurm-10"


def test_the_mapping_is_read_again_when_due(tmp_path: Path):
    now = [0.0]
    d = tmp_path / "map"
    slurm = SlurmAttribution(mapping_dir=d, refresh_s=10, clock=lambda: now[0])
    assert slurm.lookup([GpuIdentity("0")]) == {}  # no directory yet: nothing, no error
    d.mkdir()
    (d / "0").write_text("77\n")
    now[0] = 5.0
    assert slurm.lookup([GpuIdentity("0")]) == {}  # not due
    now[0] = 10.0
    assert slurm.lookup([GpuIdentity("0")]) == {"0": {ATTR_JOB: "slurm-77"}}
    (d / "0").unlink()  # the epilog removed it
    now[0] = 20.0
    assert slurm.lookup([GpuIdentity("0")]) == {}


def amd_prolog_file(job: str, gpus: str) -> str:
    """What device-metrics-exporter's slurm-prolog.sh writes (``echo ${MSG}``: its JSON on one line)."""
    doc = {
        "SLURM_JOB_ID": job,
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_PARTITION": "mi300x",
        "SLURM_CLUSTER_NAME": "hpc",
        "SLURM_JOB_GPUS": gpus,
        "CUDA_VISIBLE_DEVICES": gpus,
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
    }
    return " ".join(json.dumps(doc, indent=1).split()) + "\n"


def test_amd_exporter_directory(tmp_path: Path):
    d = tmp_path / "exporter"
    d.mkdir()
    (d / "0").write_text(amd_prolog_file("501", "0,1"))
    (d / "1").write_text(amd_prolog_file("501", "0,1"))
    (d / "4").write_text("{not json")
    (d / "5").write_text(json.dumps({"SLURM_JOB_ID": "", "CUDA_VISIBLE_DEVICES": "5"}))
    (d / "exporter.sock").write_text("")
    job = SlurmJob("501", "alice", "mi300x")
    assert read_amd_dir(d) == {("0", None): [job], ("1", None): [job]}
    got = SlurmAttribution(amd_dir=d).lookup([GpuIdentity("0"), GpuIdentity("1"), GpuIdentity("4")])
    want = {ATTR_JOB: "slurm-501", ATTR_JOB_USER: "alice", ATTR_JOB_PARTITION: "mi300x"}
    assert got == {"0": want, "1": want}


def test_layers_merge_by_job_id():
    files = {("0", None): [SlurmJob("7")], ("1", None): [SlurmJob("8")]}
    env = {("0", None): [SlurmJob("7", "bob", "a100")], ("2", None): [SlurmJob("9", "eve", "")]}
    assert merge(files, env) == {
        ("0", None): [SlurmJob("7", "bob", "a100")],
        ("1", None): [SlurmJob("8")],
        ("2", None): [SlurmJob("9", "eve", "")],
    }


def test_device_nodes():
    assert device_index("/dev/nvidia0") == "0"
    assert device_index("/dev/nvidia7") == "7"
    assert device_index("/dev/dri/renderD128") == "0"
    assert device_index("/dev/dri/renderD131") == "3"
    for other in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1", "/dev/dri/card0", "/dev/null"):
        assert device_index(other) is None
    assert device_index("/tmp/x/dev/nvidia2", Path("/tmp/x/dev")) == "2"
    assert device_index("/dev/nvidia2", Path("/tmp/x/dev")) is None


CHILD = """
import sys, time
handles = [open(p, "rb") for p in sys.argv[1:]]
print("ready", flush=True)
time.sleep(60)
"""


def spawn(env: dict[str, str], *nodes: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *map(str, nodes)],
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin", **env},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def dev(tmp_path: Path) -> Path:
    root = tmp_path / "dev"
    (root / "dri").mkdir(parents=True)
    for name in ("nvidia2", "nvidia3", "nvidiactl", "dri/renderD129"):
        (root / name).write_text("")
    return root


def test_a_gpu_process_with_a_slurm_environment_is_attributed_without_a_mapping_file(dev: Path):
    slurm_env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "alice", "SLURM_JOB_PARTITION": "gpu", "USER": "root"}
    procs = [
        spawn(slurm_env, dev / "nvidia2", dev / "nvidiactl", dev / "dri" / "renderD129"),  # a rank of job 4242
        spawn({"USER": "bob"}, dev / "nvidia3"),  # a GPU process outside Slurm
        spawn({"SLURM_JOB_ID": "99"}, dev / "nvidiactl"),  # a Slurm process holding no GPU
    ]
    try:
        held = gpu_processes(dev_root=dev)
        assert held[procs[0].pid] == {"2", "1"} and held[procs[1].pid] == {"3"} and procs[2].pid not in held
        job = SlurmJob("4242", "alice", "gpu")
        assert environment_jobs(dev_root=dev) == {("2", None): [job], ("1", None): [job]}
        slurm = SlurmAttribution(from_environment=True, dev_root=dev)
        got = slurm.lookup([GpuIdentity(str(i)) for i in range(4)])
    finally:
        for p in procs:
            p.kill()
            p.wait()
    want = {ATTR_JOB: "slurm-4242", ATTR_JOB_USER: "alice", ATTR_JOB_PARTITION: "gpu"}
    assert got == {"1": want, "2": want}


def test_user_falls_back_to_user(dev: Path):
    proc = spawn({"SLURM_JOB_ID": "5", "USER": "carol"}, dev / "nvidia3")
    try:
        got = environment_jobs(dev_root=dev)
    finally:
        proc.kill()
        proc.wait()
    assert got == {("3", None): [SlurmJob("5", "carol", "")]}


def test_source_publishes_job_attributes_and_the_analyzer_labels_them(tmp_path: Path):
    d = tmp_path / "map"
    d.mkdir()
    (d / "0").write_text("1234\n")
    cfg = SmiSourceConfig(backend="file", file=H100, kubelet_socket=None, slurm_job_mapping_dir=d)
    src = SmiSource(cfg, "smi")
    src.backend = open_backend("file", src.options)
    stats = Stats()
    ctx = SourceContext("node-a", stats, Bus(stats), Journal(stats))
    src.sample_once(ctx)
    item = ctx.bus.get(0)
    assert item is not None
    rows = item.batch.to_pylist()
    assert rows and all(dict(r["attributes"])[ATTR_JOB] == "slurm-1234" for r in rows)
    analyzer = TelemetryAnalyzer()
    analyzer.update(EventBatch("telemetry", item.batch, "smi"))
    power = [p for p in analyzer.snapshot().points() if p.metric.prom_name == "aaco_gpu_power_watts"]
    assert len(power) == 1
    assert power[0].labels["job"] == "slurm-1234" and power[0].labels["job_user"] == ""


def test_compat_names_carry_the_exporters_job_labels():
    series_labels = {"job": "slurm-81230,slurm-81234", "job_user": "alice", "job_partition": "gpu"}
    for flavour, name, want in (
        ("dcgm", "DCGM_FI_DEV_POWER_USAGE", {"hpc_job": "81230,81234"}),
        ("amd", "gpu_power_usage", {"job_id": "81230,81234", "job_user": "alice", "job_partition": "gpu"}),
    ):
        analyzer = TelemetryAnalyzer(compat={"smi": flavour})
        analyzer.update(EventBatch("telemetry", _h100_rows_with(series_labels), "smi"))
        [point] = [p for p in analyzer.snapshot().points() if p.metric.prom_name == name]
        assert {k: point.labels[k] for k in want} == want


def _h100_rows_with(labels: dict[str, str]) -> pa.RecordBatch:
    snap = open_backend("file", BackendOptions(file=H100)).sample()
    attrs = {ATTR_JOB: labels["job"], ATTR_JOB_USER: labels["job_user"], ATTR_JOB_PARTITION: labels["job_partition"]}
    return to_table(snap.gpus, ts_ns=1, node="n", source="smi", extra={"0": attrs})


def test_config_paths_are_absolute_and_off_by_default():
    cfg = SmiSourceConfig(slurm_job_mapping_dir=Path("rel/map"))
    assert cfg.slurm_job_mapping_dir == Path("rel/map").absolute()
    off = SmiSourceConfig()
    assert off.slurm_job_mapping_dir is None and off.slurm_amd_job_dir is None and not off.slurm_from_environment
    assert not SmiSource(off, "smi").slurm.enabled


def test_a_real_mig_capture_gets_its_instances_jobs_from_gpu_dot_instance_files(tmp_path: Path):
    d = tmp_path / "map"
    d.mkdir()
    (d / "0").write_text("100\n")  # the whole GPU
    (d / "0.3").write_text("300\n")  # GPU instance 3
    (d / "0.5").write_text("501\n500\n")  # GPU instance 5, two jobs
    cfg = SmiSourceConfig(backend="file", file=A100_MIG, kubelet_socket=None, slurm_job_mapping_dir=d)
    src = SmiSource(cfg, "smi")
    src.backend = open_backend("file", src.options)
    stats = Stats()
    ctx = SourceContext("node-a", stats, Bus(stats), Journal(stats))
    src.sample_once(ctx)
    item = ctx.bus.get(0)
    assert item is not None
    jobs: dict[str, set[str | None]] = {}
    for r in item.batch.to_pylist():
        jobs.setdefault(r["device"], set()).add(dict(r["attributes"]).get(ATTR_JOB))
    assert jobs == {
        "0": {"slurm-100"},
        "0/3/0": {"slurm-300"},
        "0/4/0": {None},
        "0/5/0": {"slurm-500,slurm-501"},
        "0/6/0": {None},
    }
