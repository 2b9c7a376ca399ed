"""The token: random per cluster, never on a command line, never a constant; no token, no worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fault_helpers import check_dp_run

import sbplab
from sbplab.runtime import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.multiprocess, pytest.mark.timeout(120)]


def _worker(args: list[str], env: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sbplab.worker", *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)


def _env_without_token() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "SBPLAB_TOKEN"}


def test_workers_command_lines_do_not_show_the_token():
    with LocalCluster(2) as c:
        check_dp_run(c)
        token = c.token
        for pid in c.pids:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert b"sbplab.worker" in cmdline and token.encode() not in cmdline
            assert b"SBPLAB_TOKEN" not in cmdline


def test_every_cluster_has_its_own_random_token_loopback_and_external_alike():
    tokens = []
    for launch in ("external", "external", "spawn"):
        with LocalCluster(1, launch=launch) as c:
            tokens.append(c.token)
    assert len(set(tokens)) == 3 and all(len(t) == 64 for t in tokens)  # 32 random bytes, hex


def test_no_fixed_key_in_the_source():
    src = Path(sbplab.__file__).parent
    text = "\n".join(p.read_text() for p in src.rglob("*.py"))
    assert "LOOPBACK_TOKEN" not in text and "sbplab-loopback" not in text


def test_a_worker_without_a_token_refuses_to_start(tmp_path):
    out = _worker(["--driver", "127.0.0.1:9"], _env_without_token(), tmp_path)
    assert out.returncode != 0
    assert "no token" in out.stderr and "SBPLAB_TOKEN" in out.stderr and "--token-file" in out.stderr


def test_a_token_on_the_command_line_is_refused(tmp_path):
    out = _worker(["--driver", "127.0.0.1:9", "--token", "abc"], _env_without_token(), tmp_path)
    assert out.returncode == 2 and "ps" in out.stderr and "--token-file" in out.stderr


def test_a_token_file_others_can_read_is_refused(tmp_path):
    f = tmp_path / "token"
    f.write_text("abc\n")
    f.chmod(0o644)
    out = _worker(["--driver", "127.0.0.1:9", "--token-file", str(f)], _env_without_token(), tmp_path)
    assert out.returncode != 0 and "chmod 600" in out.stderr


def test_a_private_token_file_lets_a_worker_join(tmp_path):
    with LocalCluster(1, launch="external") as c:
        f = tmp_path / "token"
        f.write_text(c.token + "\n")
        f.chmod(0o600)
        host, port = c.address
        proc = subprocess.Popen([sys.executable, "-m", "sbplab.worker", "--driver", f"{host}:{port}",
                                 "--token-file", str(f)], env={**_env_without_token(), "RANK": "0",
                                 "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                                 "MASTER_PORT": str(_free_port())}, cwd=tmp_path)
        try:
            c.wait_ready(timeout=60)
            assert c.alive
        finally:
            c.close()
            assert proc.wait(timeout=30) == 0


def _free_port() -> int:
    from sbplab.runtime.cluster import free_port

    return free_port()
