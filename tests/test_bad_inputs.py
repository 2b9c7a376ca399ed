"""Known bad inputs each get a clear SbplabError, and docs/errors.md is the catalogue of them.

``CASES`` is the table: (section, bad input, code). Each snippet runs in a namespace of ready-made
objects (``SETUP``); the test checks the error class, that it is an ``sl.SbplabError`` and that its
message has the words that say what was wrong. ``test_the_catalogue_is_up_to_date`` renders every
case's error type and message as markdown and compares it with docs/errors.md; with
``SBPLAB_WRITE_DOCS=1`` it rewrites the file instead.

Errors raised before any worker starts use a cluster with no workers (``launch="external"``, nobody
joins); the few checks that need live workers share one two-rank cluster per module.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
import torch
from conftest import check_generated_doc

import sbplab as sl
from sbplab.compiler.reference import torch_steps

DOC = Path(__file__).resolve().parent.parent / "docs" / "errors.md"

SETUP = """\
import secrets
mesh1 = sl.Placement("cpu", [0, 1])
mesh2 = sl.Placement("cpu", [[0, 1], [2, 3]])
a = torch.arange(8.0).reshape(4, 2)
x = sl.tensor(a, mesh1, "S(0)", name="x")
torch.manual_seed(0)
model = sl.models.MLP(sl.models.MLPConfig(in_dim=4, width=4, hidden=8, n_blocks=1, n_classes=3))
(inp,), target = model.example_batch(4)
step = sl.compile(model, (inp,), loss_fn=model.loss_fn, target=target, optimizer=sl.SGD(lr=0.1),
                  strategy=sl.presets.data_parallel(2))
batch = (inp, target)
step4 = sl.compile(model, (inp,), loss_fn=model.loss_fn, target=target, strategy=sl.presets.data_parallel(4))
cluster = sl.LocalCluster(2, launch="external", start_timeout=1.0)  # no workers: these errors come first
closed = sl.LocalCluster(1, launch="external")
closed.close()
def mistyped_worker(c, rank):  # what a worker started with a wrong $SBPLAB_TOKEN does, then exits
    from sbplab.runtime.worker_main import connect
    try:
        connect(c.address, b"not the cluster's token", rank, timeout=5)
    except SystemExit:
        pass
"""

# (section, bad input, code, expected error class, words the message must contain)
CASES: list[tuple[str, str, str, str, tuple[str, ...]]] = [
    ("SBP values and text", "SBP text that is not S(i), B, P or P(max)/P(min)", 'sl.parse_sbp("S(0) B")',
     "SbpError", ("S(0) B", "P(max)")),
    ("SBP values and text", "a reduce op partials do not have", 'sl.P("avg")', "SbpError", ("avg", "max")),
    ("SBP values and text", "a split dim that is not an int", 'sl.S("0")', "InputTypeError", ("'0'", "int")),
    ("SBP values and text", "sbp=None", 'sl.tensor(a, mesh1, sbp=None, name="w")', "InputTypeError",
     ("w:", "None", "S(0), B")),
    ("SBP values and text", "one SBP entry for a 2-D mesh", 'sl.tensor(a, mesh2, "S(0)", name="w")', "SbpError",
     ("w:", "1 entries", "2 axes")),
    ("SBP values and text", "a split dim the tensor does not have", 'sl.tensor(a, mesh1, "S(2)", name="w")',
     "SbpError", ("w:", "S(2)", "0..1")),
    ("SBP values and text", "a split of a 0-D tensor", 'sl.tensor(torch.tensor(1.0), mesh1, "S(0)", name="w")',
     "SbpError", ("w:", "0-D", "B or P")),
    ("SBP values and text", "a dim smaller than the parts it is split into",
     'sl.tensor(torch.ones(1, 4), mesh1, "S(0)", name="w")', "LayoutError", ("w:", "1 elements", "empty shards")),
    ("SBP values and text", "P(max) of a bool tensor",
     'sl.tensor(torch.ones(4, dtype=torch.bool), mesh1, sl.P("max"), name="w")', "LayoutError",
     ("w:", "P(max)", "bool")),
    ("SBP values and text", "P(min) of a complex tensor",
     'sl.tensor(torch.ones(4, dtype=torch.complex64), mesh1, sl.P("min"), name="w")', "LayoutError",
     ("w:", "P(min)", "complex64")),
    ("SBP values and text", "P(max) of a complex tensor, by boxing",
     'sl.tensor(torch.ones(4, dtype=torch.complex64), mesh1, "B", name="w").to_global(sbp="P(max)")',
     "LayoutError", ("P(max)", "complex64", "not ordered")),
    ("SBP values and text", "P of a bool tensor", 'sl.tensor(torch.ones(4, dtype=torch.bool), mesh1, "P", name="w")',
     "LayoutError", ("w:", "bool", "int dtype")),
    ("SBP values and text", "fmt_sbp of something that is not an SBP", "sl.fmt_sbp(3)", "InputTypeError",
     ("fmt_sbp", "3")),
    ("SBP values and text", "a balanced split into no parts", "sl.balanced_sizes(4, 0)", "InputError",
     ("4 elements", "parts >= 1")),
    ("SBP values and text", "assembling without every rank's shard", 'sl.assemble({0: a}, mesh1, "S(0)")',
     "InputError", ("one shard per rank", "[0, 1]", "[0]")),
    ("Placements", "an unknown device type", 'sl.Placement("tpu", [0, 1])', "InputError", ("tpu", "cuda")),
    ("Placements", "a ragged mesh", 'sl.Placement("cpu", [[0, 1], [2]])', "InputError", ("rectangular",)),
    ("Placements", "a rank twice", 'sl.Placement("cpu", [0, 1, 1])', "InputError", ("distinct", "[1]")),
    ("Placements", "ranks that are not ints", 'sl.Placement("cpu", ["a", "b"])', "InputTypeError", ("'a'",)),
    ("Global tensors from shards", "a list of ranks where a placement is expected",
     'sl.tensor(a, [0, 1], "S(0)", name="w")', "InputTypeError", ("w:", "sl.Placement", "list")),
    ("Global tensors from shards", "a value torch cannot make a tensor of", 'sl.tensor("abc", mesh1, "B", name="w")',
     "InputTypeError", ("w:", "torch.Tensor", "str")),
    ("Global tensors from shards", "one full tensor where shards are expected",
     'sl.from_local(a, mesh1, "S(0)", name="w")', "InputTypeError", ("w:", "local shards", "sl.tensor")),
    ("Global tensors from shards", "a nested list of shards for a 2-D mesh",
     'sl.from_local([[a, a], [a, a]], mesh2, "B, B", name="w")', "InputTypeError",
     ("w:", "shard 0", "list", "ranks [0, 1, 2, 3]")),
    ("Global tensors from shards", "too few shards", 'sl.from_local([a], mesh1, "B", name="w")', "InputError",
     ("w:", "1 shards", "2 ranks")),
    ("Global tensors from shards", "a shard for a rank outside the placement",
     'sl.from_local({0: a, 5: a}, mesh1, "B", name="w")', "InputError", ("w:", "no shard for [1]", "[5]")),
    ("Global tensors from shards", "B shards that differ between ranks",
     'sl.from_local([a, a + 1], mesh1, "B", name="w")', "InputError", ("w:", "equal copies", "rank 1")),
    ("Global tensors from shards", "shards of mixed dtypes",
     'sl.from_local([a, a.double()], mesh1, "S(0)", name="w")', "InputError",
     ("w:", "torch.float32", "torch.float64")),
    ("Global tensors from shards", "a shard of the wrong size for the balanced split",
     'sl.from_local([a[:1], a[:3]], mesh1, "S(0)", name="w")', "InputError",
     ("w:", "rank 0", "(1, 2)", "(2, 2)")),
    ("Ops on global tensors", "matmul with different inner dims", "x @ x", "OpError", ("matmul", "(4, 2)", "inner")),
    ("Ops on global tensors", "matmul of two dtypes",
     'x @ sl.tensor(torch.ones(2, 3, dtype=torch.float64), mesh1, "B", name="w")', "OpError",
     ("matmul", "torch.float64", "one dtype")),
    ("Ops on global tensors", "inputs on different placements",
     'x + sl.tensor(a, sl.Placement("cpu", [2, 3]), "S(0)", name="w")', "InputError",
     ("add", "different placements", "to_global")),
    ("Ops on global tensors", "a string as an operand", 'x + "1"', "InputTypeError", ("x:", "str")),
    ("Ops on global tensors", "a number no tensor holds", "x + 10**30", "InputError", ("x:", "does not fit")),
    ("Ops on global tensors", "more indices than dims", "x[:, :, 1:2]", "InputError", ("x:", "3 indices", "2-D")),
    ("Ops on global tensors", "a reshape to something that is not ints", 'x.reshape("a")', "InputTypeError",
     ("x:", "ints")),
    ("Ops on global tensors", "a reduction over a dim the tensor does not have", "x.sum(dim=(0, 5))", "OpError",
     ("sum", "dim=5", "(4, 2)")),
    ("Ops on global tensors", "a forced signature the op does not have",
     'sl.apply("relu", [x], signature="S(0) -> S(1)")', "SignatureError", ("relu", "S(0)", "Valid signatures")),
    ("Ops on global tensors", "a signature that is not text", 'sl.apply("relu", [x], signature=3)',
     "InputTypeError", ("signature", "int")),
    ("Ops on global tensors", "explain of something that is not a global tensor", "sl.explain(a)",
     "InputTypeError", ("explain", "Tensor")),
    ("Ops on global tensors", "a hardware model that is not one", "sl.set_default_hardware(3)", "InputTypeError",
     ("sl.Hardware", "int")),
    ("Ops on global tensors", "an op that does not exist", 'sl.apply("matmull", [x, x])', "UnknownOpError",
     ("matmull", "matmul")),
    ("Ops on global tensors", "an attr the op does not take", 'sl.apply("gather", [x, x], dimm=1)', "InputError",
     ("gather", "dimm", "attrs dim")),
    ("Ops on global tensors", "a forced signature on an op torch runs as several ATen ops",
     'sl.apply("linear", [x, x], signature="S(0), B -> S(0)")', "SignatureError", ("linear", "aten.t.default", "sbp=")),
    ("Boxing plans", "a shape that is not ints", 'sl.plan_boxing((4, "x"), "S(0)", "B", mesh1)',
     "InputTypeError", ("plan_boxing", "shape")),
    ("Boxing plans", "running a plan without every rank's shard",
     'sl.plan_boxing((4, 2), "S(0)", "B", mesh1).run({0: a[:2]})', "InputError", ("one shard per rank", "[0, 1]")),
    ("Presets", "tensor_parallel on a 2-D mesh", "sl.presets.tensor_parallel((2, 2))", "InputError",
     ("1-D mesh", "(2, 2)", "dp_tp")),
    ("Presets", "dp_tp on a rank count", "sl.presets.dp_tp(4)", "InputError", ("2-D mesh", "(2, 2)", "got 4")),
    ("Presets", "a mesh shape with a zero", "sl.presets.data_parallel((2, 0))", "InputError", ("(2, 0)",)),
    ("Presets", "ZeRO on a 2-D mesh", "sl.presets.zero((2, 2))", "InputError", ("1-D mesh", "(2, 2)")),
    ("Parallelism rules", "a mesh axis size of 0", "sl.mesh(dp=0)", "InputError", ("sl.mesh", ">= 1", "'dp': 0")),
    ("Parallelism rules", "a rule naming an axis the mesh lacks",
     'sl.compile(model, (inp,), loss_fn=model.loss_fn, target=target, '
     'strategy=sl.Strategy(sl.mesh(dp=2), [sl.TensorParallel("tp")]))', "InputError", ("'tp'", "['dp']")),
    ("Parallelism rules", "a strategy entry that is neither a hint nor a rule", 'sl.Strategy(sl.mesh(dp=2), ["dp"])',
     "InputTypeError", ("sl.DataParallel", "str")),
    ("Parallelism rules", "a ZeRO level other than 1, 2, 3", "sl.ZeRO(4)", "InputError", ("ZeRO level", "got 4")),
    ("Parallelism rules", "a pipeline schedule that does not exist", 'sl.Pipeline("pp", schedule="zigzag")',
     "InputError", ("gpipe", "1f1b", "interleaved_1f1b", "zigzag")),
    ("Parallelism rules", "several stages per rank without interleaving",
     'sl.Pipeline("pp", micro_batches=4, stages_per_rank=2)', "InputError",
     ("stages_per_rank=2", "interleaved_1f1b", "'1f1b'")),
    ("Parallelism rules", "interleaved 1F1B on a micro-batch count its rounds cannot split",
     'sl.compile(model, (inp,), loss_fn=model.loss_fn, target=target, strategy=sl.Strategy(sl.mesh(pp=2), '
     '[sl.Pipeline("pp", micro_batches=5, schedule="interleaved_1f1b")]))', "InputError",
     ("2 rounds", "multiple of 2", "got 5")),
    ("Parallelism rules", "tensor parallel that splits nothing",
     'sl.compile(model, (inp,), loss_fn=model.loss_fn, target=target, strategy=sl.Strategy(sl.mesh(tp=2), '
     '[sl.TensorParallel("tp", column=("head",), row=("*fc2",))]))', "TensorParallelError",
     ("split nothing", "head", "cross_entropy")),
    ("Compiling", "something that is not a module", "sl.compile(3, (inp,))", "InputTypeError",
     ("torch.nn.Module", "int")),
    ("Optimizers", "a nan learning rate", 'sl.SGD(lr=float("nan"))', "InputError", ("SGD", "lr", "finite", "nan")),
    ("Optimizers", "an infinite learning rate", 'sl.Adam(lr=float("inf"))', "InputError", ("Adam", "lr", "inf")),
    ("Optimizers", "an infinite momentum", 'sl.SGD(lr=0.1, momentum=float("inf"))', "InputError",
     ("momentum", "finite", "inf")),
    ("Optimizers", "a nan beta", 'sl.Adam(betas=(0.9, float("nan")))', "InputError", ("betas[1]", "nan")),
    ("Optimizers", "a nan eps", 'sl.Adam(eps=float("nan"))', "InputError", ("eps", "nan")),
    ("Optimizers", "a learning rate that is text", 'sl.SGD(lr="0.1")', "InputTypeError", ("lr", "number", "'0.1'")),
    ("Optimizers", "a negative learning rate", "sl.SGD(lr=-0.1)", "InputError", ("lr > 0", "-0.1")),
    ("Clusters", "no workers", "sl.LocalCluster(0)", "InputError", ("at least one", "n=0")),
    ("Clusters", "more workers than one machine spawns", "sl.LocalCluster(10000)", "InputError",
     ("10000", "launch='external'")),
    ("Clusters", "a rank count that is not an int", 'sl.LocalCluster("2")', "InputTypeError", ("'2'", "int")),
    ("Clusters", "a non-loopback address without a token", 'sl.LocalCluster(2, host="0.0.0.0")', "InputError",
     ("0.0.0.0", "token=")),
    ("Clusters", "a token that is not a str", "sl.LocalCluster(2, token=1234)", "InputTypeError", ("token", "int")),
    ("Clusters", "a guessable token on a non-loopback address", 'sl.LocalCluster(2, host="0.0.0.0", token="a")',
     "InputError", ("too weak", "0.0.0.0", "128", "secrets.token_urlsafe(32)")),
    ("Clusters", "a short token on a non-loopback address",
     'sl.LocalCluster(2, launch="external", host="0.0.0.0", token="correct-horse")', "InputError",
     ("too weak", "about 76 bits", "at least 128")),
    ("Clusters", "a port another program listens on", 'sl.LocalCluster(1, launch="external", port=cluster.address[1])',
     "ClusterError", ("cannot listen", "'127.0.0.1'", "port", "in use", "port=0")),
    ("Clusters", "a host name that does not resolve",
     'sl.LocalCluster(1, launch="external", host="no-such-host.invalid", token=secrets.token_urlsafe(32))',
     "ClusterError", ("cannot listen", "'no-such-host.invalid'", "does not resolve")),
    ("Clusters", "an address of another machine", 'sl.LocalCluster(1, launch="external", host="192.0.2.1", '
     'token=secrets.token_urlsafe(32))', "ClusterError", ("cannot listen", "'192.0.2.1'", "no such address")),
    ("Clusters", "a worker with a mistyped token",
     'c = sl.LocalCluster(2, launch="external"); mistyped_worker(c, 0); c.wait_ready(timeout=1)', "RunError",
     ("only 0 of 2 workers joined", "worker rank 0 presented a wrong token", "1 connection failed to authenticate")),
    ("Running a compiled step", "timeout=0", "cluster.run(step, batch, timeout=0)", "InputError",
     ("timeout", "> 0", "got 0")),
    ("Running a compiled step", "timeout=-1", "cluster.run(step, batch, timeout=-1)", "InputError",
     ("timeout", "got -1")),
    ("Running a compiled step", "steps=-1", "cluster.run(step, batch, steps=-1)", "InputError",
     ("steps", ">= 1", "got -1")),
    ("Running a compiled step", "a batch of the wrong size", "cluster.run(step, (inp[:2], target[:2]))",
     "GraphError", ("'x'", "a batch of 2", "compiled for 4")),
    ("Running a compiled step", "an input of the wrong shape", "cluster.run(step, (inp[:, :3], target))",
     "GraphError", ("'x'", "(4, 3)", "(4, 4)")),
    ("Running a compiled step", "an input of the wrong dtype", "cluster.run(step, (inp, target.float()))",
     "GraphError", ("'target'", "torch.float32", "torch.int64")),
    ("Running a compiled step", "a class index the model does not have", "cluster.run(step, (inp, target + 3))",
     "GraphError", ("'target'", "holds", "valid values are 0..2")),
    ("Running a compiled step", "too few inputs", "cluster.run(step, (inp,))", "GraphError",
     ("1 input(s)", "takes 2")),
    ("Running a compiled step", "an input under the wrong name", 'cluster.run(step, {"x": inp, "targets": target})',
     "GraphError", ("'targets'", "did you mean 'target'")),
    ("Running a compiled step", "something that is not a step", "cluster.run(step.graph, batch)", "InputTypeError",
     ("ActorPlan or a compiled step", "Graph")),
    ("Running a compiled step", "a closed cluster", "closed.run(step, batch)", "ClusterError", ("closed",)),
    ("Running a compiled step", "a 4-rank step on a 2-rank cluster", "cluster.run(step4, batch)", "InputError",
     ("uses 4 ranks", "the cluster has 2", "LocalCluster(4)")),
    ("Running a compiled step", "restart that is not a bool", 'cluster.run(step, batch, restart="yes")',
     "InputTypeError", ("restart", "'yes'")),
    ("Running a compiled step", "load_into of something that is not a module", "sl.runtime.RunResult().load_into(3)",
     "InputTypeError", ("load_into", "torch.nn.Module", "int")),
    ("Running a compiled step", "load_into of a run without parameters", "sl.runtime.RunResult().load_into(model)",
     "InputError", ("no parameters", "params=False")),
    ("Running a compiled step", "checkpoint_every that is not an int >= 1",
     "cluster.run(step, batch, steps=4, checkpoint_every=0)", "InputError", ("checkpoint_every", "int >= 1", "0")),
    ("Running a compiled step", "checkpoint_every for an ActorPlan",
     "cluster.run(step.plan(world_size=2), step.feeds(batch), steps=4, checkpoint_every=2)", "InputError",
     ("checkpoint_every", "compiled step")),
    ("Running a compiled step", "saving an ActorPlan's state", 'cluster.save(step.plan(world_size=2), "ckpt")',
     "InputTypeError", ("save needs a compiled step", "ActorPlan")),
    ("Running a compiled step", "a checkpoint path that is not a path", "cluster.save(step, 3)", "InputTypeError",
     ("checkpoint path", "3")),
    ("Running a compiled step", "a checkpoint path that is a file", 'cluster.load(step, "/dev/null")', "InputError",
     ("'/dev/null' is a file", "folder")),
    ("Running a compiled step", "loading from a folder without a checkpoint", 'cluster.load(step, "/")', "InputError",
     ("no checkpoint at '/'", ".metadata")),
    ("Compiling", "a torch.optim optimizer",
     "sl.compile(model, (inp,), loss_fn=model.loss_fn, target=target, "
     "optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))",
     "InputTypeError", ("torch.optim", "sl.SGD(lr=0.1, momentum=0.9)")),
    ("Compiling", "a pipeline with more stages than the model has ops",
     "sl.compile(model, (inp,), loss_fn=model.loss_fn, target=target, strategy=sl.presets.pipeline(8, 2))",
     "InputError", ("8 stages", "forward has 7 ops", "at most 7 stages")),
    ("Compiling", "a stage_of name that is no module",
     'sl.compile(model, (inp,), loss_fn=model.loss_fn, target=target, '
     'strategy=sl.presets.pipeline(2, 2, stage_of={"block.0": 1}))',
     "InputError", ("stage_of names 'block.0'", "no module", "blocks")),
    ("Compiling", "an optimizer's name", 'sl.compile(model, (inp,), loss_fn=model.loss_fn, target=target, optimizer="sgd")',
     "InputTypeError", ("'sgd'", "sl.SGD(lr=")),
    ("Compiling", "fp16 compute (no loss scaling)",
     'sl.compile(model, (inp,), loss_fn=model.loss_fn, target=target, '
     'strategy=sl.Strategy(sl.Placement("cpu", [0]), precision=sl.Precision.mixed("fp16")))',
     "InputError", ("fp16", "loss scaling", "bf16")),
    ("Compiling", "mixed precision with capture='fx'",
     'sl.compile(model, (inp,), loss_fn=model.loss_fn, target=target, capture="fx", '
     'strategy=sl.Strategy(sl.Placement("cpu", [0]), precision=sl.Precision.mixed()))',
     "GraphError", ("capture='fx'", "autocast", "capture='aten'")),
    ("Searching", "more devices than a search plans for", "sl.search(model, (inp,), loss_fn=model.loss_fn, "
     "target=target, devices=10**6, time_budget=30)", "SearchError", ("devices=1000000", "131072", "replicate")),
    ("Searching", "a candidate on more ranks than the search", "sl.search(model, (inp,), loss_fn=model.loss_fn, "
     "target=target, devices=2, candidates=[sl.presets.data_parallel(4)])", "SearchError",
     ("candidates[0]", "4 ranks", "devices=2")),
]

# errors that only a cluster used from two threads shows: their messages are constants of the runtime, and
# tests/faults/test_one_run_at_a_time.py makes each happen and checks it equals the constant
THREAD_CASES: list[tuple[str, str, str, str]] = [
    ("a second run while one is going", "cluster.run(step, batch)  # from another thread, or from on_step",
     "ClusterError", "BUSY_MESSAGE"),
    ("close() while a run is going", "cluster.close()  # from another thread", "ClusterError",
     "CLOSED_DURING_RUN_MESSAGE"),
]

_SANITIZE = [
    (re.compile(r"\('(127\.0\.0\.1|::1|localhost)', \d+\)"), "(HOST, PORT)"),
    (re.compile(r"\b(127\.0\.0\.1|localhost):\d+\b"), "HOST:PORT"),
    (re.compile(r"\bpid \d+"), "pid N"),
    (re.compile(r"\bport \d{4,5}\b"), "port PORT"),
    (re.compile(r"0x[0-9a-f]{6,}"), "0x..."),
]


def sanitize(message: str) -> str:
    """The message with what changes from run to run (ports, pids, object addresses) replaced."""
    for pattern, repl in _SANITIZE:
        message = pattern.sub(repl, message)
    return message


@pytest.fixture(scope="module")
def setup_ns():
    ns: dict = {"sl": sl, "torch": torch}
    exec(SETUP, ns)
    yield ns
    ns["cluster"].close()


def run_case(code: str, ns: dict) -> BaseException | None:
    try:
        exec(code, dict(ns))
    except BaseException as e:  # noqa: BLE001 - the case's outcome, checked by the caller
        return e
    return None


@pytest.mark.parametrize("section, what, code, cls, words", CASES, ids=[c[2][:60] for c in CASES])
def test_each_bad_input_gets_a_clear_sbplab_error(setup_ns, section, what, code, cls, words):
    err = run_case(code, setup_ns)
    assert err is not None, f"{code} ({what}) raised nothing"
    assert isinstance(err, sl.SbplabError), f"{code} raised {type(err).__name__}: {err}"
    assert type(err).__name__ == cls, f"{code} raised {type(err).__name__}, expected {cls}: {err}"
    msg = str(err)
    for w in words:
        assert w in msg, f"{w!r} not in the message of {code}: {msg}"


def _check_refusal(err: BaseException | None, code: str, cls: str, words: tuple[str, ...]) -> None:
    assert err is not None, f"{code} raised nothing"
    assert isinstance(err, sl.SbplabError), f"{code} raised {type(err).__name__}: {err}"
    assert type(err).__name__ == cls, f"{code} raised {type(err).__name__}, expected {cls}: {err}"
    for w in words:
        assert w in str(err), f"{w!r} not in the message of {code}: {err}"


def test_as_optimizer_refuses_torch_optimizers_and_names_naming_the_sbplab_one():
    from sbplab.compiler.training.optim import as_optimizer

    lin = torch.nn.Linear(2, 2)
    refused = [
        (torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9), ("torch.optim", "sl.SGD(lr=0.1, momentum=0.9)")),
        (torch.optim.Adam(lin.parameters(), lr=3e-4), ("torch.optim", "sl.Adam(lr=0.0003)")),
        (torch.optim.AdamW(lin.parameters(), lr=1e-3, weight_decay=0.1), ("sl.AdamW(lr=0.001, weight_decay=0.1)",)),
        (torch.optim.RMSprop(lin.parameters()), ("RMSprop", "sl.SGD(lr=...) or sl.Adam(lr=...)")),
        (torch.optim.SGD, ("torch.optim.SGD", "class", "sl.SGD(lr=...)")),
        ("sgd", ("'sgd'", "sl.SGD(lr=0.01)")),
        ("Adam", ("'Adam'", "sl.Adam(lr=0.001)")),
        ("rmsprop", ("'rmsprop'", "sl.SGD(lr=...), sl.Adam(lr=...)")),
        (0.1, ("sbplab optimizer", "float")),
    ]
    for bad, words in refused:
        try:
            as_optimizer(bad)
        except BaseException as e:  # noqa: BLE001 - checked below
            _check_refusal(e, repr(bad), "InputTypeError", words)
        else:
            raise AssertionError(f"as_optimizer({bad!r}) accepted it")
    sgd = sl.SGD(lr=0.1)
    assert as_optimizer(sgd) is sgd and as_optimizer(None) == sl.SGD()


def _builtin_base(cls: type) -> str:
    for base in cls.__mro__[1:]:
        if base.__module__ == "builtins" and base not in (Exception, BaseException, object):
            return base.__name__
    return ""


def render(ns: dict) -> str:
    """docs/errors.md: every case's code, error class (and its builtin base) and message."""
    out = [
        "# Bad input and what sbplab says",
        "",
        "Generated by `tests/test_bad_inputs.py` from its table of cases; the test fails when this file and the",
        "messages disagree, and `SBPLAB_WRITE_DOCS=1 pytest tests/test_bad_inputs.py` rewrites it.",
        "",
        "Every error sbplab raises on purpose is an `sl.SbplabError` (`except sl.SbplabError` catches them all;",
        "anything else escaping the public API is a bug). Each class also keeps its builtin base, shown in",
        "parentheses, so `except ValueError` still works. The snippets run after this set-up:",
        "",
        "```python",
        "import torch, sbplab as sl",
        *SETUP.rstrip().splitlines(),
        "```",
        "",
        "Ports and process ids in messages are shown as `PORT` and `N`.",
    ]
    section = None
    for sec, what, code, _cls, _words in CASES:
        if sec != section:
            section = sec
            out += ["", f"## {sec}", "", "| bad input | code | error | message |", "|---|---|---|---|"]
        err = run_case(code, ns)
        if err is None:
            kind, msg = "(no error)", ""
        else:
            base = _builtin_base(type(err))
            kind = f"`{type(err).__name__}`" + (f" ({base})" if base else "")
            msg = sanitize(str(err))
        cell = msg.replace("|", "\\|").replace("\n", "<br>")
        out.append(f"| {what} | `{code}` | {kind} | {cell} |")
    from sbplab.runtime import driver

    out += ["", "## One cluster, two threads", "", "| situation | code | error | message |", "|---|---|---|---|"]
    for what, code, cls, const in THREAD_CASES:
        base = _builtin_base(getattr(sl, cls))
        out.append(f"| {what} | `{code}` | `{cls}` ({base}) | {getattr(driver, const)} |")
    return "\n".join(out) + "\n"


