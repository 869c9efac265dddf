"""``aaco fleet jobs`` lists the Slurm jobs the lake's GPU telemetry names (docs/jobs.md, "Slurm").

The rows are the smi source's own, read from the real H100 capture on two "nodes", with the job
attributes a mapping directory gave them: one job on both nodes' GPU 0, then a second job sharing
node b's GPU with it (comma-joined, as the source writes several jobs on one GPU).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from aaco.agent.fleet import jobs
from aaco.agent.fleet.lake import FleetLake
from aaco.agent.sources.smi.backends import BackendOptions, open_backend
from aaco.contract.jobs import ATTR_JOB, ATTR_JOB_PARTITION, ATTR_JOB_USER
from aaco.contract.schemas import SCHEMAS
from aaco.contract.telemetry import to_table
from aaco.contract.versions import SCHEMA as VERSIONS
from tests.conftest import ROOT

H100 = ROOT / "examples" / "data" / "nvidia-smi" / "h100-sxm5-v13.xml.gz"
T0 = 1_700_000_000 * 10**9


def rows(node: str, ts_ns: int, attrs: dict[str, str]) -> pa.Table:
    snap = open_backend("file", BackendOptions(file=H100)).sample()
    return pa.Table.from_batches([to_table(snap.gpus, ts_ns=ts_ns, node=node, source="smi", extra={"0": attrs})])


def test_fleet_jobs_lists_slurm_jobs_from_gpu_telemetry():
    alone = {ATTR_JOB: "slurm-81230", ATTR_JOB_USER: "alice", ATTR_JOB_PARTITION: "gpu"}
    shared = {ATTR_JOB: "slurm-81230,slurm-81234", ATTR_JOB_USER: "alice,bob", ATTR_JOB_PARTITION: "gpu"}
    telemetry = pa.concat_tables(
        [rows("a", T0, alone), rows("b", T0, alone), rows("b", T0 + 10**9, shared), rows("c", T0, {})]
    )
    lake = FleetLake(
        str(Path(".")),
        {
            "iterations": SCHEMAS["iterations"].empty_table(),
            "kernels": SCHEMAS["kernels"].empty_table(),
            "telemetry": telemetry.cast(SCHEMAS["telemetry"]),
            "versions": VERSIONS.empty_table(),
        },
    )
    with lake.connect() as con:
        doc = jobs.jobs(con)
    assert doc["jobs"] == []
    first, second = doc["slurm_jobs"]
    assert first == {
        "job": "slurm-81230",
        "nodes": ["a", "b"],
        "gpus": ["a:0", "b:0"],
        "first_ns": T0,
        "last_ns": T0 + 10**9,
        "utilization": first["utilization"],
        "power_w": 79.73,
        "user": "alice",
        "partition": "gpu",
    }
    assert first["utilization"] is not None and 0.0 <= first["utilization"] <= 1.0
    # the second job was only ever seen sharing a GPU: its user is not told apart from the first's
    assert second["job"] == "slurm-81234" and second["gpus"] == ["b:0"] and second["user"] is None
    assert second["first_ns"] == second["last_ns"] == T0 + 10**9
