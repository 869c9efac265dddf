"""Admin actions over a Unix socket: HTTP on ``admin.socket``, the caller known by its peer credentials.

The kernel tells who connected (SO_PEERCRED: pid, uid, gid of the peer as it connected); a uid in
``admin.allowed_uids`` may run the actions, as ``uid U pid P on unix socket``. Another uid may
still send the bearer token (either credential suffices); without it, it is answered 403. The
socket file is created 0660 under a temporary name and renamed into place, so it never exists
with looser permissions at its own name; a socket left by an earlier run is replaced.

``UnixHTTPConnection`` is the client side (``aaco capture --socket PATH``).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import socketserver
import stat
import struct
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from aaco.agent.admin import ADMIN_REQUESTS, TokenAuth
from aaco.agent.admin_actions import Action
from aaco.agent.http import run_action
from aaco.contract.errors import AacoError
from aaco.contract.stats import Stats

log = logging.getLogger("aaco.admin")

UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;} (socket(7)); no stdlib reader
REQUEST_TIMEOUT_S = 10.0  # a client that stops sending holds its thread no longer than this


@dataclass(frozen=True, slots=True)
class PeerCred:
    """Who is at the other end of a Unix socket, as the kernel says."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: socket.socket) -> PeerCred:
    """The peer of a connected Unix socket (SO_PEERCRED, Linux)."""
    return PeerCred(*UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)))


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 64
    admin: AdminSocketServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S
    protocol_version = "HTTP/1.0"  # one request per connection

    def address_string(self) -> str:
        """A Unix socket peer has no address (the base class would index an empty string)."""
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are logged by the action, with who asked; the rest at debug level."""
        log.debug("admin socket: " + format, *args)

    def do_POST(self) -> None:
        """Run an action for an allowed peer."""
        url = urllib.parse.urlsplit(self.path)
        admin = self.server.admin
        action = admin.actions.get(url.path)
        if action is None:
            self._reply(404, {"error": f"no admin action {url.path}; try {', '.join(admin.actions)}"})
            return
        ok, who = admin.authorize(peer_credentials(self.connection), self.headers.get("Authorization"))
        if not ok:
            log.warning("admin action %s refused on %s: %s", url.path, admin.path, who)
            self._reply(403, {"error": who})
            return
        params = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        self._reply(*run_action(action, params, who))

    def do_GET(self) -> None:
        """Actions are POSTs only."""
        self._reply(405, {"error": "use POST"})

    def _reply(self, code: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode() + b"\n"
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class AdminSocketServer:
    """Serves the admin actions on a Unix socket to the allowed uids (or a bearer token)."""

    def __init__(
        self, path: Path, allowed_uids: list[int], actions: dict[str, Action], auth: TokenAuth, stats: Stats
    ) -> None:
        self.path = path
        self.allowed_uids = frozenset(allowed_uids)
        self.actions = dict(actions)
        self.auth = auth
        self.stats = stats
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def authorize(self, peer: PeerCred, authorization: str | None) -> tuple[bool, str]:
        """(True, who) for an allowed uid or a good bearer token; else (False, why not). Counted."""
        where = f"uid {peer.uid} pid {peer.pid} on unix socket"
        if peer.uid in self.allowed_uids:
            self.stats.inc(ADMIN_REQUESTS, 1, action="authenticate", outcome="accepted")
            return True, where
        if authorization is not None:
            return self.auth.authorize(authorization, where)
        self.stats.inc(ADMIN_REQUESTS, 1, action="authenticate", outcome="uid_not_allowed")
        return False, f"uid {peer.uid} is not in admin.allowed_uids {sorted(self.allowed_uids)}"

    def start(self) -> None:
        """Create the socket (0660) and serve it in a background thread."""
        try:
            mode: int | None = os.lstat(self.path).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISSOCK(mode):
            raise AacoError("exists and is not a socket", subject=self.path, hint="remove it or move admin.socket")
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        server = _Server(os.fspath(self.path), _Handler, bind_and_activate=False)
        server.admin = self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.unlink(missing_ok=True)
            server.socket.bind(os.fspath(tmp))
            os.chmod(tmp, 0o660)
            os.rename(tmp, self.path)
            server.server_activate()
        except OSError as exc:
            server.server_close()
            tmp.unlink(missing_ok=True)
            raise AacoError(
                f"cannot serve admin actions on this socket: {exc.strerror or exc}",
                subject=self.path,
                hint="choose another admin.socket, in a directory the agent may write",
            ) from exc
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="aaco-admin-socket", daemon=True)
        self._thread.start()
        log.info("admin actions on unix socket %s for uids %s", self.path, sorted(self.allowed_uids))

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop serving and remove the socket file (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        self.path.unlink(missing_ok=True)
        if self._thread is not None:
            self._thread.join(timeout_s)


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection over a Unix socket (``http.client`` speaks TCP only)."""

    def __init__(self, path: str | os.PathLike[str], timeout: float = 10.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = os.fspath(path)

    def connect(self) -> None:
        """Connect to the socket file instead of a host and port."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock
