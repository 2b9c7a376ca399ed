"""Gloo (CPU): its quirks, kept here.

- no AVG reduce op: an average is a sum, divided by the group size when waited for;
- a reduce-scatter's handle, and a send's or recv's, say they are done only once waited for (and
  have no future), so the runtime must not poll them;
- point-to-point messages are matched by tag, so every pair can share the world group.
"""

from __future__ import annotations

import torch.distributed as dist

from .interface import Capabilities, Work
from .torch_dist import OPS, REDUCE_SCATTER_SINGLE, TorchDistCommunicator


class GlooCommunicator(TorchDistCommunicator):
    backend = "gloo"
    caps = Capabilities(reduce_ops=frozenset({"sum", "max", "min"}), uneven_all_gather=False, tagged_p2p=True,
                        unpolled=frozenset({"reduce_scatter", "send", "recv"}), wait_blocks_cpu=True,
                        record_streams=False)

    def pair_group(self, a: int, b: int) -> object:
        return dist.group.WORLD

    def _averaged(self, op: str, what: str, out, p: int, post) -> Work:
        """Post with ``post(reduce_op)``; an ``avg`` goes out as a sum and is divided when waited for."""
        self.check_op(op, what)
        work = self._work(post(OPS["sum" if op == "avg" else op]), what)
        if op == "avg":
            work.after = lambda: out.div_(p)
        return work

    def all_reduce(self, t, op, group) -> Work:
        pg = self._pg(group, "all_reduce")
        return self._averaged(op, "all_reduce", t, len(group),
                              lambda o: dist.all_reduce(t, op=o, group=pg, async_op=True))

    def reduce_scatter(self, out, x, op, group) -> Work:
        pg, xc = self._pg(group, "reduce_scatter"), x.contiguous()
        return self._averaged(op, "reduce_scatter", out, len(group),
                              lambda o: REDUCE_SCATTER_SINGLE(out, xc, op=o, group=pg, async_op=True))
