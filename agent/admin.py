"""Who may run the agent's admin actions (``POST /api/v1/capture``; the action itself: ``admin_actions``).

Two credentials, either of which suffices:

- a bearer token, sent as ``Authorization: Bearer <token>`` to the metrics port and compared in
  constant time (``hmac.compare_digest``). It is read at start from ``admin.token_file`` (the
  chart mounts it from a Kubernetes Secret); when the file does not exist the agent generates one
  (``secrets.token_urlsafe(32)``) and writes it 0600. ``aaco capture`` reads the same file.
- the peer of the Unix socket ``admin.socket`` (``agent/admin_socket.py``): its uid, as the kernel
  says (SO_PEERCRED), must be in ``admin.allowed_uids``. Only the listed uids: root is listed by
  default, and taking it out is honoured (root could read the token file anyway).

The token file's mode: a token readable or writable by others (``o+rwx``) is refused at start (any
local user could run captures); a group-readable one is a warning only, because Kubernetes makes a
Secret volume group-readable for the pod's ``fsGroup``. Mount the Secret with ``defaultMode: 0400``.

Counted on ``aaco_admin_requests_total{action, outcome}``: every request is authenticated once
(``action="authenticate"``: accepted, no_credential, malformed, wrong_token, uid_not_allowed), and an
authenticated one runs its action (``action="capture"``: queued or the reason it was refused).
Every action is logged with who asked.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
import tempfile
from pathlib import Path

from pydantic import Field, NonNegativeInt

from aaco.contract.config_base import StrictModel
from aaco.contract.errors import AacoError
from aaco.contract.signals import define
from aaco.contract.stats import Stats

log = logging.getLogger("aaco.admin")

DEFAULT_TOKEN_FILE = Path("/var/lib/aaco/admin-token")
MIN_TOKEN_CHARS = 32
MAX_TOKEN_BYTES = 4096  # a token file is read this far at most

ADMIN_REQUESTS = define(
    "aaco.admin.requests",
    "aaco_admin_requests",
    "counter",
    "{request}",
    "Admin requests: authentication (action authenticate: accepted, no_credential, malformed, wrong_token, "
    "uid_not_allowed), then the action run (action capture: queued, or why it was refused).",
    ("action", "outcome"),
)


class AdminConfig(StrictModel):
    """Who may run admin actions (captures on demand): a bearer token, or a Unix socket's allowed uids."""

    token_file: Path = Field(
        DEFAULT_TOKEN_FILE,
        description="Bearer token for admin actions on the metrics port (generated 0600 if absent; "
        "mount it from a Secret with defaultMode 0400). Read only when a capture source is configured.",
    )
    socket: Path | None = Field(
        None, description="Also serve admin actions on this Unix socket (0660), e.g. /run/aaco/admin.sock."
    )
    allowed_uids: list[NonNegativeInt] = Field(
        [0], description="Uids allowed on the Unix socket (SO_PEERCRED); only these, root included."
    )


def read_token(path: Path) -> str:
    """The token in ``path`` (whitespace stripped), or ``AacoError`` when it is unreadable or too short."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise AacoError(
            f"cannot read the admin token: {exc.strerror or exc}",
            subject=path,
            hint="run as a user who can read it, or point admin.token_file (aaco capture: --token-file) elsewhere",
        ) from exc
    token = raw.decode("latin-1").strip()
    printable = token.isascii() and token.isprintable() and " " not in token
    if len(raw) > MAX_TOKEN_BYTES or len(token) < MIN_TOKEN_CHARS or not printable:
        raise AacoError(
            f"not an admin token: one line of {MIN_TOKEN_CHARS} to {MAX_TOKEN_BYTES} printable ASCII characters "
            "without spaces is needed",
            subject=path,
            hint="delete the file to have the agent generate one, or write one with `openssl rand -hex 32`",
        )
    return token


def load_token(path: Path) -> str:
    """The agent's token: read from ``path`` (its mode checked), or generated there when it does not exist."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return _generate(path)
    except OSError as exc:
        raise AacoError(
            f"cannot read the admin token: {exc.strerror}", subject=path, hint="point admin.token_file at a file"
        ) from exc
    if mode & stat.S_IRWXO:
        raise AacoError(
            f"the admin token is open to every local user (mode {stat.S_IMODE(mode):04o})",
            subject=path,
            hint=f"chmod o-rwx {path}, or mount its Secret with defaultMode 0400",
        )
    if mode & stat.S_IRWXG:
        log.warning(
            "admin token %s is open to its group (mode %04o): whoever is in it can run captures; "
            "chmod g-rwx it unless the group is the pod's fsGroup",
            path,
            stat.S_IMODE(mode),
        )
    return read_token(path)


def _generate(path: Path) -> str:
    """Write a new token to ``path``, mode 0600; if another process wrote one first, theirs.

    The token is written to a temporary file (``mkstemp``: O_CREAT|O_EXCL, 0600) and linked to its
    name (``link`` fails if the name exists): the file appears whole, and never replaces another.
    """
    token = secrets.token_urlsafe(32)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        raise AacoError(
            f"no admin token and cannot write one: {exc.strerror or exc}",
            subject=path,
            hint="mount one from a Secret, or set admin.token_file to a writable path",
        ) from exc
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)
    except FileExistsError:
        return read_token(path)
    except OSError as exc:
        raise AacoError(f"cannot write the admin token: {exc.strerror or exc}", subject=path) from exc
    finally:
        os.unlink(tmp)
    log.info("admin token generated in %s (mode 0600): aaco capture reads it from there", path)
    return token


class TokenAuth:
    """The metrics port's ``AdminAuth`` (``agent/http.py``): a bearer token, compared in constant time; counted."""

    def __init__(self, token: str, stats: Stats) -> None:
        self._token = token.encode()
        self.stats = stats

    def authorize(self, authorization: str | None, peer: str) -> tuple[bool, str]:
        """(True, "token from PEER") for ``Bearer <token>``, else (False, why not)."""
        if not authorization:
            return self._refuse("no_credential", "no credential: send Authorization: Bearer <admin token>")
        scheme, _, given = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return self._refuse("malformed", "the Authorization header must be: Bearer <admin token>")
        if not hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), self._token):
            return self._refuse("wrong_token", "wrong admin token")
        self.stats.inc(ADMIN_REQUESTS, 1, action="authenticate", outcome="accepted")
        return True, f"token from {peer}"

    def _refuse(self, outcome: str, why: str) -> tuple[bool, str]:
        self.stats.inc(ADMIN_REQUESTS, 1, action="authenticate", outcome=outcome)
        return False, why
