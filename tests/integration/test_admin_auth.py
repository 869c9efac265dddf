"""Issue 14, point 3: the capture endpoint needs a credential, and captures only what its targets allow.

A real agent (``aaco agent``) with a capture source whose profiler is a real command writing a real
rocprofv3 trace; it generates its admin token and serves the Unix socket. Asked over TCP without
the token or with a wrong one: 401; from another uid on the socket: refused (by the socket's mode,
then by SO_PEERCRED for a uid in its group); pid 1 or the agent itself with the token: 403; the
targeted pids, once with the token over TCP and once over the socket as root: run and ingested.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import stat
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from aaco.agent.admin_socket import UnixHTTPConnection
from tests.conftest import get_free_port, skip_or_fail
from tests.support.processes import sleepers as running_sleepers

from .helpers import http_get, metric_value, read_lake, run_aaco, start_aaco, wait_for

pytestmark = pytest.mark.integration

NOBODY = 65534


@pytest.fixture
def sleepers(tmp_path):
    with running_sleepers(tmp_path, 3) as pids:
        yield pids


@pytest.fixture
def socket_dir():
    """A directory another uid may enter (pytest's tmp_path is 0700): the socket's own mode decides."""
    path = Path(tempfile.mkdtemp(prefix="aaco-admin-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def post(url: str, authorization: str | None = None) -> tuple[int, str]:
    """POST ``url`` with an optional Authorization header: (status, body)."""
    req = urllib.request.Request(url, data=b"", method="POST")
    if authorization is not None:
        req.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def socket_status_as(path: Path, uid: int, gid: int, pid: int) -> str:
    """POST a capture on the socket from a forked child running as ``uid``/``gid``: its status, or the errno."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        result = "?"
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            conn = UnixHTTPConnection(path, timeout=10)
            conn.request("POST", f"/api/v1/capture?pid={pid}", headers={"Content-Length": "0"})
            result = str(conn.getresponse().status)
        except OSError as exc:
            result = f"errno {exc.errno}"
        except BaseException as exc:  # anything else is reported, never raised in a forked pytest
            result = repr(exc)
        finally:
            os.write(w, result.encode())
            os._exit(0)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 30)
        if not ready:
            os.kill(child, signal.SIGKILL)
            pytest.fail(f"the client as uid {uid} did not answer in 30 s")
        return os.read(r, 200).decode()
    finally:
        os.close(r)
        os.waitpid(child, 0)


