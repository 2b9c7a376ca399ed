"""The Communicator under the boxing kinds: the kinds' own code posted on the in-process communicator
(every rank in this process, sequentially or one thread per rank) and on real Gloo process groups gives
identical tensors and bytes for every kind; the in-process executor runs through it; the boxing kinds
never call torch.distributed themselves."""

from __future__ import annotations

import multiprocessing as mp
import pathlib
import pickle
import threading
import traceback

import pytest
import torch

import sbplab as sl
from sbplab.boxing import plan_boxing
from sbplab.boxing.kinds import kind_of
from sbplab.layout import random_shards
from sbplab.runtime.communicators import CommunicatorError, GlooCommunicator, InProcessWorld, NcclCommunicator
from sbplab.sbp import as_nd_sbp

WORLD = 3
GROUPS = [(0, 1, 2), (2, 0)]  # (2, 0): a group whose order is not the rank order
PAIRS = [(0, 1), (0, 2)]
# (kind, fields of its Collective, local input shape per group member) or ("p2p", src, dst, tag, shape)
CASES = [
    ("all_gather", dict(group=(0, 1, 2), dim=0, sizes=(3, 2, 2)), [(3, 4), (2, 4), (2, 4)]),
    ("all_gather", dict(group=(2, 0), dim=1), [(3, 2), (3, 2)]),
    ("reduce_scatter", dict(group=(0, 1, 2), dim=0, sizes=(3, 2, 2), reduce_op="sum"), [(7, 4)] * 3),
    ("reduce_scatter", dict(group=(0, 1, 2), dim=1, reduce_op="avg"), [(3, 6)] * 3),
    ("reduce_scatter", dict(group=(2, 0), dim=0, reduce_op="max"), [(4, 3)] * 2),
    ("all_reduce", dict(group=(0, 1, 2), reduce_op="sum"), [(5, 2)] * 3),
    ("all_reduce", dict(group=(0, 1, 2), reduce_op="avg"), [(5, 2)] * 3),
    ("all_reduce", dict(group=(2, 0), reduce_op="min"), [(2, 3)] * 2),
    ("all_to_all", dict(group=(0, 1, 2), dim=1, cat_dim=0, sizes=(2, 2, 1), cat_sizes=(3, 2, 2)),
     [(3, 5), (2, 5), (2, 5)]),
    ("broadcast", dict(group=(0, 1, 2), src=1), [(4, 2)] * 3),
    ("p2p", 0, 2, 5, (3, 3)),
    ("p2p", 2, 0, 6, (2, 4)),
    ("p2p", 1, 0, 7, (1, 5)),
]


def _input(case: int, rank: int, shape, device: torch.device | str = "cpu") -> torch.Tensor:
    """Small integers as floats: every reduction order gives the same bits."""
    g = torch.Generator().manual_seed(100 * case + rank)
    return torch.randint(-5, 6, tuple(shape), generator=g).float().to(device)


def _post(comm, case: int, rank: int):
    """This rank's part of case ``case``, posted by the kind on ``comm``: a Pending, or None if not a member."""
    from sbplab.runtime.specs import Collective, Recv, Send

    c = CASES[case]
    if c[0] == "p2p":
        _, src, dst, tag, shape = c
        kind = kind_of("send_recv")
        if rank == src:
            x = _input(case, rank, shape, comm.device)
            return kind.start(comm, Send("s", inputs=("x",), peer=dst, tag=tag), x, tag=tag)
        if rank == dst:
            return kind.start(comm, Recv("r", peer=src, tag=tag, shape=shape), None, tag=tag)
        return None
    name, fields, shapes = c
    if rank not in fields["group"]:
        return None
    actor = Collective("c", kind_=name, inputs=("x",), **fields)
    x = _input(case, rank, shapes[fields["group"].index(rank)], comm.device)
    return kind_of(name).start(comm, actor, x)


def _result(p) -> tuple:
    out = p.wait()
    return (None if out is None else out.to("cpu", copy=True), p.nbytes)


