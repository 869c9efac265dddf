"""``aaco capture`` to an agent whose metrics port serves TLS (``--web-config-file``): ``--cacert`` trusts its CA."""

from __future__ import annotations

import signal
import ssl
import urllib.request

import pytest
import yaml

from tests.conftest import get_free_port
from tests.support.pki import make_pki
from tests.support.processes import sleepers as running_sleepers

from .helpers import run_aaco, start_aaco, wait_for

pytestmark = pytest.mark.integration


def test_capture_over_https_with_the_agents_ca(tmp_path, samples, aaco_bin, sleeper_pid):
    pki = make_pki(tmp_path / "pki")
    web = tmp_path / "web.yaml"
    web.write_text(
        yaml.safe_dump({"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}})
    )
    port = get_free_port()
    token_file = tmp_path / "admin-token"
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "node": "tls-node",
                "sources": [
                    {
                        "type": "capture",
                        "command": f"cp {samples / 'rocprofv3' / 'kernel_trace.csv'} {{out}}/{{pid}}_kernel_trace.csv",
                        "out_dir": str(tmp_path / "captures"),
                        "targets": [sleeper_pid],
                        "interval_s": 0,
                        "duration_ms": 100,
                    }
                ],
                "admin": {"token_file": str(token_file)},
                "exporters": {
                    "prometheus": {"port": port},
                    "lake": {"path": str(tmp_path / "lake")},
                },
            }
        )
    )
    agent = start_aaco(
        aaco_bin, "agent", "--config", str(cfg), "--web-config-file", str(web), log=tmp_path / "agent.log"
    )
    base = f"https://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=str(pki.ca))

    def ready() -> bool:
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=5, context=context) as resp:
                return resp.status == 200
        except OSError:
            return False

    try:
        wait_for(ready, 60, what="agent ready over https")
        args = ("capture", "--agent", base, "--token-file", str(token_file), "--pid", str(sleeper_pid))
        untrusted = run_aaco(aaco_bin, *args)
        assert untrusted.returncode == 2 and "certificate" in untrusted.stderr.lower(), untrusted.stderr
        wrong_ca = run_aaco(aaco_bin, *args, "--cacert", str(pki.other_ca))
        assert wrong_ca.returncode == 2, wrong_ca.stderr
        trusted = run_aaco(aaco_bin, *args, "--cacert", str(pki.ca))
        assert trusted.returncode == 0 and f"pid {sleeper_pid}" in trusted.stdout, trusted.stderr
        missing = run_aaco(aaco_bin, *args, "--cacert", str(tmp_path / "none.pem"))
        assert missing.returncode == 2 and "none.pem" in missing.stderr and "--cacert" in missing.stderr
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()


@pytest.fixture
def sleeper_pid(tmp_path):
    with running_sleepers(tmp_path, 1, "serve_sleeper") as (pid,):
        yield pid
