"""The Prometheus web-config file: format, validation, the SSLContext it makes, basic auth, reloading on change.

Certificates come from ``tests/support/pki.py``.
"""

from __future__ import annotations

import base64
import os
import shutil
import ssl
from pathlib import Path

import bcrypt
import pytest
import yaml

from aaco.contract.errors import AacoError
from aaco.contract.stats import Stats
from aaco.exporters.basic_auth import BasicAuth
from aaco.exporters.web_config import (
    WEB_CONFIG_RELOADS,
    WebConfigWatcher,
    allowed_san,
    load,
    ssl_context,
)
from tests.support.pki import Pki, basic, bcrypt_hash, make_pki


def write(path: Path, doc: object) -> Path:
    """``doc`` as YAML at ``path``."""
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """One PKI for the module."""
    return make_pki(tmp_path_factory.mktemp("pki"))


# --- the format -------------------------------------------------------------------------------------------------


def test_the_documented_example_loads_with_paths_relative_to_the_file(tmp_path: Path):
    # exporter-toolkit's docs/web-config.yml, less rate_limit (a newer key this agent does not take)
    (tmp_path / "web").mkdir()
    path = tmp_path / "web" / "web-config.yml"
    path.write_text(
        "tls_server_config:\n"
        "  cert_file: server.crt\n"
        "  key_file: server.key\n"
        "basic_auth_users:\n"
        "  alice: $2y$10$mDwo.lAisC94iLAyP81MCesa29IzH37oigHC/42V2pdJlUprsJPze\n"
        "  bob: $2y$10$hLqFl9jSjoAAy95Z/zw8Ye8wkdMBM8c5Bn1ptYqP/AXyV0.oy0S8m\n"
    )
    config = load(path)
    tls = config.tls_server_config
    assert tls is not None
    assert tls.cert_file == tmp_path / "web" / "server.crt"
    assert tls.key_file == tmp_path / "web" / "server.key"
    assert tls.client_auth_type == "NoClientCert"
    assert (tls.min_version, tls.max_version) == ("TLS12", "TLS13")
    assert sorted(config.basic_auth_users) == ["alice", "bob"]


def test_an_empty_file_is_no_tls_and_no_auth(tmp_path: Path):
    path = tmp_path / "web.yml"
    path.write_text("")
    config = load(path)
    assert config.tls_server_config is None
    assert config.basic_auth_users == {}


def test_absolute_paths_stay(tmp_path: Path):
    cfg = load(write(tmp_path / "w.yml", {"tls_server_config": {"cert_file": "/etc/x.crt", "key_file": "/etc/x.key"}}))
    assert cfg.tls_server_config is not None
    assert cfg.tls_server_config.cert_file == Path("/etc/x.crt")


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "certfile": "c"}},
         r"tls_server_config\.certfile: unknown key"),
        ({"basic_auth_user": {"a": "b"}}, r"basic_auth_user: unknown key"),
        ({"http_server_config": {"headers": {"X-Foo": "1"}}}, r"'X-Foo' can not be configured"),
        ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}}, r"invalid value for X-Frame-Options"),
        ({"basic_auth_users": {"alice": "plain-password"}}, r"user 'alice': not a bcrypt hash"),
        ({"tls_server_config": {"cert_file": "a"}}, r"cert_file and key_file are both needed"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "Maybe"}}, r"client_auth_type"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "TLS11"}}, r"min_version"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "TLS13", "max_version": "TLS12"}},
         r"min_version TLS13 is above max_version TLS12"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_ca_file": "ca"}},
         r"client_ca_file is set but client_auth_type is NoClientCert"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "RequireAndVerifyClientCert"}},
         r"needs client_ca_file"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_allowed_sans": ["x"]}},
         r"client_allowed_sans needs"),
        (["a list"], r"a YAML mapping"),
    ],
)  # fmt: skip
def test_invalid_files_name_the_file_and_the_key(tmp_path: Path, doc: object, expected: str):
    path = write(tmp_path / "web.yml", doc)
    with pytest.raises(AacoError, match=expected) as exc:
        load(path)
    assert exc.value.subject == str(path)


def test_missing_file_and_bad_yaml(tmp_path: Path):
    with pytest.raises(AacoError, match="cannot read the web-config file") as exc:
        load(tmp_path / "nope.yml")
    assert exc.value.subject == str(tmp_path / "nope.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("tls_server_config: [\n")
    with pytest.raises(AacoError, match="not valid YAML"):
        load(bad)


# --- the SSLContext ---------------------------------------------------------------------------------------------


def _tls_doc(pki: Pki, **extra: object) -> dict[str, object]:
    return {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), **extra}}


