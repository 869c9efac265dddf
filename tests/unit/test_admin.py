"""Admin credentials (token file, bearer token, Unix socket peer) and the capture source's target policy."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from aaco.agent.admin import ADMIN_REQUESTS, TokenAuth, load_token, read_token
from aaco.agent.admin_socket import AdminSocketServer, UnixHTTPConnection
from aaco.agent.pipeline.bus import Bus
from aaco.agent.sources.base import Journal, SourceContext
from aaco.agent.sources.capture import CAPTURES, PF_KTHREAD, CaptureConfig, CaptureSource, Outcome, forbidden
from aaco.contract.errors import AacoError
from aaco.contract.stats import Stats
from tests.conftest import skip_or_fail

TOKEN = "k" * 40


# -- the token file ---------------------------------------------------------------------------------


def test_a_missing_token_is_generated_0600_even_under_umask_0(tmp_path):
    path = tmp_path / "var" / "admin-token"
    old = os.umask(0)
    try:
        token = load_token(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == token + "\n" and len(token) >= 32
    assert load_token(path) == token  # read back, not replaced
    assert [p.name for p in path.parent.iterdir()] == ["admin-token"]  # no temporary file left


def test_a_token_open_to_other_users_is_refused(tmp_path):
    path = tmp_path / "admin-token"
    path.write_text(TOKEN)
    path.chmod(0o644)  # a Secret volume's default mode
    with pytest.raises(AacoError, match="open to every local user") as err:
        load_token(path)
    assert "defaultMode 0400" in str(err.value)


def test_a_group_readable_token_is_a_warning(tmp_path, caplog):
    path = tmp_path / "admin-token"
    path.write_text(f"  {TOKEN}\n\n")
    path.chmod(0o640)
    assert load_token(path) == TOKEN  # whitespace stripped
    assert "open to its group" in caplog.text


@pytest.mark.parametrize("content", ["short", "", "k" * 20 + " " + "k" * 20, "k" * 40 + "\u00e9", "k" * 5000])
def test_what_is_no_token_is_refused(tmp_path, content):
    path = tmp_path / "admin-token"
    path.write_text(content)
    path.chmod(0o600)
    with pytest.raises(AacoError, match="not an admin token"):
        load_token(path)


def test_an_unwritable_place_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(AacoError, match="cannot read the admin token") as err:
        load_token(blocker / "admin-token")
    assert "admin.token_file" in str(err.value)
    with pytest.raises(AacoError, match="cannot write one") as err:
        load_token(Path("/proc/self/admin-token"))  # a directory nobody, root included, may create files in
    assert "admin.token_file" in str(err.value)
    with pytest.raises(AacoError, match="cannot read the admin token"):
        read_token(tmp_path / "absent")


# -- the bearer token -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "outcome"),
    [
        (None, "no_credential"),
        ("", "no_credential"),
        (f"Basic {TOKEN}", "malformed"),
        ("Bearer", "malformed"),
        ("Bearer " + "x" * 40, "wrong_token"),
        ("Bearer " + TOKEN[:-1], "wrong_token"),
        ("Bearer " + TOKEN + "\u00e9", "wrong_token"),
    ],
)
def test_only_the_token_is_accepted(header, outcome):
    stats = Stats()
    ok, why = TokenAuth(TOKEN, stats).authorize(header, "127.0.0.2:4000")
    assert not ok and why
    assert stats.get(ADMIN_REQUESTS, action="authenticate", outcome=outcome) == 1
    assert stats.get(ADMIN_REQUESTS, action="authenticate", outcome="accepted") == 0


@pytest.mark.parametrize("header", [f"Bearer {TOKEN}", f"bearer  {TOKEN} "])
def test_the_token_is_accepted_and_names_the_peer(header):
    stats = Stats()
    assert TokenAuth(TOKEN, stats).authorize(header, "127.0.0.2:4000") == (True, "token from 127.0.0.2:4000")
    assert stats.get(ADMIN_REQUESTS, action="authenticate", outcome="accepted") == 1


# -- the Unix socket --------------------------------------------------------------------------------


def _post(path: Path, query: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    conn = UnixHTTPConnection(path, timeout=10)
    try:
        conn.request("POST", f"/api/v1/capture?{query}", headers={"Content-Length": "0", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.fixture
def socket_server(tmp_path):
    stats = Stats()
    asked: list[tuple[dict[str, str], str]] = []

    def action(params: dict[str, str], who: str) -> dict:
        asked.append((params, who))
        return {"queued": True}

    def serve(allowed: list[int]) -> AdminSocketServer:
        server = AdminSocketServer(
            tmp_path / "run" / "admin.sock", allowed, {"/api/v1/capture": action}, TokenAuth(TOKEN, stats), stats
        )
        server.start()
        started.append(server)
        return server

    started: list[AdminSocketServer] = []
    yield serve, stats, asked
    for server in started:
        server.stop()


def test_an_allowed_uid_runs_actions_on_the_socket(socket_server):
    serve, stats, asked = socket_server
    server = serve([os.getuid()])
    assert stat.S_ISSOCK(server.path.stat().st_mode) and stat.S_IMODE(server.path.stat().st_mode) == 0o660
    assert _post(server.path, "pid=42") == (202, {"queued": True})
    assert asked == [({"pid": "42"}, f"uid {os.getuid()} pid {os.getpid()} on unix socket")]
    assert stats.get(ADMIN_REQUESTS, action="authenticate", outcome="accepted") == 1
    server.stop()
    assert not server.path.exists()


def test_another_uid_is_refused_unless_it_sends_the_token(socket_server):
    serve, stats, asked = socket_server
    server = serve([os.getuid() + 1])
    code, doc = _post(server.path, "pid=42")
    assert code == 403 and "not in admin.allowed_uids" in doc["error"]
    assert stats.get(ADMIN_REQUESTS, action="authenticate", outcome="uid_not_allowed") == 1
    code, doc = _post(server.path, "pid=42", {"Authorization": "Bearer wrong"})
    assert code == 403 and stats.get(ADMIN_REQUESTS, action="authenticate", outcome="wrong_token") == 1
    assert asked == []
    assert _post(server.path, "pid=42", {"Authorization": f"Bearer {TOKEN}"})[0] == 202
    assert asked[0][1].startswith("token from uid ")


def test_the_socket_replaces_a_stale_one_but_never_a_file(socket_server, tmp_path):
    serve, _, _ = socket_server
    first = serve([0])
    first._server.server_close()  # type: ignore[union-attr]  # as a crash would leave it: the file, no server
    first._server = None
    assert first.path.exists()
    second = serve([os.getuid()])
    assert _post(second.path, "pid=1")[0] == 202
    second.stop()
    second.path.write_text("not a socket")
    with pytest.raises(AacoError, match="not a socket"):
        serve([0])


# -- the capture policy -----------------------------------------------------------------------------


def _stat_line(pid: int, comm: str, ppid: int, flags: int) -> str:
    return f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 {flags} 0 0 0 0\n"


def test_forbidden_processes(tmp_path):
    proc = tmp_path / "proc"
    for pid, comm, ppid, flags in [
        (100, "kworker/0:1", 2, PF_KTHREAD),
        (101, "odd", 7, PF_KTHREAD),  # a kernel thread by its flag alone
        (102, "child of kthreadd", 2, 0),
        (103, "python) S 2 3 (x", 50, 0x400000),  # parentheses in the command name do not fool the parser
        (104, "broken", 1, 0),
    ]:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(_stat_line(pid, comm, ppid, flags))
    (proc / "104" / "stat").write_text("104 (broken) S")
    assert "init" in forbidden(1, proc)
    assert "kthreadd" in forbidden(2, proc)
    assert "this agent" in forbidden(os.getpid(), proc)
    for pid in (100, 101, 102):
        assert "kernel thread" in forbidden(pid, proc)
    assert forbidden(103, proc) is None
    assert "unreadable" in forbidden(104, proc)
    assert forbidden(105, proc) is None  # gone: the caller says so


@pytest.fixture
def sleepers():
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]) for _ in range(3)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def _source(tmp_path, targets, **extra) -> tuple[CaptureSource, Stats]:
    cfg = CaptureConfig(command="true {out}", out_dir=tmp_path, targets=targets, **extra)
    src = CaptureSource(cfg, "cap")
    stats = Stats()
    src._ctx = SourceContext("n", stats, Bus(stats), Journal(stats))
    return src, stats


def test_only_targets_are_captured_and_never_init_or_the_agent(tmp_path, sleepers):
    target, other, third = sleepers
    src, stats = _source(tmp_path, [target, third, os.getpid()], max_queue=1)
    answers = {
        "target": src.request(target, "test"),
        "again": src.request(target, "test"),
        "full": src.request(third, "test"),
        "other": src.request(other, "test"),
        "init": src.request(1, "test"),
        "agent": src.request(os.getpid(), "test"),  # listed, and still refused
        "gone": src.request(2**22 + 12345, "test"),
    }
    assert {k: a.outcome for k, a in answers.items()} == {
        "target": Outcome.QUEUED,
        "again": Outcome.ALREADY,
        "full": Outcome.QUEUE_FULL,
        "other": Outcome.NOT_A_TARGET,
        "init": Outcome.FORBIDDEN,
        "agent": Outcome.FORBIDDEN,
        "gone": Outcome.NO_SUCH_PROCESS,
    }
    assert "this agent" in answers["agent"].detail and "init" in answers["init"].detail
    counted = {o: stats.get(CAPTURES, source="cap", outcome=o) for o in ("refused_target", "refused_forbidden")}
    assert counted == {"refused_target": 1, "refused_forbidden": 2}
    assert stats.get(CAPTURES, source="cap", outcome="refused_already") == 1
    assert stats.get(CAPTURES, source="cap", outcome="refused_queue") == 1
    assert stats.get(CAPTURES, source="cap", outcome="refused_gone") == 1


def test_gpu_targets_are_processes_with_a_gpu_open(tmp_path, sleepers):
    src, stats = _source(tmp_path, "gpu")
    answer = src.request(sleepers[0], "test")  # a plain sleeper has no GPU device open
    assert answer.outcome is Outcome.NOT_A_TARGET and "no GPU device" in answer.detail
    assert src.request(1, "test").outcome is Outcome.FORBIDDEN
    assert stats.get(CAPTURES, source="cap", outcome="refused_target") == 1


def test_a_kernel_thread_is_never_captured(tmp_path):
    kthreads = [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and p.name != "2" and forbidden(int(p.name)) == f"pid {p.name} is a kernel thread"
    ]
    if not kthreads:
        skip_or_fail("no kernel thread is visible in this pid namespace (the fake /proc test covers the rule)")
    src, _ = _source(tmp_path, kthreads[:1])
    assert src.request(kthreads[0], "test").outcome is Outcome.FORBIDDEN


def test_a_thread_stands_for_its_process(tmp_path):
    import threading

    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        src, _ = _source(tmp_path, [os.getpid()])
        answer = src.request(worker.native_id, "test")  # a thread of the agent is the agent
        assert answer.outcome is Outcome.FORBIDDEN and answer.pid == os.getpid()
    finally:
        stop.set()
        worker.join()


@pytest.mark.parametrize("targets", [[1], [5, 2]])
def test_init_and_kthreadd_cannot_be_configured_targets(tmp_path, targets):
    with pytest.raises(ValidationError, match="never captured"):
        CaptureConfig(command="true {out}", out_dir=tmp_path, targets=targets)
