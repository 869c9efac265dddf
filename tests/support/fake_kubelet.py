"""A fake kubelet: the pod-resources gRPC service (v1.PodResourcesLister) on a Unix socket.

Built from the same generated stubs the agent uses (from the published proto), served by a real
grpc server, answering ``List`` with the pods it is given (tests change them while it runs).
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from aaco.agent.sources.smi.podresources import api_pb2, api_pb2_grpc


def pod(name: str, namespace: str, container: str, resource: str, *device_ids: str) -> api_pb2.PodResources:
    """One pod with one container holding ``device_ids`` of ``resource``."""
    return api_pb2.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            api_pb2.ContainerResources(
                name=container,
                devices=[api_pb2.ContainerDevices(resource_name=resource, device_ids=list(device_ids))],
                cpu_ids=[2, 3],
            )
        ],
    )


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    """Serves ``List`` from ``self.pods``; counts calls."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.pods: list[api_pb2.PodResources] = []
        self.calls = 0
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{socket}")

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        with self._lock:
            self.calls += 1
            return api_pb2.ListPodResourcesResponse(pod_resources=list(self.pods))

    def __enter__(self) -> FakeKubelet:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None).wait(5)