def _in_process_sequential() -> dict:
    """Every rank posts case k, then every rank waits (one thread)."""
    world = InProcessWorld(range(WORLD))
    world.communicator(0).ensure_groups(GROUPS, PAIRS)
    out = {}
    for k in range(len(CASES)):
        pend = {r: _post(world.communicator(r), k, r) for r in range(WORLD)}
        out.update({(k, r): _result(p) for r, p in pend.items() if p is not None})
    return out


def _rank_program(comm, rank: int) -> dict:
    """What one rank does on its own (a worker, or a thread): post each case, wait for it, go on."""
    out = {}
    for k in range(len(CASES)):
        p = _post(comm, k, rank)
        if p is not None:
            out[(k, rank)] = _result(p)
    return out


def _gloo_worker(rank: int, init: str, path: str, device_type: str = "cpu") -> None:
    from sbplab.runtime.comm import Comm

    res: dict = {}
    try:
        device = torch.device("cpu")
        if device_type == "cuda":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        Comm.init(rank, WORLD, device_type, init, timeout_s=60)
        comm = Comm(rank, WORLD, device_type, device)
        comm.ensure_groups(GROUPS, PAIRS)
        res = _rank_program(comm.communicator, rank)
        # Gloo's quirk, kept in its communicator: a reduce-scatter handle cannot be polled (NCCL's can)
        p = _post(comm.communicator, 2, rank)
        res["pollable"] = (p.work.pollable, p.work.op)
        p.wait()
    except Exception:
        res = {"error": traceback.format_exc()}
    with open(path, "wb") as f:
        pickle.dump(res, f)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def _gloo(tmp_path: pathlib.Path, device_type: str = "cpu") -> dict:
    ctx = mp.get_context("spawn")
    outs = [str(tmp_path / f"rank{r}.pkl") for r in range(WORLD)]
    procs = [ctx.Process(target=_gloo_worker, args=(r, f"file://{tmp_path}/store", outs[r], device_type))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0, f"worker exited with {p.exitcode}"
    res: dict = {}
    for o in outs:
        with open(o, "rb") as f:
            got = pickle.load(f)
        assert "error" not in got, got["error"]
        assert got.pop("pollable") == (device_type == "cuda", "reduce_scatter")
        res.update(got)
    return res


def _same(a: dict, b: dict) -> list:
    assert set(a) == set(b)
    return [key for key in a if a[key][1] != b[key][1]
            or (a[key][0] is None) != (b[key][0] is None)
            or (a[key][0] is not None and not torch.equal(a[key][0], b[key][0]))]


@pytest.mark.multiprocess
def test_every_kind_gives_the_same_tensors_and_bytes_in_process_and_on_gloo(tmp_path):
    seq = _in_process_sequential()
    gloo = _gloo(tmp_path)
    assert len(seq) == sum(len(c[1]["group"]) if c[0] != "p2p" else 2 for c in CASES)
    assert not _same(seq, gloo), _same(seq, gloo)
    # the results are the semantics, not just an agreement: spot-check against plain torch
    xs = [_input(5, r, (5, 2)) for r in range(WORLD)]
    assert torch.equal(seq[(5, 1)][0], xs[0] + xs[1] + xs[2])
    assert torch.equal(seq[(6, 2)][0], sum(_input(6, r, (5, 2)) for r in range(WORLD)) / WORLD)
    gathered = torch.cat([_input(1, 2, (3, 2)), _input(1, 0, (3, 2))], 1)  # group order (2, 0)
    assert torch.equal(seq[(1, 0)][0], gathered) and torch.equal(seq[(1, 2)][0], gathered)
    assert torch.equal(seq[(9, 0)][0], _input(9, 1, (4, 2)))
    assert torch.equal(seq[(10, 2)][0], _input(10, 0, (3, 3)))


def test_one_thread_per_rank_equals_the_sequential_exchange():
    seq = _in_process_sequential()
    world = InProcessWorld(range(WORLD), wait_timeout_s=60)
    world.communicator(0).ensure_groups(GROUPS, PAIRS)
    res: dict = {}
    errors: list = []

    def run(r: int) -> None:
        try:
            res.update(_rank_program(world.communicator(r), r))
        except Exception:  # noqa: BLE001 - reported below
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[0]
    assert not _same(seq, res), _same(seq, res)
    assert world.counts["all_reduce"] == 3 and world.counts["send_recv"] == 3


def test_plan_steps_through_the_in_process_communicator_equal_each_kinds_semantics():
    """Every collective step of a plan, run by ``run_in_process`` (the kinds' ``start`` on in-process
    communicators), equals the kind's one-process semantics (``apply``) computed from all shards."""
    shape = (7, 6)
    seen = set()
    for mesh, src, dst in [([0, 1, 2, 3], "S(0)", "B"), ([0, 1, 2, 3], "P", "S(0)"), ([0, 1, 2, 3], "P(min)", "B"),
                           ([0, 1, 2, 3], "S(1)", "S(0)"), ([[0, 1], [2, 3]], "P, S(0)", "S(1), B")]:
        pl = sl.Placement("cpu", mesh)
        full = torch.randn(shape, generator=torch.Generator().manual_seed(len(seen)))
        cur = random_shards(full, pl, as_nd_sbp(src, pl.ndim, 2), torch.Generator().manual_seed(1))
        for step in plan_boxing(shape, src, dst, pl).steps:
            got = step.kind_obj.run_in_process(step, cur, shape)
            if step.kind_obj.is_collective:
                seen.add(step.kind)
                for g in step.placement.groups(step.mesh_axis):
                    want = step.kind_obj.apply(step, tuple(g), [cur[r] for r in g], shape)
                    for r, w in zip(g, want):
                        assert got[r].shape == w.shape and torch.allclose(got[r], w, atol=1e-6), (step.kind, r)
            cur = got
    assert seen == {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"}


def test_the_in_process_executor_posts_its_boxing_on_the_in_process_communicator():
    from sbplab.compiler import SGD, compile, presets
    from sbplab.models import MLP, MLPConfig

    m = MLP(MLPConfig(n_blocks=1))
    xs, y = m.example_batch(8)
    c = compile(m, xs, loss_fn=m.loss_fn, target=y, optimizer=SGD(lr=0.1), strategy=presets.data_parallel(2))
    ex = c.executor()
    loss = ex.step(dict(zip(c.graph.inputs, [*xs, y])))
    assert loss == pytest.approx(float(m.loss_fn(m(*xs), y).detach()), rel=1e-5)  # plain torch, same parameters
    # every gradient all-reduced by the kind's own code, on the in-process communicator
    assert ex.world.counts["all_reduce"] == c.physical.count("all_reduce") > 0


def test_a_wait_that_cannot_finish_and_mismatched_posts_say_so():
    world = InProcessWorld([0, 1])
    a, b = world.communicator(0), world.communicator(1)
    a.ensure_groups([(0, 1)], [(0, 1)])
    w = a.all_reduce(torch.ones(2), "sum", (0, 1))
    with pytest.raises(CommunicatorError, match=r"rank 0 waits for all_reduce on ranks \(0, 1\), which ranks \[1\]"):
        w.wait()
    assert not w.is_completed()
    with pytest.raises(CommunicatorError, match="rank 1 posted broadcast as operation #0 on ranks"):
        b.broadcast(torch.ones(2), 0, (0, 1))
    world.reset()  # forgets the half-posted all-reduce: the next operations match from the start
    t0 = torch.zeros(2)
    w0, w1 = a.broadcast(t0, 1, (0, 1)), b.broadcast(torch.full((2,), 7.0), 1, (0, 1))
    w0.wait()
    w1.wait()
    assert w0.is_completed() and torch.equal(t0, torch.full((2,), 7.0))
    with pytest.raises(CommunicatorError, match=r"no such group"):
        a.all_gather(torch.empty(4), torch.ones(2), (1, 0))
    assert a.group([0, 1]) == (0, 1)
    with pytest.raises(CommunicatorError, match="reduce op 'prod'"):
        a.all_reduce(torch.ones(2), "prod", (0, 1))
    with pytest.raises(CommunicatorError, match=r"rank 5 is not held in this process"):
        world.communicator(5)


def test_capabilities_say_the_backend_quirks():
    gloo, nccl = GlooCommunicator.caps, NcclCommunicator.caps
    assert "avg" not in gloo.reduce_ops and "avg" in nccl.reduce_ops
    assert not gloo.pollable("reduce_scatter") and not gloo.pollable("send") and gloo.pollable("all_reduce")
    assert gloo.wait_blocks_cpu and not nccl.wait_blocks_cpu and nccl.record_streams
    assert gloo.tagged_p2p and not nccl.tagged_p2p


def test_the_boxing_kinds_never_call_torch_distributed():
    root = pathlib.Path(sl.__file__).parent / "boxing"
    offenders = [str(p) for p in root.rglob("*.py") if "torch.distributed" in p.read_text().replace(
        "``torch.distributed``", "") or "dist." in p.read_text()]
    assert not offenders, offenders


# --- CUDA / NCCL: skipped without a GPU -----------------------------------------------------------------
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@pytest.mark.multiprocess
@CUDA
@pytest.mark.skipif(torch.cuda.device_count() < WORLD, reason=f"needs {WORLD} GPUs")
def test_every_kind_gives_the_same_tensors_and_bytes_on_nccl(tmp_path):
    nccl = _gloo(tmp_path, "cuda")
    assert not _same(_in_process_sequential(), nccl), _same(_in_process_sequential(), nccl)


def _nccl_one_rank(path: str, init: str) -> None:
    """One rank, one GPU: every NCCL communicator operation on the group (0,), and the comm stream."""
    from sbplab.runtime.comm import Comm

    res: dict = {}
    try:
        torch.cuda.set_device(0)
        Comm.init(0, 1, "cuda", init, timeout_s=60)
        c = Comm(0, 1, "cuda", torch.device("cuda", 0)).communicator
        c.ensure_groups([(0,)])
        x = torch.arange(6.0, device="cuda").view(3, 2)
        st = c.streams()
        st.start_clock()
        with st.use(st.comm):
            y = x.clone()
            works = [c.all_reduce(y, "avg", (0,))]
            g = torch.empty_like(x)
            works.append(c.all_gather(g, x, (0,)))
            r = torch.empty_like(x)
            works.append(c.reduce_scatter(r, x, "max", (0,)))
            a = torch.empty(6, device="cuda")
            works.append(c.all_to_all(a, x.reshape(-1), [6], [6], (0,)))
            b = x.clone()
            works.append(c.broadcast(b, 0, (0,)))
            for w in works:
                w.wait()
            start = st.mark(st.comm)
            end = st.mark(st.comm)
        torch.cuda.synchronize()  # the values were made on the comm stream
        trace: list = []
        timing: list = []
        st.log(trace, timing, (0, 0, 1), start, end)
        st.resolve(trace, timing)
        res = {"values": [t.cpu() for t in (y, g, r, a.view(3, 2), b)], "x": x.cpu(), "trace": trace,
               "caps": (c.caps.wait_blocks_cpu, c.caps.record_streams)}
    except Exception:
        res = {"error": traceback.format_exc()}
    with open(path, "wb") as f:
        pickle.dump(res, f)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.mark.cuda
@pytest.mark.multiprocess
@CUDA
def test_the_nccl_communicator_runs_every_operation_on_one_gpu(tmp_path):
    ctx = mp.get_context("spawn")
    out = str(tmp_path / "rank0.pkl")
    p = ctx.Process(target=_nccl_one_rank, args=(out, f"file://{tmp_path}/store"))
    p.start()
    p.join(180)
    assert p.exitcode == 0
    with open(out, "rb") as f:
        res = pickle.load(f)
    assert "error" not in res, res["error"]
    assert all(torch.equal(v, res["x"]) for v in res["values"])  # one rank: every operation is the identity
    (_, _, _, t0, t1, _), = res["trace"]
    assert 0 < t0 <= t1
    assert res["caps"] == (False, True)
