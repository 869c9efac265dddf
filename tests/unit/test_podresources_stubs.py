"""The checked-in pod-resources stubs are what grpcio-tools generates from the checked-in proto."""

from __future__ import annotations

from pathlib import Path

from aaco.agent.sources.smi.podresources import api_pb2, regenerate


def test_stubs_are_current(tmp_path: Path):
    generated = regenerate.generate(tmp_path)
    for name, data in generated.items():
        assert (regenerate.HERE / name).read_bytes() == data, (
            f"{name} is stale: run python -m aaco.agent.sources.smi.podresources.regenerate"
        )


def test_service_and_messages_match_the_published_api():
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]
    fields = {f.name: f.number for f in api_pb2.ContainerDevices.DESCRIPTOR.fields}
    assert fields == {"resource_name": 1, "device_ids": 2, "topology": 3}
    fields = {f.name: f.number for f in api_pb2.ContainerResources.DESCRIPTOR.fields}
    assert fields == {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5}
    assert {f.name: f.number for f in api_pb2.PodResources.DESCRIPTOR.fields} == {
        "name": 1,
        "namespace": 2,
        "containers": 3,
    }
