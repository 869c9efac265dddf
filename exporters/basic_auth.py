"""``Authorization: Basic`` checked against the web-config file's bcrypt hashes, with verdicts remembered.

bcrypt costs ~100 ms of CPU by design, so a port that checked every request would be starved by a
few clients sending wrong passwords. Verdicts are remembered per credential (a SHA-256 of the user
and password, never the password): successes in one table (only a right password can enter it, so a
guesser cannot push the scraper's credential out), failures in another, each bounded and each
checked against the hash it was made with (a changed file decides again). ``known`` answers from
them without bcrypt, in the server's loop; ``check`` runs bcrypt, one at a time, in a worker.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
from collections import OrderedDict

import bcrypt

# A bcrypt hash (cost 10) of a random password nobody knows: an unknown user costs one bcrypt check
# like a known one, so response times do not tell which user names exist (exporter-toolkit does the same).
DECOY_HASH = b"$2b$10$HluPuqofZ3Safb3.z1vm2eSecnmpJUGssuVOcm6Z8ixcPmxphP1QG"
VERIFIED_CACHE = 1024  # credentials that passed, remembered
REFUSED_CACHE = 4096  # credentials that failed, remembered

Verdict = tuple[bool, str]  # (True, user) or (False, reason: no_credentials | bad_credentials)


class BasicAuth:
    """bcrypt checks of Basic credentials, their verdicts remembered (see the module docstring)."""

    def __init__(self) -> None:
        self._bcrypt = threading.Lock()  # one bcrypt at a time: it is CPU work, and the machine is shared
        self._lock = threading.Lock()
        self._verified: OrderedDict[bytes, bytes] = OrderedDict()  # credential key -> the hash it matched
        self._refused: OrderedDict[bytes, bytes] = OrderedDict()  # credential key -> the hash it failed

    def known(self, users: dict[str, str], authorization: str | None) -> Verdict | None:
        """The verdict when it needs no bcrypt (no or malformed header, a credential decided before); else None."""
        parsed = _credential(authorization)
        if isinstance(parsed, str):
            return False, parsed
        user, key, hashed = self._entry(users, *parsed)
        with self._lock:
            passed, failed = self._verified.get(key), self._refused.get(key)
        if passed is not None and user in users and hmac.compare_digest(passed, hashed):
            return True, user
        if failed is not None and hmac.compare_digest(failed, hashed):
            return False, "bad_credentials"
        return None

    def check(self, users: dict[str, str], authorization: str | None) -> Verdict:
        """(True, user) when the header carries a user of ``users`` and its password, else (False, reason)."""
        verdict = self.known(users, authorization)
        if verdict is not None:
            return verdict
        parsed = _credential(authorization)
        assert not isinstance(parsed, str)  # known() answered those
        user, key, hashed = self._entry(users, *parsed)
        try:
            with self._bcrypt:
                ok = bcrypt.checkpw(parsed[1].encode(), hashed) and user in users
        except ValueError:  # a password over bcrypt's 72 bytes (Go's bcrypt refuses it too)
            ok = False
        table, limit = (self._verified, VERIFIED_CACHE) if ok else (self._refused, REFUSED_CACHE)
        with self._lock:
            table[key] = hashed
            table.move_to_end(key)
            while len(table) > limit:
                table.popitem(last=False)
        return (True, user) if ok else (False, "bad_credentials")

    @staticmethod
    def _entry(users: dict[str, str], user: str, password: str) -> tuple[str, bytes, bytes]:
        """The user, the credential's key, and the hash it is checked against."""
        hashed = users[user].encode() if user in users else DECOY_HASH
        key = hashlib.sha256(len(user).to_bytes(4, "big") + user.encode() + password.encode()).digest()
        return user, key, hashed


def _credential(authorization: str | None) -> tuple[str, str] | str:
    """(user, password) from a Basic header, or why there is none (no_credentials, bad_credentials)."""
    if not authorization:
        return "no_credentials"
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return "no_credentials"
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return "bad_credentials"
    return (user, password) if sep else "bad_credentials"