def test_ssl_context_defaults(tmp_path: Path, pki: Pki):
    path = write(tmp_path / "w.yml", _tls_doc(pki))
    tls = load(path).tls_server_config
    assert tls is not None
    ctx = ssl_context(tls, path)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.maximum_version == ssl.TLSVersion.TLSv1_3
    assert ctx.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(
    ("auth", "mode"),
    [
        ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED),
        ("RequireAnyClientCert", ssl.CERT_REQUIRED),  # stdlib ssl cannot require a certificate without verifying it
        ("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL),
    ],
)
def test_client_auth_types(tmp_path: Path, pki: Pki, auth: str, mode: ssl.VerifyMode):
    path = write(
        tmp_path / "w.yml", _tls_doc(pki, client_auth_type=auth, client_ca_file=str(pki.ca), min_version="TLS13")
    )
    tls = load(path).tls_server_config
    assert tls is not None
    ctx = ssl_context(tls, path)
    assert ctx.verify_mode == mode
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3


def test_request_client_cert_requests_none(tmp_path: Path, pki: Pki):
    path = write(tmp_path / "w.yml", _tls_doc(pki, client_auth_type="RequestClientCert"))
    tls = load(path).tls_server_config
    assert tls is not None
    assert ssl_context(tls, path).verify_mode == ssl.CERT_NONE


def test_go_cipher_names_are_ignored_with_a_warning(tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture):
    path = write(tmp_path / "w.yml", _tls_doc(pki, cipher_suites=["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]))
    tls = load(path).tls_server_config
    assert tls is not None
    ssl_context(tls, path)
    assert "tls_server_config.cipher_suites is ignored" in caplog.text


def test_unreadable_or_bad_certificate_files_are_named(tmp_path: Path, pki: Pki):
    missing = tmp_path / "missing.key"
    path = write(
        tmp_path / "w.yml", {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": "missing.key"}}
    )
    tls = load(path).tls_server_config
    assert tls is not None
    with pytest.raises(AacoError, match=r"cannot read the file tls_server_config\.key_file names") as exc:
        ssl_context(tls, path)
    assert exc.value.subject == str(missing)
    # a key that is not the certificate's
    path = write(
        tmp_path / "w.yml", {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.client_key)}}
    )
    tls = load(path).tls_server_config
    assert tls is not None
    with pytest.raises(AacoError, match="not a PEM certificate with its key") as exc:
        ssl_context(tls, path)
    assert exc.value.subject == str(pki.server_cert)
    # a CA file that holds no certificate
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    path = write(
        tmp_path / "w.yml", _tls_doc(pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(junk))
    )
    tls = load(path).tls_server_config
    assert tls is not None
    with pytest.raises(AacoError) as exc:
        ssl_context(tls, path)
    assert exc.value.subject == str(junk)


def test_allowed_sans():
    cert = {"subjectAltName": (("DNS", "scraper.test"), ("IP Address", "2001:DB8:0:0:0:0:0:1"))}
    assert allowed_san(cert, ["scraper.test"])
    assert allowed_san(cert, ["2001:db8::1"])  # OpenSSL writes IPv6 uncompressed, in capitals
    assert not allowed_san(cert, ["other.test"])
    assert not allowed_san({}, ["scraper.test"])


# --- basic auth -------------------------------------------------------------------------------------------------


def test_basic_auth_checks_once_per_credential_and_answers_from_memory(monkeypatch: pytest.MonkeyPatch):
    users = {"alice": bcrypt_hash("s3cret"), "bob": bcrypt_hash("hunter2")}
    auth = BasicAuth()
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr("aaco.exporters.basic_auth.bcrypt.checkpw", counting)
    monkeypatch.setattr("aaco.exporters.basic_auth.REFUSED_CACHE", 3)
    assert auth.known(users, basic("alice", "s3cret")) is None  # only bcrypt can tell yet
    assert auth.check(users, basic("alice", "s3cret")) == (True, "alice")
    assert auth.check(users, basic("alice", "s3cret")) == (True, "alice")
    assert auth.known(users, basic("alice", "s3cret")) == (True, "alice")
    assert len(calls) == 1, "a success is remembered"
    assert auth.check(users, basic("alice", "wrong")) == (False, "bad_credentials")
    assert auth.known(users, basic("alice", "wrong")) == (False, "bad_credentials")
    assert len(calls) == 2, "so is a failure: repeating a wrong password costs no bcrypt"
    assert auth.check(users, basic("bob", "s3cret")) == (False, "bad_credentials")  # alice's password
    assert auth.check(users, basic("mallory", "s3cret")) == (False, "bad_credentials")
    assert len(calls) == 4, "an unknown user costs a bcrypt check too (no user enumeration by timing)"
    for guess in ("a", "b", "c", "d"):  # a guesser fills the failures' table, never the successes'
        auth.check(users, basic("alice", guess))
    assert auth.known(users, basic("alice", "s3cret")) == (True, "alice")
    assert auth.known(users, basic("alice", "wrong")) is None  # pushed out of the bounded failures' table
    # the hash changed (password rotated): neither remembered verdict counts
    rotated = {**users, "alice": bcrypt_hash("new")}
    assert auth.known(rotated, basic("alice", "s3cret")) is None
    assert auth.check(rotated, basic("alice", "s3cret")) == (False, "bad_credentials")
    assert auth.check(rotated, basic("alice", "new")) == (True, "alice")


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (None, "no_credentials"),
        ("", "no_credentials"),
        ("Bearer abc", "no_credentials"),
        ("Basic !!!notbase64", "bad_credentials"),
        ("Basic " + base64.b64encode(b"no-colon").decode(), "bad_credentials"),
        ("Basic " + base64.b64encode(b"alice:\xff").decode(), "bad_credentials"),
        (basic("alice", "x" * 100), "bad_credentials"),  # over bcrypt's 72 bytes
    ],
)
def test_basic_auth_malformed(header: str | None, reason: str):
    assert BasicAuth().check({"alice": bcrypt_hash("s3cret")}, header) == (False, reason)


