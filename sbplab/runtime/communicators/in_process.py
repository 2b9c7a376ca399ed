"""Ranks held in one process: an ``InProcessWorld`` and one ``InProcessCommunicator`` per rank.

What the in-process executor uses so that CPU runs drive the same kind code as the workers: a kind
posts its operation on each member's communicator exactly as a worker would on Gloo, and the world
moves the tensors between the members' buffers when the last member has posted (a rendezvous, as
c10d matches collectives by their order on a group). Nothing computes the global result from the
logical tensor: each member's output buffer is written from the other members' input buffers.

Ranks may post from one thread (post every member, then wait: the sequential exchange the
in-process executor uses) or from one thread each (``wait_timeout_s`` > 0 lets ``wait`` block until
the others post). A wait that cannot finish says which ranks never posted, instead of hanging.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .interface import Capabilities, Communicator, CommunicatorError, Work


def reduce_into(op: str, xs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The members' tensors reduced in group order (a fresh tensor)."""
    acc = xs[0].clone()
    for x in xs[1:]:
        if op in ("sum", "avg"):
            acc += x
        elif op == "max":
            torch.maximum(acc, x, out=acc)
        else:
            torch.minimum(acc, x, out=acc)
    if op == "avg":
        if acc.is_floating_point() or acc.is_complex():
            acc.div_(len(xs))
        else:
            acc.div_(len(xs), rounding_mode="floor")
    return acc


@dataclass(eq=False)
class _Rendezvous:
    """One operation of a group (or one message of a pair): what each member posted, and whether it ran."""

    op: str
    members: tuple[int, ...]
    posted: dict[int, tuple] = field(default_factory=dict)
    done: bool = False
    error: str | None = None

    def missing(self) -> list[int]:
        return [r for r in self.members if r not in self.posted]


@dataclass(eq=False)
class _Handle:
    """The backend handle ``Work`` wraps: done when the rendezvous ran."""

    world: InProcessWorld
    rv: _Rendezvous
    rank: int

    def is_completed(self) -> bool:
        return self.rv.done

    def wait(self) -> None:
        w = self.world
        with w.cond:
            if not self.rv.done and w.wait_timeout_s > 0:
                w.cond.wait_for(lambda: self.rv.done, timeout=w.wait_timeout_s)
            if self.rv.error is not None:
                raise CommunicatorError(self.rv.error)
            if not self.rv.done:
                raise CommunicatorError(
                    f"rank {self.rank} waits for {self.rv.op} on ranks {self.rv.members}, which ranks "
                    f"{self.rv.missing()} have not posted: in one process every member must post before any "
                    f"waits (or post from one thread per rank with wait_timeout_s > 0)")


class InProcessWorld:
    """The ranks of one process and the operations they posted, matched per group in posting order."""

    def __init__(self, ranks: Sequence[int], device: torch.device | str = "cpu", wait_timeout_s: float = 0.0) -> None:
        self.ranks = tuple(sorted(int(r) for r in ranks))
        self.device = torch.device(device)
        self.wait_timeout_s = wait_timeout_s
        self.cond = threading.Condition()
        self.groups: set[tuple[int, ...]] = set()
        self.next_seq: dict[tuple, int] = {}  # (group, rank) -> its next operation's number on that group
        self.pending: dict[tuple, _Rendezvous] = {}  # (group, number) -> rendezvous
        self.mail: dict[tuple[int, int, int], deque[_Rendezvous]] = {}  # (src, dst, tag) -> unmatched messages
        self.comms = {r: InProcessCommunicator(self, r) for r in self.ranks}
        self.counts: Counter[str] = Counter()  # operations run, by name ("send_recv" for a message)

    def reset(self) -> None:
        """Forget operations posted but never completed (a step that failed half-way), keeping the groups,
        so the next step's posts match from the start again."""
        with self.cond:
            self.next_seq.clear()
            self.pending.clear()
            self.mail.clear()

    def communicator(self, rank: int) -> InProcessCommunicator:
        if rank not in self.comms:
            raise CommunicatorError(f"rank {rank} is not held in this process; ranks {list(self.ranks)} are")
        return self.comms[rank]

    def _finish(self, rv: _Rendezvous, run: Callable[[_Rendezvous], None]) -> None:
        try:
            run(rv)
        except CommunicatorError as e:
            rv.error = str(e)
        rv.done = True
        self.counts[rv.op if rv.members != ("send", "recv") else "send_recv"] += 1
        self.cond.notify_all()

    def post_collective(self, rank: int, op: str, group: tuple[int, ...], args: tuple,
                        run: Callable[[_Rendezvous], None]) -> _Rendezvous:
        with self.cond:
            seq = self.next_seq.get((group, rank), 0)
            self.next_seq[(group, rank)] = seq + 1
            rv = self.pending.setdefault((group, seq), _Rendezvous(op, group))
            if rv.op != op:
                raise CommunicatorError(f"rank {rank} posted {op} as operation #{seq} on ranks {group}, where "
                                        f"ranks {sorted(rv.posted)} posted {rv.op}: every member must post the "
                                        f"same collectives in the same order")
            rv.posted[rank] = args
            if not rv.missing():
                del self.pending[(group, seq)]
                self._finish(rv, run)
            return rv

    def post_p2p(self, src: int, dst: int, tag: int, side: str, t: torch.Tensor) -> _Rendezvous:
        with self.cond:
            queue = self.mail.setdefault((src, dst, tag), deque())
            rv = next((m for m in queue if side not in m.posted), None)
            if rv is None:
                rv = _Rendezvous(f"send/recv {src} -> {dst} (tag {tag})", ("send", "recv"))
                queue.append(rv)
            rv.posted[side] = (t,)  # type: ignore[index]
            if not rv.missing():
                queue.remove(rv)
                self._finish(rv, _deliver)
            return rv


