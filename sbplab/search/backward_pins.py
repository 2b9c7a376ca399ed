"""The backward ops a searched candidate implies, as signatures for deduction to take.

The cost model prices backward ops on layouts that mirror the forward choices (``cost.py``): a
backward op reads each forward tensor as its forward op read or wrote it, and the gradient of a forward
output in ``mirror`` of that output's layout; the gradient it gives a forward input is ``dual`` of the
input's read. Left to itself, deduction re-decides every backward op greedily and can leave that plan
(gather activations to skip a reduction, keep a gradient partial and reduce it later), and then the
compiled step is not the step the search priced. So each backward op of a forward op's gradient
(torch's autograd, ATen ops) is pinned to its first signature that matches those layouts; an op with
no such signature (or one the gradient's intermediate tensors leave open, like the sums that add a
tensor's gradient parts) is left to deduction. Layouts pass along a chain of backward ops (an ATen
capture's ``view -> mm -> view`` of one autograd formula): an op whose every input is known is
pinned, and its outputs become known; an op reading a tensor nobody pinned is left to deduction.

What the model does not see: a linear backward op could pass a partial sum on (``P`` in, ``P`` out)
and reduce it once, later (into ZeRO's shards, say), where the model reduces it where it arrives; the
pins follow the model, so the search compiles to what it priced, and the re-rank's presets (deduced
freely) stand beside it.
"""

from __future__ import annotations

from ..compiler.deduction.signature_hints import signatures_of
from ..compiler.ir import Graph
from ..ops.registry import NdSignature
from ..sbp import NdSbp
from .cost import dual, mirror

ATEN = "aten."  # an op of an ATen capture


def backward_signatures(graph: Graph, forward: dict[str, NdSignature]) -> dict[str, NdSignature]:
    """backward op name -> signature, for the backward ops of the forward ops in ``forward`` (a signature
    per forward op, on ``graph`` with placements assigned).

    Backward ops are visited in graph order (topological). An op's wanted input layouts are those of
    the forward tensors it reads (as its forward op read or wrote them), the total gradients of forward
    outputs (``mirror``), and the outputs of backward ops pinned before it: a chain of ops one gradient
    rule or one autograd formula emitted (an ATen capture's ``view -> mm -> view``) passes its layouts on
    from op to op. An op with an input none of these know is left to deduction (and so is what it
    writes): pinning it to the first signature that fits the known inputs would pick an arbitrary layout
    (often all-``B``) for the unknown one."""
    read_as: dict[str, NdSbp] = {}  # the total gradient of a forward output: read by the producer's rule
    for name, sig in forward.items():
        for j, o in enumerate(graph.op_by_name[name].outputs):
            if o in graph.tensor_grads:
                read_as[graph.tensor_grads[o]] = mirror(sig.outputs[j])
    haves: dict[str, tuple[dict, dict]] = {}
    passed: dict[str, NdSbp] = {}  # outputs of the backward ops pinned so far
    out: dict[str, NdSignature] = {}
    for op in graph.ops_in("backward"):
        name = op.forward_op
        if name not in forward or op.type == "add":
            continue
        if name not in haves:
            f, sig = graph.op_by_name[name], forward[name]
            have = {t: sig.outputs[j] for j, t in enumerate(f.outputs)}
            have.update({t: sig.inputs[k] for k, t in reversed(list(enumerate(f.inputs)))})
            gives = {g: dual(sig, k) for k, g in enumerate(graph.input_grads.get(name, ())) if g is not None}
            haves[name] = (have, gives)
        have, gives = haves[name]
        want_in = [have.get(t, read_as.get(t, passed.get(t))) for t in op.inputs]
        if any(w is None for w in want_in) and op.type.startswith(ATEN):
            want_in = [w if w is not None else _mirrored(graph, name, forward[name], t) for w, t in zip(want_in, op.inputs)]
        if any(w is None for w in want_in):
            continue
        want_out = [gives.get(t) for t in op.outputs]
        pick = _first(signatures_of(graph, op), want_in, want_out)
        if pick is not None:
            out[op.name] = pick
            for t, sbp in zip(op.outputs, pick.outputs):
                passed.setdefault(t, sbp)
    return out


def _mirrored(graph: Graph, name: str, sig: NdSignature, t: str) -> NdSbp | None:
    """A gradient an autograd formula made in the middle of forward op ``name``'s backward (an ATen
    capture records no total gradient per activation): mirrored from the one forward tensor of that op
    with its shape (outputs first), as the cost model mirrors gradients; None if no tensor, or tensors of
    different layouts, have that shape. Without it such a gradient was left to deduction, which sliced
    replicated axes for free (``B -> S(0)``) and then had to reduce every parameter's gradient there."""
    f = graph.op_by_name[name]
    shape = graph.tensors[t].meta.shape
    outs = {mirror(sig.outputs[j]) for j, o in enumerate(f.outputs) if graph.tensors[o].meta.shape == shape}
    if outs:
        return outs.pop() if len(outs) == 1 else None
    ins = {mirror(sig.inputs[k]) for k, i in enumerate(f.inputs) if graph.tensors[i].meta.shape == shape}
    return ins.pop() if len(ins) == 1 else None


def _first(cands: list[NdSignature], want_in: list, want_out: list) -> NdSignature | None:
    """The first signature with every wanted input layout and every wanted output layout; failing that,
    the first with the wanted inputs alone. None when nothing is wanted (an op that reads and writes only
    the rule's intermediate tensors: any signature would do, so deduction picks one)."""
    if all(w is None for w in (*want_in, *want_out)):
        return None

    def fits(got: tuple, want: list) -> bool:
        return all(w is None or g == w for g, w in zip(got, want))
    ins = [c for c in cands if fits(c.inputs, want_in)]
    both = [c for c in ins if fits(c.outputs, want_out)]
    return (both or ins or [None])[0]
