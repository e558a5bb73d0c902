"""Add the variant library's choices to a lowered Problem.

For every backward op that a family matches, the Problem gets a `solvers.Variant`: an encode op
placed right after the producer of the argument it replaces (so the argument need not outlive
its forward uses for it), the encoded tensor, and the rewiring. Op ids are renumbered to keep
the forward ops first and in order; tensor ids do not change (encoded tensors are appended).
Times and workspaces start at zero; `with_costs` fills them from the profiler.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch.fx as fx

from monet_opt import recompute, variants
from monet_opt.lower import Lowered, storage_bytes
from solvers import Op, Problem, Tensor, Variant


@dataclass(frozen=True)
class VariantSite:
    """Where variant v of the problem applies: family, the backward FX node, which argument,
    the encode op's id (None if the family keeps nothing), the constants encode takes, and the
    forward node read in the argument's place (families with `reads`)."""

    family: str
    backward_node: str
    arg: int
    encode_op: int | None
    params: tuple
    like: tuple  # (shape, dtype, device) of the replaced argument
    reads: str | None = None


def attach_variants(lowered: Lowered, joint: fx.GraphModule,
                    skip: frozenset | set = frozenset(), allow_lossy: bool = False,
                    only: frozenset[str] | None = None) -> Lowered:
    """`lowered` with every match of the library (except (family, node name) pairs in
    `skip`, and families not in `only` if given) as a variant of its problem; lossy families
    only with `allow_lossy`.

    NOTE [What a variant may replace]
      A family replaces one argument of its op, and the Problem's variant replaces that
      argument's storage (through views). It matches only where the argument is a forward
      tensor and the op reads that storage through no other argument: otherwise the op would
      still need the storage (another implementation of the op, which reads the argument
      itself, may match anywhere). Two families replacing different arguments of one op
      (max-pool's input and indices) are different solver groups and combine (variants.py
      NOTE [Combining variants]); families replacing the same argument exclude each other."""
    p = lowered.problem
    nodes = {n.name: n for n in joint.graph.nodes}
    tensor_of = {name: t for t, name in enumerate(lowered.tensor_nodes) if name is not None}
    fwd = set(p.forward_tensors)
    found = []  # (family, backward op id, its node, replaced tensor, tensor read instead)
    for b in p.backward_ops:
        node = nodes[lowered.op_nodes[b]]
        args, _ = recompute.effective_args(node)
        for fam in variants.families_for(node, allow_lossy):
            if (fam.name, node.name) in skip or (only is not None and fam.name not in only):
                continue
            arg = args[fam.arg] if fam.arg < len(args) else None
            t = _storage(arg, lowered, tensor_of, nodes)
            reads = [a for a in recompute.tensor_args(node)
                     if _storage(a, lowered, tensor_of, nodes) == t]
            instead = None if fam.reads is None else \
                _storage(fam.reads(node), lowered, tensor_of, nodes)
            if t is None or t not in fwd or (len(reads) != 1 and instead != t) or \
                    (fam.reads is not None and instead not in fwd):
                continue
            found.append((fam, b, node, t, instead))
    if not found:
        return lowered
    # the new op order: each encode op right after the producer of what it encodes
    after: dict[int, list[int]] = {}
    for k, (fam, _, _, t, _) in enumerate(found):
        if fam.encode is not None:
            after.setdefault(p.tensors[t].producer, []).append(k)
    order: list[tuple[str, int]] = []
    for i in p.forward_ops:
        order.append(("op", i))
        order += [("enc", k) for k in after.get(i, [])]
    order += [("op", b) for b in p.backward_ops]
    new_id = {i: n for n, (kind, i) in enumerate(order) if kind == "op"}
    enc_id = {k: n for n, (kind, k) in enumerate(order) if kind == "enc"}
    tensors = [dataclasses.replace(t, producer=new_id.get(t.producer, t.producer))
               for t in p.tensors]
    tensor_nodes = list(lowered.tensor_nodes)
    ops: list[Op] = []
    op_nodes: list[str] = []
    labels: list[str] = []
    sites: list[VariantSite] = []
    problem_variants: list[Variant] = []
    encoded: dict[tuple, int] = {}
    for n, (kind, i) in enumerate(order):
        if kind == "op":
            ops.append(p.ops[i])
            op_nodes.append(lowered.op_nodes[i])
            labels.append(lowered.op_labels[i] if lowered.op_labels else "")
            continue
        fam, _, node, t, _ = found[i]
        name = f"{fam.name}:{node.name}"
        out = len(tensors)
        # a replaying family's state is in its producer's slot, fixed memory, whatever reads
        # it and whenever (NOTE [A replay's state] in monet_opt/recompute.py)
        replay = fam.draw is not None
        tensors.append(Tensor(name, 0 if replay else _encoded_bytes(fam, node, encoded), n))
        tensor_nodes.append(name)
        ops.append(Op(name, False, 0.0, () if replay else (t,), (out,)))
        op_nodes.append(name)
        labels.append(f"{fam.name} encode for {node.name}")
    for k, (fam, b, node, t, instead) in enumerate(found):
        enc = enc_id.get(k)
        like = _like(node.args[fam.arg])
        sites.append(VariantSite(fam.name, node.name, fam.arg, enc, fam.params(node), like,
                                 None if instead is None else fam.reads(node).name))
        reads = ops[enc].outputs if enc is not None else () if instead is None else (instead,)
        problem_variants.append(Variant(
            f"{fam.name}:{node.name}", new_id[b], t, reads=reads,
            encode_ops=(enc,) if enc is not None else (), replays=fam.draw is not None))
    problem = Problem(tuple(ops), tuple(tensors), p.fixed_bytes, p.forward_outputs,
                      p.backward_outputs, tuple(problem_variants), name=p.name)
    return dataclasses.replace(lowered, problem=problem, op_nodes=tuple(op_nodes),
                               tensor_nodes=tuple(tensor_nodes), op_labels=tuple(labels),
                               variant_sites=tuple(sites))


