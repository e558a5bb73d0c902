"""How the executor recomputes forward ops: BatchNorm's no-stats form and random-op replay.

NOTE [Recomputing BatchNorm]
  1. A training-mode BN (`_native_batch_norm_legit_functional`) returns (out, batch mean, batch
     rstd, new running mean, new running var). The new running statistics leave the forward as
     buffer updates, applied once per step by AOTAutograd's runtime.
  2. A recomputation runs the no-stats form `_native_batch_norm_legit.no_stats`, which computes
     the same out/mean/rstd from the same batch without reading the running buffers: those were
     updated in place after the forward, and reading them from the backward would fail autograd's
     saved-tensor version check (DESIGN pitfall 1) and update the statistics twice. Where the
     BatchNorm is split (NOTE [BatchNorm recomputed from its statistics] in bn_split.py), `out`
     is recomputed by the normalization alone, and this form runs only where the schedule
     dropped the statistics too.
  3. The training-mode backward (`native_batch_norm_backward`, train=True) ignores its running
     mean/var arguments; the executor passes None so the backward holds no statistics.
  4. Where the new running statistics are read by more than the copy into the buffer (a tracked
     InstanceNorm called twice, by a checkpoint or as a shared module: they go through `mean`
     and `copy` into the second call's), a schedule may recompute those readers in the
     backward, and so this BatchNorm, whose no-stats form made no statistics: the rebuild
     failed ("getitem_3 is read where the schedule has no copy of it": a tracked InstanceNorm
     applied twice at 19 of 25 random schedules; tests/test_reentrant.py's once in CI). There
     the recomputation runs the BatchNorm as the forward did (`whole`), as the simulator counts
     it, on the copies of the buffers made as the step began (NOTE [Buffers the step updates]:
     `stats_read_on` has them made), not the buffers the forward updated.

NOTE [Recomputing random ops]
  A random op (dropout's `native_dropout`, `rand`, `bernoulli`...) that the schedule recomputes
  gets the generator state captured just before its forward run; the recomputation runs with
  that state and restores the generator afterwards. It reproduces the forward's mask exactly and
  leaves the user's random stream as eager PyTorch leaves it.

NOTE [The step's generator states]
  The captured states are memory: on CPU each is the generator's 5056-byte Mersenne-Twister
  state, held from its capture to the op's last recomputation. The plan did not count them (its
  solvers see no such tensor), and the live-bytes counter did not see them either (NOTE
  [Tensors made outside the dispatcher] in monet_opt/memory.py): once it did, a small CNN at its
  least peak measured 5,056 B over its plan and limit, a tiny GPT-2 15,168 B (three dropouts
  recomputed). So every step that has random ops makes a slot for each one's state, first
  thing in its forward, and holds them to the end of its backward; a recomputed op's state is
  copied into its slot. Their bytes do not depend on the schedule, so the plan counts them
  with the parameters (`states`, on CPU; on CUDA they are host memory, not the device's),
  and the solvers need nothing new. The cost: on CPU 5 KB per random op for the step, recomputed or
  not (GPT-2's 37 dropouts: 185 KB, against a peak of hundreds of MB). One tensor per slot:
  Generator.set_state crashed (segfault) on a slice of one larger buffer.

NOTE [The replay's state held]
  A recomputed random op runs with its generator set to the slot's state, and the state the
  generator had is held through the op to put it back (`with_generator_state`): one more
  state's bytes while the op runs, made by get_state() outside the dispatcher. The live-bytes
  counter did not see it; the allocator's events do (NOTE [Allocation events] in
  monet_opt/alloc_events.py): a random schedule on a small RNN measured 5,056 B over its
  prediction. So the profiler takes a random CPU op's workspace as the executor recomputes
  it (`as_run`), the held state included, and its forward run's apart (NOTE [A first run's
  workspace] in solvers/simulate.py), where the state copied into its slot is freed before the
  op runs: priced at the recomputation's, a plan whose peak was at a random op in the forward
  predicted one state more than the step held (an RNN's dropout: 5,056 B).

NOTE [A replay's state]
  A replaying variant (NOTE [Generator-state replay] in monet_opt/variants.py) keeps the state
  from before its dropout ran: the content of that dropout's slot, which a recomputation of
  the dropout would capture too. So the step captures it there whenever either is chosen, and
  the variant reads the slot: its encode op (in the problem) makes 0 bytes from nothing, and
  may run in the forward, the backward or both, holding nothing more. Before, the state was a
  tensor of its own (5,056 B on CPU) made by an encode op that read the mask, beside the slot
  every random op has anyway: a schedule that kept the mask and ran the encode op again in
  the backward (smaller than the state below 5,056 elements) had the step hold the forward's
  state where the plan held the mask: a tiny BERT measured 960 B over its prediction (the
  state, less a 4,096 B mask), and a replayed state was born one op before the plan's encode
  op said; at 2026-11-30, a schedule that dropped the state between the forward and the
  backward had the step hold it throughout (gpt2_narrow b4, 256, least peak: 10,112 B over
  its plan and limit). Found by random schedules run against the simulator
  (tests/test_random_schedules.py).
"""
from __future__ import annotations

