"""MIG devices end to end: the smi source on the real A100 MIG capture, a pod holding one MIG device.

The kubelet is a fake serving the real pod-resources gRPC API; the pod holds MIG device GI 3 / CI 0
under the NVIDIA device plugin's mixed strategy (``nvidia.com/mig-1g.20gb``), named as drivers
before R470 name a MIG device (schema 12's XML carries no MIG UUID).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aaco.agent.pipeline.bus import Bus
from aaco.agent.sources.base import Journal, SourceContext
from aaco.agent.sources.smi import SmiSource, SmiSourceConfig
from aaco.agent.sources.smi.backends import open_backend
from aaco.agent.sources.smi.pods import PodAttribution
from aaco.contract import telemetry as m
from aaco.contract.stats import Stats
from tests.support.fake_kubelet import FakeKubelet, pod

pytestmark = pytest.mark.integration

NV_UUID = "GPU-513536b6-7d19-9063-b049-1e69664bb298"


def test_a_pod_on_a_mig_device_gets_that_device_series_and_none_of_the_gpu(samples: Path, tmp_path: Path):
    with FakeKubelet(tmp_path / "kubelet.sock") as kubelet:
        kubelet.pods = [pod("train-0", "ml", "trainer", "nvidia.com/mig-1g.20gb", f"MIG-{NV_UUID}/3/0")]
        cfg = SmiSourceConfig(
            backend="file", file=samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz", kubelet_socket=kubelet.socket
        )
        src = SmiSource(cfg, "smi")
        src.backend = open_backend("file", src.options)
        src.pods = PodAttribution(kubelet.socket, refresh_s=60)
        stats = Stats()
        ctx = SourceContext("node-a", stats, Bus(stats), Journal(stats))
        src.sample_once(ctx)
        src.pods.close()
    rows = ctx.bus.get(0).batch.to_pylist()
    held = [r for r in rows if dict(r["attributes"]).get(m.ATTR_POD) == "train-0"]
    assert {r["device"] for r in held} == {"0/3/0"}
    assert {r["metric"] for r in held} == {m.MEMORY_USAGE, m.MEMORY_LIMIT, m.ECC_UNCORRECTED, m.UP, m.ERRORS}
    assert all(dict(r["attributes"])[m.ATTR_PARENT_UUID] == NV_UUID for r in held)
    assert not [r for r in rows if r["metric"] == m.POWER and dict(r["attributes"]).get(m.ATTR_POD)]
    assert {r["device"] for r in rows} == {"0", "0/3/0", "0/4/0", "0/5/0", "0/6/0"}