def _deliver(rv: _Rendezvous) -> None:
    (x,), (y,) = rv.posted["send"], rv.posted["recv"]  # type: ignore[index]
    if x.shape != y.shape or x.dtype != y.dtype:
        raise CommunicatorError(f"{rv.op}: sent {tuple(x.shape)} {x.dtype} into a receive buffer of "
                                f"{tuple(y.shape)} {y.dtype}")
    y.copy_(x)


def _same(rv: _Rendezvous, what: str, values: list) -> None:
    if len(set(values)) > 1:
        raise CommunicatorError(f"{rv.op} on ranks {rv.members}: members disagree on {what}: {values}")


def _all_reduce(rv: _Rendezvous) -> None:
    ts = [rv.posted[r][0] for r in rv.members]
    _same(rv, "shape", [tuple(t.shape) for t in ts])
    total = reduce_into(rv.posted[rv.members[0]][1], ts)
    for t in ts:
        t.copy_(total)


def _all_gather(rv: _Rendezvous) -> None:
    xs = [rv.posted[r][1] for r in rv.members]
    _same(rv, "piece shape (pieces must be equal)", [tuple(x.shape) for x in xs])
    n = xs[0].shape[0]
    for r in rv.members:
        out = rv.posted[r][0]
        for j, x in enumerate(xs):
            out[j * n:(j + 1) * n].copy_(x)


def _reduce_scatter(rv: _Rendezvous) -> None:
    xs = [rv.posted[r][1] for r in rv.members]
    _same(rv, "input shape", [tuple(x.shape) for x in xs])
    op, p = rv.posted[rv.members[0]][2], len(xs)
    n = xs[0].shape[0] // p
    for i, r in enumerate(rv.members):
        rv.posted[r][0].copy_(reduce_into(op, [x[i * n:(i + 1) * n] for x in xs]))


def _all_to_all(rv: _Rendezvous) -> None:
    m = rv.members
    for i, r in enumerate(m):
        out, _, out_splits, _ = rv.posted[r]
        outs = torch.split(out, list(out_splits))
        for j, s in enumerate(m):
            _, x, _, in_splits = rv.posted[s]
            piece = torch.split(x, list(in_splits))[i]
            if piece.numel() != outs[j].numel():
                raise CommunicatorError(f"{rv.op} on ranks {m}: rank {s} sends {piece.numel()} elements to rank "
                                        f"{r}, which expects {outs[j].numel()}")
            outs[j].copy_(piece)


def _broadcast(rv: _Rendezvous) -> None:
    src = rv.posted[rv.members[0]][1]
    _same(rv, "source rank", [rv.posted[r][1] for r in rv.members])
    x = rv.posted[src][0]
    for r in rv.members:
        if r != src:
            rv.posted[r][0].copy_(x)


class InProcessCommunicator(Communicator):
    """One rank's view of an ``InProcessWorld``."""

    backend = "in_process"
    caps = Capabilities(reduce_ops=frozenset({"sum", "max", "min", "avg"}), uneven_all_gather=False,
                        tagged_p2p=True, unpolled=frozenset(), wait_blocks_cpu=True, record_streams=False)

    def __init__(self, world: InProcessWorld, rank: int) -> None:
        super().__init__(rank, len(world.ranks), world.device)
        self.world = world

    def ensure_groups(self, groups, pairs=()) -> None:
        with self.world.cond:
            for g in groups:
                key = tuple(int(r) for r in g)
                bad = [r for r in key if r not in self.world.comms]
                if bad:
                    raise CommunicatorError(f"group {key}: ranks {bad} are not held in this process "
                                            f"(ranks {list(self.world.ranks)})")
                self.world.groups.add(key)

    def has_group(self, ranks) -> bool:
        return tuple(ranks) in self.world.groups

    def group(self, ranks) -> object:
        return self.check_group(ranks, "group")

    def _post(self, op: str, group, args: tuple, run) -> Work:
        g = self.check_group(group, op)
        rv = self.world.post_collective(self.rank, op, g, args, run)
        return Work(_Handle(self.world, rv, self.rank), op, True)

    def all_reduce(self, t, op, group) -> Work:
        self.check_op(op, "all_reduce")
        return self._post("all_reduce", group, (t, op), _all_reduce)

    def all_gather(self, out, x, group) -> Work:
        return self._post("all_gather", group, (out, x), _all_gather)

    def reduce_scatter(self, out, x, op, group) -> Work:
        self.check_op(op, "reduce_scatter")
        return self._post("reduce_scatter", group, (out, x, op), _reduce_scatter)

    def all_to_all(self, out, x, out_splits, in_splits, group) -> Work:
        return self._post("all_to_all", group, (out, x, tuple(out_splits), tuple(in_splits)), _all_to_all)

    def broadcast(self, t, src, group) -> Work:
        return self._post("broadcast", group, (t, src), _broadcast)

    def _p2p(self, side: str, t: torch.Tensor, peer: int, tag: int) -> Work:
        self.world.communicator(peer)
        src, dst = (self.rank, peer) if side == "send" else (peer, self.rank)
        rv = self.world.post_p2p(src, dst, tag, side, t)
        return Work(_Handle(self.world, rv, self.rank), side, True)

    def send(self, t, peer, tag=0) -> Work:
        return self._p2p("send", t, peer, tag)

    def recv(self, t, peer, tag=0) -> Work:
        return self._p2p("recv", t, peer, tag)