import contextlib
import functools
import operator
from typing import Any, Callable

import torch
import torch.fx as fx

from monet_opt import bn_split, cudnn_bn, memory, phase
from monet_opt.errors import internal_assert

_BN_BACKWARD_STATS_ARGS = (3, 4)
_BN_BACKWARD_TRAIN_ARG = 7


# NOTE [Ops torch cannot vouch for]
#   ATen tags the ops that draw random numbers (nondeterministic_seeded); an op of another
#   library (`torch.library.custom_op`, a C++ extension) is untagged whether it draws or not.
#   A noise-injection custom op (`x + 0.01 * torch.randn_like(x)`) that a plan recomputed drew
#   new noise in the backward: gradients 4.2e-6 from eager's and the random stream advanced
#   otherwise, silently (custom-ops probe, 2026-12-06). So an op outside ATen's, prims' and our
#   own namespaces is taken as random: a recomputation replays its forward's generator state
#   (NOTE [Recomputing random ops]), exact whether it draws or not, for a generator state's
#   bytes per op (5 KB on CPU, NOTE [The step's generator states]).
_VOUCHED = frozenset({"aten", "prims", "monet_opt"})


def is_random(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and (
        torch.Tag.nondeterministic_seeded in target.tags or target.namespace not in _VOUCHED)


def dropped_args(node: fx.Node) -> tuple[int, ...]:
    """Positional args the executor replaces by None (NOTE [Recomputing BatchNorm] 3); a
    split BatchNorm's output read only by the forward's pass-through (NOTE [BatchNorm
    recomputed from its statistics])."""
    if node.target is cudnn_bn.BACKWARD and node.args[_BN_BACKWARD_TRAIN_ARG] is True:
        return _BN_BACKWARD_STATS_ARGS
    if node.target is bn_split.apply_stats:
        return (bn_split.FUSED_ARG,)
    return ()


def rerun_args(node: fx.Node, args: tuple) -> tuple | None:
    """A forward op's (evaluated) args as its recomputation runs it, where that differs from
    its forward run (a split BatchNorm's normalization); else None."""
    if not reruns_otherwise(node):
        return None
    drop = dropped_args(node)
    return tuple(None if k in drop else a for k, a in enumerate(args))


def reruns_otherwise(node: fx.Node) -> bool:
    """Whether a forward op's recomputation runs it on other args (`rerun_args`)."""
    return node.target is bn_split.apply_stats


def effective_args(node: fx.Node) -> tuple[tuple, dict]:
    drop = dropped_args(node)
    args = tuple(None if k in drop else a for k, a in enumerate(node.args))
    return args, dict(node.kwargs)


def tensor_args(node: fx.Node) -> list[fx.Node]:
    """The FX nodes this node reads, after dropped args are removed."""
    args, kwargs = effective_args(node)
    found: list[fx.Node] = []
    fx.node.map_arg((args, kwargs), found.append)
    return found


def recompute_form(node: fx.Node, whole: bool = False
                   ) -> tuple[object, tuple, dict, int | None]:
    """(target, args, kwargs, number of outputs kept) for recomputing `node` in the backward;
    whole: a training BatchNorm as the forward ran it (NOTE [Recomputing BatchNorm] 4)."""
    args, kwargs = effective_args(node)
    if node.target is cudnn_bn.TRAIN and not whole:
        inp, weight, bias, _rm, _rv, training, momentum, eps = args
        return cudnn_bn.RECOMPUTE, (inp, weight, bias, training, momentum, eps), kwargs, 3
    return node.target, args, kwargs, None


def new_stats(node: fx.Node) -> list[fx.Node]:
    """The getitems of `node`'s new running statistics, where it is a training BatchNorm."""
    if node.target is not cudnn_bn.TRAIN:
        return []
    return [u for u in node.users if u.target is operator.getitem and u.args[1] >= 3]


def stats_read_on(node: fx.Node) -> bool:
    """Whether training BatchNorm `node`'s new running statistics are read by an op other than
    a training BatchNorm taking them as its own (whose are then asked the same), and so may be
    read by a recomputation (NOTE [Recomputing BatchNorm] 4)."""
    for user in (u for stat in new_stats(node) for u in stat.users if u.op != "output"):
        takes = user.target is cudnn_bn.TRAIN and all(
            a not in node.users for k, a in enumerate(user.args) if k not in (3, 4))
        if not takes or stats_read_on(user):
            return True
    return False


# ---- generator state capture and replay (called from the executed FX graphs) ----

def _generator(device: str) -> torch.Generator:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.default_generators[dev.index if dev.index is not None
                                             else torch.cuda.current_device()]
    return torch.default_generator


def rng_state(device: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """The generator state right now (a small CPU uint8 tensor): that of the generator the op
    is given, where it is given one (NOTE [Generators given to ops]), else the device's."""
    state = (_generator(device) if generator is None else generator).get_state()
    return memory.count_made(state)  # NOTE [Tensors made outside the dispatcher]


# NOTE [Generators given to ops]
#   An op can draw from a generator it is given (torch.rand(..., generator=self.g), a module
#   holding its own torch.Generator for reproducible noise). The traced step holds that very
#   generator (a graph attribute), so each step draws from it as eager does; but profiling ran
#   the step and drew from it (profiling keeps only the default generators' states), so every
#   step's draws were eager's later ones, and a recomputation replayed the default generator's
#   state: outputs unlike eager's from the first step, silently. The profiler now puts such
#   generators back as it found them (`kept_generators`), and a random op given one captures
#   that generator's state and is recomputed with a new generator at that state in its place
#   (`rng_replay_given`: the backward cannot be given the generator itself, a graph attribute
#   of the forward, and need not be).
def held_generators(gm: torch.fx.GraphModule) -> list[torch.Generator]:
    """The generators `gm`'s ops are given (its attributes that are generators)."""
    found = (getattr(gm, n.target, None) for n in gm.graph.find_nodes(op="get_attr"))
    return [g for g in found if isinstance(g, torch.Generator)]


@contextlib.contextmanager
def kept_generators(gm: torch.fx.GraphModule):
    """Puts the generators `gm`'s ops are given back as they were, on leaving."""
    held = [(g, g.get_state()) for g in held_generators(gm)]
    try:
        yield
    finally:
        for g, state in held:
            g.set_state(state)


def op_qualname(op: torch._ops.OpOverload) -> str:
    """'aten.native_dropout.default': how the executed graph names an op it replays."""
    return f"{op.namespace}.{op._schema.name.split('::')[-1]}.{op._overloadname}"


def _resolve(qualname: str) -> torch._ops.OpOverload:
    namespace, name, overload = qualname.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def rng_replay(state: torch.Tensor, device: str, op_qualname: str, /, *args, **kwargs):
    """Run the op with the generator at `state`, then put the generator back as it was. The
    first three are positional only: the op's own keywords may hold a `device` (torch.rand's,
    MAE's random masking: recomputing it raised "got multiple values for argument 'device'")."""
    return with_generator_state(state, device, _resolve(op_qualname), *args, **kwargs)


def rng_replay_given(state: torch.Tensor, device: str, op_qualname: str, /, *args, **kwargs):
    """Run an op that was given a generator with a new generator at `state` in its place (NOTE
    [Generators given to ops]); the one it was given is not touched."""
    generator = torch.Generator(device=device)
    generator.set_state(state)
    return _resolve(op_qualname)(*args, generator=generator, **kwargs)


def with_generator_state(state: torch.Tensor, device: str, fn, /, *args, **kwargs):
    """fn(*args, **kwargs) with `device`'s generator at `state`, then put back as it was."""
    gen = _generator(device)
    saved = gen.get_state()
    gen.set_state(state)
    try:
        return fn(*args, **kwargs)
    finally:
        gen.set_state(saved)


def as_run(node: fx.Node, target, args: tuple, kwargs: dict) -> Callable[[], Any]:
    """`node`'s op on `args` as the executor runs it, for its workspace (NOTE [Workspace] in
    monet_opt/memory.py): a random op on the CPU (not given a generator) with the generator
    set to a state and put back after, holding the state it puts back (NOTE [The replay's
    state held])."""
    if not holds_state(node, kwargs):
        return functools.partial(target, *args, **kwargs)
    return functools.partial(with_generator_state, rng_state("cpu"), "cpu", target, *args,
                             **kwargs)


def as_first_run(node: fx.Node, target, args: tuple, kwargs: dict) -> Callable[[], Any]:
    """`node`'s forward run as the executor runs it where it captures the state (NOTE [The
    capture's copy]), a slot made already: for the workspace of a random CPU op's first run."""
    slot = new_state(rng_state_nbytes("cpu"))
    return lambda: (capture_state(slot, "cpu"), target(*args, **kwargs))[1]


# NOTE [The capture's copy]
#   A random op the plan recomputes (or replays) has the generator state copied into its slot
#   just before its forward run: get_state() makes the state (5,056 B on CPU) where everything
#   the forward holds is alive, and it is freed before the op runs. The first run's workspace
#   was the op's alone, so where a dropout's output and workspace came to less than a state,
#   its least plan passed the limit by the difference (a 6-op fuzzed model: 1,964 B, 16 %
#   over; fuzz probe, 2026-12-06). The profiler takes the first run both ways, and the
#   problem holds both (`Op.first_workspace_bytes`, `captured_workspace_bytes`): the simulator
#   prices the run with the capture only where the schedule recomputes or replays the op
#   (`solvers.simulate.captured`, the rule the executor's rebuild applies); the solvers, which
#   do not tell, price every forward run with it (the safe side). Priced with it everywhere, a
#   store-all step of a Linear and a dropout predicted 7,256 B where it measured 2,768 B, and a
#   limit at its own measured peak was refused.


def holds_state(node: fx.Node, kwargs: dict) -> bool:
    """Whether the executor's recomputation of `node` holds a generator state while the op
    runs (NOTE [The replay's state held]): a random forward op on the CPU not given a
    generator (a backward's random op runs once, as drawn: NOTE [Random ops of the backward]
    in monet_opt/rewrite.py)."""
    return is_random(node) and "generator" not in kwargs and device_of(node) == "cpu" and \
        not phase.in_backward(node)


def rng_state_nbytes(device: str) -> int:
    return int(rng_state(device).numel())


def new_state(nbytes: int) -> torch.Tensor:
    """A slot for one generator state (host memory, whatever the device)."""
    return torch.empty(nbytes, dtype=torch.uint8)


def capture_state(slot: torch.Tensor, device: str,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """The generator state right now, copied into `slot`: the slot."""
    state = (_generator(device) if generator is None else generator).get_state()
    if state.numel() != slot.numel():
        raise RuntimeError(f"monet_opt: a generator state of {state.numel()} B where the step "
                           f"kept a {slot.numel()}-byte slot (a generator of another kind than "
                           f"{device}'s own was given to a random op); please report this")
    return slot.copy_(state)


@torch.fx.node.has_side_effect
def release_states(*slots: torch.Tensor) -> None:
    """The backward's last use of the step's generator states: they are held to here."""


def random_forward_ops(joint: fx.GraphModule, lowered) -> list[fx.Node]:
    """The joint's random forward ops, in order (NOTE [The step's generator states])."""
    problem, nodes = lowered.problem, {n.name: n for n in joint.graph.nodes}
    return [nodes[lowered.op_nodes[i]] for i in problem.forward_ops if problem.ops[i].is_random]


def states(joint: fx.GraphModule, lowered) -> tuple[tuple[str, int], ...]:
    """(random op node, bytes) of each generator state the step may keep (NOTE [The step's
    generator states]), where the plan counts host memory (every random op runs on the CPU: a
    CPU step), else none."""
    ops = random_forward_ops(joint, lowered)
    if any(torch.device(device_of(op)).type != "cpu" for op in ops):
        return ()
    return tuple((op.name, rng_state_nbytes(device_of(op))) for op in ops)


SLOT_OF = "monet_slot_of"  # meta of a state slot's node: its random op's name


# NOTE [States kept only where used]
#   Every random op had a slot made for its state and held through the step, whether or not
#   the schedule recomputed it, and the plan counted them all as fixed memory (5,056 B each on
#   CPU): a step that recomputes nothing held 111,232 B more than eager's on a tiny Whisper (22
#   dropouts, 23 % over its peak; DistilBERT, RoBERTa, Phi 6-7 %), and a limit at eager's own
#   peak was refused (HF zoo probe, 2026-12-06). Now only the ops a schedule recomputes or
#   replays get a slot; the others capture nothing. Each state is on its op in the problem
#   (`Op.state_bytes`, monet_opt/kept_states.py) and in the fixed memory: the solvers count
#   every state (a schedule's choice of what to recompute would have to price them), the
#   simulator only those the schedule keeps (`solvers.simulate.captured`, the rule rebuild.py
#   applies), so a plan's prediction, its store-all figures, a share of the activations and
#   a stored schedule's peak shown by `explain` are of the states the step makes; an op whose
#   outputs the step holds anyway keeps none (kept_states.held). Where no schedule fits with
#   every state counted, the problem is solved again without them, as without the copies of
#   buffers the step updates (NOTE [Copies counted as made] in monet_opt/updated_buffers.py).
#   A store-all step with 3 RReLUs, planned at a limit its least plan met with 2 states,
#   reported its store-all peak 10,112 B over the store-all step's (module probe,
#   2026-12-06); `list` and `explain` showed one schedule's peak 2.56 and 2.53 MiB.


def device_of(node: fx.Node) -> str:
    return str(first_tensor(node).device)


def first_tensor(node: fx.Node) -> torch._subclasses.FakeTensor:
    """The node's (first) fake tensor value: its device, and the fake mode to make more in."""
    val = node.meta.get("val")
    for v in val if isinstance(val, (tuple, list)) else [val]:
        if isinstance(v, torch._subclasses.FakeTensor):
            return v
    internal_assert(False, f"{node.name} has no fake tensor value")