def test_capture_needs_a_credential_and_a_target(tmp_path, samples, aaco_bin, sleepers, socket_dir):
    if os.geteuid() != 0:
        skip_or_fail("acting as another uid (nobody) on the admin socket needs root")
    first, second, untargeted = sleepers
    port = get_free_port()
    token_file = tmp_path / "secret" / "admin-token"
    sock = socket_dir / "admin.sock"
    cfg = tmp_path / "agent.yaml"
    sample = samples / "rocprofv3" / "kernel_trace.csv"
    cfg.write_text(
        yaml.safe_dump(
            {
                "node": "admin-node",
                "sources": [
                    {
                        "type": "capture",
                        "command": f"cp {sample} {{out}}/{{pid}}_kernel_trace.csv",
                        "out_dir": str(tmp_path / "captures"),
                        "targets": [first, second],
                        "interval_s": 0,  # on demand only: every window below was asked for
                        "min_gap_s": 120,
                        "duration_ms": 100,
                    }
                ],
                "admin": {"token_file": str(token_file), "socket": str(sock), "allowed_uids": [0]},
                "exporters": {
                    "prometheus": {"port": port},
                    "lake": {"path": str(tmp_path / "lake"), "flush_interval_s": 0.3},
                },
                "pipeline": {"snapshot_interval_s": 0.5},
            }
        )
    )
    log = tmp_path / "agent.log"
    agent = start_aaco(aaco_bin, "agent", "--config", str(cfg), log=log)
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/api/v1/capture?pid="

    def metrics(name: str, **labels: str) -> float:
        return metric_value(http_get(base + "/metrics")[1], name, **labels) or 0

    try:
        wait_for(lambda: http_get(base + "/readyz")[0] == 200, 60, what="ready")
        # the token the agent generated: 0600, and the socket: 0660
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(sock.stat().st_mode) == 0o660
        token = token_file.read_text().strip()

        # over TCP: no token, a wrong one, another scheme: 401, nothing runs
        assert post(url + str(first))[0] == 401
        assert post(url + str(first), "Bearer " + "x" * len(token))[0] == 401
        assert post(url + str(first), "Basic " + token)[0] == 401
        for outcome in ("no_credential", "wrong_token", "malformed"):
            assert metrics("aaco_admin_requests_total", action="authenticate", outcome=outcome) == 1

        # with the token: pid 1 and the agent itself are refused, whatever the targets; so is a pid not targeted
        bearer = f"Bearer {token}"
        for pid, reason in ((1, "forbidden"), (agent.pid, "forbidden"), (untargeted, "not_a_target")):
            code, body = post(url + str(pid), bearer)
            assert code == 403 and f'"reason": "{reason}"' in body, (pid, body)
        assert metrics("aaco_captures_total", source="capture", outcome="refused_forbidden") == 2
        assert metrics("aaco_captures_total", source="capture", outcome="refused_target") == 1

        # another uid on the socket: the socket's mode keeps it out; in the socket's group, its uid does
        assert socket_status_as(sock, NOBODY, NOBODY, first) == "errno 13"
        assert socket_status_as(sock, NOBODY, 0, first) == "403"
        assert metrics("aaco_admin_requests_total", action="authenticate", outcome="uid_not_allowed") == 1
        assert metrics("aaco_captures_total", source="capture", outcome="ok") == 0

        # a target: with the token over TCP, and as root over the socket (aaco capture --socket)
        assert post(url + str(first), bearer)[0] == 202
        proc = run_aaco(aaco_bin, "capture", "--socket", str(sock), "--pid", str(second))
        assert proc.returncode == 0 and f"pid {second}" in proc.stdout, proc.stderr
        wait_for(lambda: metrics("aaco_captures_total", source="capture", outcome="ok") == 2, 60, what="2 captures")
        assert metrics("aaco_admin_requests_total", action="capture", outcome="queued") == 2
        # and aaco capture with the token file, refused: pid 1 (403) is an error naming the reason
        refused = run_aaco(aaco_bin, "capture", "--agent", base, "--token-file", str(token_file), "--pid", "1")
        assert refused.returncode == 2 and "403" in refused.stderr and "init" in refused.stderr
        wait_for(lambda: metrics("aaco_kernels_total", kind="kernel") == 18, 30, what="both windows ingested")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(20) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
    assert not sock.exists()  # removed at shutdown
    kernels = read_lake(tmp_path / "lake", "kernels")
    assert sorted(set(kernels["pid"].to_pylist())) == sorted([first, second])
    text = log.read_text()
    # every action is logged with who asked, accepted and refused
    assert f"capture of pid {first} on source capture asked by token from 127.0.0.1:" in text
    assert f"capture of pid {second} on source capture asked by uid 0 pid " in text
    assert "capture of pid 1 asked by token from 127.0.0.1:" in text and "refused (403 forbidden)" in text
    assert "admin action /api/v1/capture refused" in text and "wrong admin token" in text
    assert f"uid {NOBODY} is not in admin.allowed_uids" in text


def test_capture_without_a_token_file_is_a_clear_error(aaco_bin, tmp_path):
    proc = run_aaco(
        aaco_bin, "capture", "--pid", "5", "--agent", "http://127.0.0.1:9", "--token-file", str(tmp_path / "none")
    )
    assert proc.returncode == 2 and "cannot read the admin token" in proc.stderr and "--token-file" in proc.stderr
    assert "Traceback" not in proc.stderr