def test_the_catalogue_is_up_to_date(setup_ns):
    text = render(setup_ns)
    check_generated_doc(DOC, text, "SBPLAB_WRITE_DOCS=1 pytest tests/test_bad_inputs.py")


def test_the_printed_form_of_an_sbp_parses_back():
    """``fmt_sbp`` prints ``(S(0), B)``; that text (and the one-entry ``(S(0))``) must parse to the same SBP."""
    assert sl.parse_sbp("(S(0), B)") == (sl.S(0), sl.B)
    assert sl.parse_sbp(sl.fmt_sbp((sl.S(0), sl.P("max")))) == (sl.S(0), sl.P("max"))
    assert sl.parse_sbp("(S(0))") == (sl.S(0),) and sl.parse_sbp("[B, S(1)]") == (sl.B, sl.S(1))
    with pytest.raises(sl.SbplabError, match=r"cannot parse SBP '\(\(S\(0\), B\)\)'"):
        sl.parse_sbp("((S(0), B))")


def test_sanitize_hides_ports_and_pids():
    assert sanitize("driver at ('127.0.0.1', 40123), worker pid 777, at 127.0.0.1:5000") == \
        "driver at (HOST, PORT), worker pid N, at HOST:PORT"


# --- the same refusals on live workers -------------------------------------------------------------


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def live():
    """One two-rank cluster for the module, on IPv6 loopback where the machine has it (no token given)."""
    host = "::1" if _ipv6_loopback() else "127.0.0.1"
    with sl.LocalCluster(2, host=host) as c:
        yield c


