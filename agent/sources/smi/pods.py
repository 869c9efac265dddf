"""Which pod owns which GPU: the kubelet's pod-resources API (``v1.PodResourcesLister/List``).

The kubelet serves it on ``/var/lib/kubelet/pod-resources/kubelet.sock``; the chart mounts that
directory. ``List`` returns every pod's containers with the device IDs that device plugins gave
them, per resource name: ``amd.com/gpu`` (AMD's plugin names GPUs by PCI address,
``0000:83:00.0``) and ``nvidia.com/gpu`` (NVIDIA's by UUID, ``GPU-5135...``; with time-slicing
``GPU-5135...::2``, the replica suffix is dropped). With MIG, NVIDIA's plugin hands out MIG devices:
under its ``single`` strategy as ``nvidia.com/gpu``, under ``mixed`` as ``nvidia.com/mig-<profile>``
(``nvidia.com/mig-1g.10gb``), by their MIG UUID (``MIG-...``; drivers before R470 named them
``MIG-GPU-<uuid>/<gi>/<ci>``): both match the MIG device (docs/shared-gpus.md), not its parent. A
GPU matches a device ID by UUID, PCI address, or, for plugins that use plain numbers, by index.
Several containers sharing one GPU are listed together, comma-separated, at most ``MAX_SHARERS`` (bounded label values).

The mapping is refreshed every ``refresh_s`` (the call under ``timeout_s``); between refreshes the
last one is used, and after a failed refresh the previous mapping is kept for at most
``stale_after_s``. Without a socket the agent runs unlabelled, and says so once (and once again
if a socket appears or goes away).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from aaco.contract.telemetry import ATTR_CONTAINER, ATTR_NAMESPACE, ATTR_POD, GpuIdentity, normalize_pci

if TYPE_CHECKING:  # gRPC and the stubs load when the kubelet is first asked, not when the agent starts
    import grpc

    from aaco.agent.sources.base import SourceContext
    from aaco.agent.sources.smi.podresources import api_pb2, api_pb2_grpc

log = logging.getLogger("aaco.sources.smi.pods")
_ABSENT_SAID: set[str] = set()  # sockets whose absence was logged at INFO: once per process, not once per source

DEFAULT_SOCKET: Final = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCES: Final = ("amd.com/gpu", "nvidia.com/gpu")
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"  # the NVIDIA device plugin's mixed strategy: one resource per profile
MAX_SHARERS: Final = 8
_PCI = re.compile(r"^(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class Owner:
    """A container that was given a GPU."""

    pod: str
    namespace: str
    container: str


def device_keys(device_id: str) -> set[str]:
    """The keys a device plugin's device ID can match a GPU by (lower case, replica suffix dropped)."""
    d = device_id.strip().lower().split("::", 1)[0]
    keys = {d}
    if _PCI.match(d):
        keys.add(normalize_pci(d))
    return keys


def gpu_keys(gpu: GpuIdentity) -> set[str]:
    """The keys a GPU is known by: UUID, PCI address, index; a MIG device also by its pre-R470 name."""
    keys = {k for k in (gpu.uuid.lower(), gpu.pci_bus, gpu.index) if k}
    if gpu.parent_uuid and gpu.compute_instance:
        keys.add(f"mig-{gpu.parent_uuid.lower()}/{gpu.gpu_instance}/{gpu.compute_instance}")
    return keys


def owners_by_device(resp: api_pb2.ListPodResourcesResponse, resources: Iterable[str]) -> dict[str, list[Owner]]:
    """Device key -> the containers that hold it, for devices of the given resource names."""
    wanted = set(resources)
    out: dict[str, list[Owner]] = {}
    for pod in resp.pod_resources:
        for c in pod.containers:
            for dev in c.devices:
                if dev.resource_name not in wanted and not (
                    "nvidia.com/gpu" in wanted and dev.resource_name.startswith(MIG_RESOURCE_PREFIX)
                ):
                    continue
                for device_id in dev.device_ids:
                    for key in device_keys(device_id):
                        owners = out.setdefault(key, [])
                        owner = Owner(pod.name, pod.namespace, c.name)
                        if owner not in owners:
                            owners.append(owner)
    return out


