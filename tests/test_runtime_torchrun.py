"""Workers started by torchrun on two "nodes" (both on loopback) join one driver and train."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sbplab.runtime import LocalCluster
from sbplab.runtime.cluster import free_port
from sbplab.runtime.examples import data_parallel_linear, reference_mlp_steps
from sbplab.runtime.worker_main import WrongToken, connect

pytestmark = pytest.mark.multiprocess


def _torchrun() -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


def test_two_torchrun_launches_form_one_cluster_and_run_a_dp_step(tmp_path):
    """Node 0 gets the cluster's random token from $SBPLAB_TOKEN, node 1 from a private token file."""
    cluster = LocalCluster(2, launch="external")
    host, port = cluster.address
    master = free_port()
    token_file = tmp_path / "token"
    token_file.write_text(cluster.token)
    token_file.chmod(0o600)
    plain = {k: v for k, v in os.environ.items() if k != "SBPLAB_TOKEN"}
    how = [({**plain, "SBPLAB_TOKEN": cluster.token}, []), (plain, ["--token-file", str(token_file)])]
    procs = [subprocess.Popen(_torchrun() + ["--nnodes=2", "--nproc-per-node=1", f"--node-rank={i}",
                                             "--master-addr=127.0.0.1", f"--master-port={master}",
                                             "-m", "sbplab.worker", "--driver", f"{host}:{port}", *extra],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i, (env, extra) in enumerate(how)]
    try:
        with pytest.raises(WrongToken, match="refused this worker's token"):  # a stranger without the token
            connect(cluster.address, b"wrong token", rank=5, timeout=10)
        assert cluster.failed_authentications == 1
        cluster.wait_ready(timeout=120)
        torch.manual_seed(0)
        w0 = torch.randn(5, 2)
        batches = [{"x": torch.randn(8, 5), "t": torch.randn(8, 2)} for _ in range(2)]
        res = cluster.run(data_parallel_linear(2, w0, lr=0.1, batch=8), batches, steps=2, progress=False)
        ref_losses, ref_w = reference_mlp_steps([w0], batches, 0.1, 2)
        assert res.losses == pytest.approx(ref_losses, rel=1e-5)
        assert torch.allclose(res.params["w"].full(), ref_w[0], atol=1e-6)
        assert {e.rank for e in res.trace.events} == {0, 1}
    finally:
        cluster.close()
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=60)[0].decode(errors="replace"))
            except subprocess.TimeoutExpired:
                p.kill()
                outs.append(p.communicate()[0].decode(errors="replace"))
    assert [p.returncode for p in procs] == [0, 0], outs