@pytest.fixture(scope="module")
def small_step():
    torch.manual_seed(0)
    model = sl.models.MLP(sl.models.MLPConfig(in_dim=4, width=4, hidden=8, n_blocks=1, n_classes=3))
    (inp,), target = model.example_batch(4)
    opt = sl.SGD(lr=0.1)
    step = sl.compile(model, (inp,), loss_fn=model.loss_fn, target=target, optimizer=opt,
                      strategy=sl.presets.data_parallel(2))
    return step, model, inp, target, opt


@pytest.mark.multiprocess
def test_a_live_cluster_refuses_bad_runs_and_stays_usable(live, small_step):
    step, model, inp, target, opt = small_step
    pids = live.pids
    bad = [
        (dict(inputs=(inp, target), timeout=0), "timeout must be > 0"),
        (dict(inputs=(inp, target), timeout=-1), "timeout must be > 0"),
        (dict(inputs=(inp, target), steps=-1), "steps must be >= 1"),
        (dict(inputs=(inp[:2], target[:2])), "a batch of 2 where the step was compiled for 4"),
        (dict(inputs=(inp[:, :3], target)), r"input 'x' has shape \(4, 3\)"),
        (dict(inputs=(inp.double(), target)), "input 'x' has dtype torch.float64"),
        (dict(inputs=(inp,)), r"1 input\(s\) given, but the compiled step takes 2"),
        (dict(inputs={"x": inp, "targets": target}), "unknown input 'targets'"),
    ]
    for kwargs, match in bad:
        with pytest.raises(sl.SbplabError, match=match):
            live.run(step, **kwargs, progress=False)
    assert live.alive and live.pids == pids  # refused before the workers were asked anything
    result = live.run(step, (inp, target), steps=2, progress=False)
    want, _ = torch_steps(model, (inp,), target=target, loss_fn=model.loss_fn, optimizer=opt, steps=2)
    assert result.losses == pytest.approx(want, rel=1e-4, abs=1e-5)


