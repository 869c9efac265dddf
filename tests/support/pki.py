"""A throwaway PKI for TLS tests (a CA, server and client certificates, by the ``openssl`` command), and basic auth.

Keys are made in each test's temporary folder and never committed.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import bcrypt

from tests.conftest import skip_or_fail


@dataclass
class Pki:
    """Files of a throwaway PKI."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-keyout", key, "-out", cert, "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def issue(folder: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    """A leaf certificate and key signed by ``ca`` with ``extensions`` (an openssl -extfile text)."""
    cert, key, csr, ext = (folder / f"{name}.{s}" for s in ("crt", "key", "csr", "ext"))
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n" + extensions
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", csr, "-subj", f"/CN={name}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-set_serial", str(int.from_bytes(os.urandom(8))),
        "-days", "2", "-out", cert, "-extfile", ext,
    )  # fmt: skip
    return cert, key


def make_pki(folder: Path) -> Pki:
    """A CA, a server certificate (SAN localhost, 127.0.0.1), a client certificate (SAN scraper.test), another CA."""
    if shutil.which("openssl") is None:
        skip_or_fail("the openssl command is not installed (Debian openssl)")
    folder.mkdir(parents=True, exist_ok=True)
    ca = make_ca(folder, "ca")
    server = issue(folder, "server", ca, "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    client = issue(folder, "client", ca, "subjectAltName=DNS:scraper.test\nextendedKeyUsage=clientAuth\n")
    other, _ = make_ca(folder, "other-ca")
    return Pki(ca[0], server[0], server[1], client[0], client[1], other)


def bcrypt_hash(password: str) -> str:
    """A bcrypt hash as htpasswd -nB writes it (cost 4: the check is what is tested, not the cost)."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$", 1)


def basic(user: str, password: str) -> str:
    """An Authorization header value."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