def test_basic_scheme_is_case_insensitive_and_password_may_hold_colons():
    users = {"alice": bcrypt_hash("a:b")}
    header = "basic " + base64.b64encode(b"alice:a:b").decode()
    assert BasicAuth().check(users, header) == (True, "alice")


# --- reloading --------------------------------------------------------------------------------------------------


def bump(path: Path) -> None:
    """Make sure a rewrite is seen as a change even within one mtime tick."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_watcher_reads_again_only_on_change(tmp_path: Path, pki: Pki):
    stats = Stats()
    path = write(tmp_path / "w.yml", {"basic_auth_users": {"alice": bcrypt_hash("a")}})
    watcher = WebConfigWatcher(path, stats)
    first = watcher.current()
    assert watcher.current() is first, "nothing changed: the same state, nothing read"
    assert not watcher.tls
    write(path, {"basic_auth_users": {"bob": bcrypt_hash("b")}})
    bump(path)
    second = watcher.current()
    assert list(second.users) == ["bob"]
    assert stats.get(WEB_CONFIG_RELOADS, result="ok") == 1


def test_a_broken_change_fails_closed_and_a_fix_recovers(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    stats = Stats()
    path = write(tmp_path / "w.yml", {"basic_auth_users": {"alice": bcrypt_hash("a")}})
    watcher = WebConfigWatcher(path, stats)
    path.write_text("basic_auth_users: {alice: plain}\n")
    bump(path)
    state = watcher.current()
    assert state.error is not None and "not a bcrypt hash" in state.error
    assert stats.get(WEB_CONFIG_RELOADS, result="error") == 1
    assert watcher.current().error is not None
    assert stats.get(WEB_CONFIG_RELOADS, result="error") == 1, "read again only when it changes"
    assert "guarded requests refused with 500" in caplog.text
    write(path, {"basic_auth_users": {"alice": bcrypt_hash("a")}})
    bump(path)
    assert watcher.current().error is None


def test_tls_cannot_be_turned_off_by_a_change(tmp_path: Path, pki: Pki):
    path = write(tmp_path / "w.yml", _tls_doc(pki))
    watcher = WebConfigWatcher(path, Stats())
    assert watcher.tls
    write(path, {"basic_auth_users": {}})
    bump(path)
    state = watcher.current()
    assert state.error is not None and "at start only" in state.error
    assert state.context is not None, "the TLS layer keeps the last certificate that loaded"


def test_certificate_rotation_in_place_is_seen(tmp_path: Path, pki: Pki):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    stats = Stats()
    watcher = WebConfigWatcher(
        write(tmp_path / "w.yml", {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}}), stats
    )
    before = watcher.current().context
    shutil.copy(pki.client_cert, cert)
    shutil.copy(pki.client_key, key)
    bump(cert)
    after = watcher.current()
    assert after.error is None
    assert after.context is not before
    assert stats.get(WEB_CONFIG_RELOADS, result="ok") == 1


def test_a_bad_file_at_start_is_an_error(tmp_path: Path):
    with pytest.raises(AacoError, match="unknown key"):
        WebConfigWatcher(write(tmp_path / "w.yml", {"tls": {}}), Stats())