@pytest.mark.multiprocess
def test_ipv6_loopback_needs_no_token(live):
    if not _ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback")
    assert live.address[0] == "::1" and live.alive
    assert isinstance(live.token, str) and len(live.token) >= 32  # a random one, made for this cluster
    with pytest.raises(sl.SbplabError, match="not loopback.*needs a shared token"):
        sl.LocalCluster(2, host="::")


@pytest.mark.multiprocess
def test_inputs_that_require_grad_are_data_to_the_workers(live, small_step):
    """A batch made with requires_grad=True (or a view of one) trains like a plain one, without a respawn:
    the workers' kernels write into preallocated outputs, which autograd would refuse."""
    step, model, inp, target, opt = small_step
    live.run(step, (inp, target), steps=1, progress=False)  # workers up before the pids are taken
    pids = live.pids
    x = inp.clone().requires_grad_(True)
    result = live.run(step, (x * 1.0, target), steps=2, progress=False, restart=True)
    want, _ = torch_steps(model, (inp,), target=target, loss_fn=model.loss_fn, optimizer=opt, steps=2)
    assert result.losses == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert live.alive and live.pids == pids and x.grad is None


class _DataDependent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        if x.sum() > 0:  # the value of a tensor decides: no graph can hold both branches
            return self.lin(x)
        return self.lin(-x)


def test_data_dependent_control_flow_is_named_with_its_source_line(small_step):
    _, model, inp, target, _ = small_step
    with pytest.raises(sl.CaptureError) as e:
        sl.compile(_DataDependent(), (inp,), loss_fn=model.loss_fn, target=target,
                   strategy=sl.presets.data_parallel(2))
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "if x.sum() > 0:" in text)
    assert f"test_bad_inputs.py:{line}" in str(e.value) and "if x.sum() > 0" in str(e.value)
    assert "torch.where" in str(e.value) and "torch.cond" in str(e.value)