def _storage(arg, lowered: Lowered, tensor_of: dict[str, int], nodes) -> int | None:
    """The tensor whose storage `arg` reads (through views)."""
    while isinstance(arg, fx.Node):
        if arg.name in tensor_of:
            return tensor_of[arg.name]
        if arg.name not in lowered.view_nodes or not arg.args:
            return None
        arg = arg.args[0]
    return None


def _like(arg: fx.Node) -> tuple:
    val = arg.meta["val"]
    return (tuple(val.shape), val.dtype, val.device)


def _encoded_bytes(fam: variants.Family, node: fx.Node, seen: dict[tuple, int]) -> int:
    """Bytes of the encoded form, once per signature in `seen` (a transformer's layers repeat
    the same few: on GPT-2 a twelfth of the encodings on fake tensors)."""
    val = node.args[fam.arg].meta["val"]
    params = fam.params(node)
    key = (fam.name, tuple(val.shape), tuple(val.stride()), val.dtype, val.device, params)
    if key not in seen:
        with val.fake_mode:
            seen[key] = storage_bytes(fam.encode(val, *params))
    return seen[key]


# NOTE [Lossy encodings priced no faster]
#   A lossy variant that keeps an encoded form (a bfloat16 copy of a convolution's or matrix
#   product's input) has its op read the copy made float32 again: it does the op's work and
#   more, so a run measured faster is timing noise. Priced so, store-all with bfloat16 storage
#   (allow_lossy) was "faster" by 0.2 % where store-all fitted: a lossy plan holding more than
#   store-all's peak, at a limit that needed neither (found 2026-12-02). Such a variant's op
#   now costs at least its own time: it is chosen for memory only. Exact encodings keep what
#   they measured (a ReLU's bool mask read in place of its float output is less to read: it
#   may well be faster), as do other implementations of an op.
# NOTE [A variant's workspace beyond its op's]
#   A chosen variant's op runs with its own workspace plus the variant's extra (Problem
#   .with_variants). The probe counts the variant's whole run, so the op's own workspace is taken
#   off. Once CPU kernels' scratch was counted (NOTE [Allocation events]) it was counted twice:
#   small_cnn's conv.input_bf16 at a 3x3 convolution's backward 137952 B, its decoded float32
#   input (32 KiB) plus the 105184 B of scratch the op has anyway; a BatchNorm backward's
#   64 KiB, which its variant's run has too, made a plan predict 64 KiB over its step
#   (tests/test_grad_in_place.py). Where the variant's run needs less than its op, the extra is
#   negative (NOTE [A variant's workspace below its op's] in solvers/variant_checks.py): on the
#   CPU, conv.other_backend (oneDNN off) ran resnet18_small's (64x64) 512-channel convolution
#   backwards in 147,456 B of scratch where the op took 9,437,184 B (a weight gradient's worth),
#   and mobilenet_v2_small's in 62,976-789,888 B against 98,304-983,040 B. Floored at 0, as it
#   was, such a variant (no faster) was not even offered (NOTE [Variants that cannot pay]), and
#   chosen anyway its plan predicted the op's scratch: a 256-channel 3x3 convolution on 8x8
#   images predicted 7,561,256 B where its step measured 6,380,584 B. Now its least peak is
#   6,380,584 B, measured so (tests/test_variant_workspace_step.py). (A replayed dropout mask's
#   run, 1,310,732 B on DropoutChain, needs more than its op's 1,048,588 B: its extra is
#   positive.) An op whose variants replace more than one of its inputs runs them together,
#   never measured so: what one saves, another may save too, so there a negative extra stays
#   0 (summed, the savings could predict under the step).
def with_costs(lowered: Lowered, costs) -> Lowered:
    """Fill measured costs in: costs[v] = (encode time, encode workspace, run time minus the
    op's own time, run workspace)."""
    p = lowered.problem
    ops = list(p.ops)
    out = []
    groups: dict[int, set[int]] = {}
    for var in p.variants:
        groups.setdefault(var.op, set()).add(var.replaces)
    for v, (var, site) in enumerate(zip(p.variants, lowered.variant_sites)):
        enc_s, enc_ws, extra_s, run_ws = costs[v]
        if site.encode_op is not None:
            ops[site.encode_op] = dataclasses.replace(ops[site.encode_op], time_s=enc_s,
                                                      workspace_bytes=enc_ws)
        # an op writing into a dying input (NOTE [BatchNorm's gradient in place]) does not
        # when a variant runs in its place, unless the variant writes there too (NOTE [A
        # ReLU's mask and its gradient in place]): else that makes its output anew
        anew = 0 if variants.writes_into((site.family,)) else p.ops[var.op].inplace_bytes
        if site.encode_op is not None and not variants.family(site.family).exact:
            extra_s = max(0.0, extra_s)  # NOTE [Lossy encodings priced no faster]
        # NOTE [A variant's workspace beyond its op's]: of either sign, but not below 0 where
        # the op's variants replace several of its inputs
        extra_ws = run_ws - ops[var.op].workspace_bytes
        if len(groups[var.op]) > 1:
            extra_ws = max(0, extra_ws)
        out.append(dataclasses.replace(var, extra_time_s=extra_s,
                                       extra_workspace_bytes=extra_ws + anew))
    problem = dataclasses.replace(p, ops=tuple(ops), variants=tuple(out))
    return dataclasses.replace(lowered, problem=problem)


def matching(lowered: Lowered, problem: Problem) -> Lowered:
    """`lowered` carrying `problem`, its variant sites cut to the variants `problem` offers and
    its in-place pairs to the ops `problem` writes in place (NOTE [Writing into a tensor laid
    out otherwise than traced] in monet_opt/misread_layouts.py)."""
    names = {v.name for v in problem.variants}
    sites = tuple(s for s in lowered.variant_sites if f"{s.family}:{s.backward_node}" in names)
    index = {name: i for i, name in enumerate(lowered.op_nodes)}
    inplace = tuple((name, k) for name, k in lowered.inplace
                    if problem.ops[index[name]].inplace_bytes)
    return dataclasses.replace(lowered, problem=problem, variant_sites=sites, inplace=inplace)