def attributes(owners: list[Owner]) -> dict[str, str]:
    """Pod, namespace and container attributes for the owners of one GPU (comma-joined when shared)."""
    owners = sorted(owners, key=lambda o: (o.namespace, o.pod, o.container))[:MAX_SHARERS]

    def join(values: Iterable[str]) -> str:
        return ",".join(dict.fromkeys(values))

    return {
        ATTR_POD: join(o.pod for o in owners),
        ATTR_NAMESPACE: join(o.namespace for o in owners),
        ATTR_CONTAINER: join(o.container for o in owners),
    }


class PodAttribution:
    """GPU -> owning pod, namespace and container, from the kubelet, refreshed periodically."""

    def __init__(
        self,
        socket: Path = DEFAULT_SOCKET,
        *,
        refresh_s: float = 10.0,
        timeout_s: float = 5.0,
        resources: Iterable[str] = GPU_RESOURCES,
        stale_after_s: float = 60.0,
        on_error: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket = socket
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self.resources = tuple(resources)
        self.stale_after_s = stale_after_s
        self.on_error = on_error or (lambda _reason, _message: None)
        self._clock = clock
        self._next = -1e18
        self._owners: dict[str, list[Owner]] = {}
        self._fresh_at = -1e18
        self._state = ""  # "", "absent", "ok", "failing"
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None
        self.refreshes = 0

    @property
    def connected(self) -> bool:
        """True after the latest refresh succeeded."""
        return self._state == "ok"

    def _say(self, state: str, message: str, level: int = logging.INFO) -> None:
        if state != self._state:
            log.log(level, "%s", message)
        self._state = state

    def refresh(self) -> None:
        """Ask the kubelet now (or note that there is none)."""
        now = self._clock()
        self._next = now + self.refresh_s
        if not self.socket.exists():
            self._owners = {}
            self._close_channel()
            where = os.fspath(self.socket)
            self._say(
                "absent",
                f"no kubelet pod-resources socket at {where}: GPU telemetry is not attributed to pods (running "
                "unlabelled)",
                logging.DEBUG if where in _ABSENT_SAID else logging.INFO,
            )
            _ABSENT_SAID.add(where)
            return
        import grpc

        from aaco.agent.sources.smi.podresources import api_pb2, api_pb2_grpc

        try:
            if self._stub is None:
                self._channel = grpc.insecure_channel(f"unix://{os.path.abspath(self.socket)}")
                self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
            resp = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
            message = f"kubelet pod-resources List on {os.fspath(self.socket)} failed: {code}"
            self.on_error("kubelet", message)
            self._close_channel()
            if now - self._fresh_at > self.stale_after_s:
                self._owners = {}
            self._say("failing", message + " (keeping the last mapping while it is fresh)", logging.WARNING)
            return
        self._owners = owners_by_device(resp, self.resources)
        self._fresh_at = now
        self.refreshes += 1
        self._say("ok", f"attributing GPU telemetry to pods via {os.fspath(self.socket)}")

    def lookup(self, gpus: Iterable[GpuIdentity]) -> dict[str, dict[str, str]]:
        """GPU index -> pod attributes, for the GPUs that belong to a container (refreshing when due)."""
        self.refresh_when_due()
        if not self._owners:
            return {}
        out = {}
        for g in gpus:
            owners = self.holders(g)
            if owners:
                out[g.index] = attributes(owners)
        return out

    def refresh_when_due(self) -> None:
        """Ask the kubelet again if ``refresh_s`` has passed since the last time."""
        if self._clock() >= self._next:
            self.refresh()

    def holders(self, gpu: GpuIdentity) -> list[Owner]:
        """The containers the kubelet gave ``gpu`` to (as of the latest refresh)."""
        owners: list[Owner] = []
        for key in gpu_keys(gpu):
            owners += [o for o in self._owners.get(key, []) if o not in owners]
        return owners

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    def close(self) -> None:
        """Close the connection."""
        self._close_channel()


def for_source(
    ctx: SourceContext, source: str, socket: Path, *, refresh_s: float, timeout_s: float, resources: Iterable[str]
) -> PodAttribution:
    """The attribution a source runs with: the kubelet's failures counted as the source's (not fatal)."""
    return PodAttribution(
        socket,
        refresh_s=refresh_s,
        timeout_s=timeout_s,
        resources=resources,
        stale_after_s=6 * refresh_s,
        on_error=lambda reason, msg: ctx.problem(source, "kubelet", reason, msg, fatal=False, count=1),
    )
