"""Tensors held to the step's end: kept on a module (NOTE [Tensors kept on a module] in
monet_opt/forward_state.py) or held by the caller (NOTE [Outputs held through the backward]).

NOTE [Outputs held through the backward]
  A plan frees each output of the step once the forward is done with it, as the loss leaves it:
  `loss_fn(opt(x), y).backward()`, HF's `opt(**batch, labels=y).loss.backward()` and HF's
  Trainer keep no reference to the outputs once the loss is made. But the most common loop of
  all keeps them: `out = opt(x); loss = loss_fn(out, y); loss.backward()`, nanoGPT's `logits,
  loss = model(x, y)`, HF's `outputs = model(**batch); outputs.loss.backward()`. There every
  step measured the outputs' bytes over its plan and over the limit, silently (an LM's logits:
  the largest tensor of its step). So the step's autograd node gets a hook that, once, as its
  backward ends (its saved tensors freed: an output it saved is alive then only where the
  caller holds it), looks at the outputs it returned (weak references): where those still alive
  and not parameters, buffers or inputs hold more than the room its plan leaves under the limit
  (limit minus predicted peak), this step may have passed the limit by the difference: it warns
  (OutputsHeldWarning, with the bytes), and from the next step on the module runs a step
  planned with the outputs held from the step's start to its end (the kept-tensor transform,
  NOTE [Tensors kept on a module]; ReplanWarning), so later steps stay within the limit. Held
  outputs that fit in that room change nothing. Where no plan that holds them fits the limit,
  the steps keep the plan that frees them, and a second OutputsHeldWarning says by how much
  the limit falls short: a step stopped by an InfeasibleBudgetError at the second step, where
  it had run over the limit by the outputs' bytes, would be worse than that step warned of. A
  loop that lets go of its outputs keeps the tighter plan; to have it with the outputs in hand,
  compute the loss inside the module (monet_opt.WithLoss), or `del out` before the backward.

NOTE [Held tensors made again]
  A tensor held for the whole step (kept on a module, or an output the caller holds) is
  counted once, in the fixed memory, and as 0 B where its op makes it. A schedule that
  recomputed that op (torch.nn.utils.weight_norm's `_weight_norm_interface`, for the 32-byte
  norms it makes with the weight) made the tensor again, a real copy the plan counted as 0 B:
  the weight-normed SmallCNN of tests/test_weight_hooks.py measured up to 5,472 B over its
  prediction (14 of 30 random schedules). So every output of an op that makes a held tensor is
  held with it (weight_norm's norms: 4 B per output channel), and where a schedule recomputes
  such an op the executor runs nothing: it hands the backward the forward's copies, alive to
  the step's end anyway (rewrite.rebuild_joint); that recomputation costs no time either.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

import solvers
from monet_opt import retained_graphs
from monet_opt.errors import user_stacklevel
from monet_opt.memory import allocated_bytes, dense_parts, resident_bytes
from monet_opt.plan import Plan


class OutputsHeldWarning(RuntimeWarning):
    """The caller held the step's outputs through its backward, which the plan had not counted
    (NOTE [Outputs held through the backward])."""


# NOTE [Outputs held by their storage]
#   What the caller holds is looked for by the outputs' storages, not the output tensors:
#   `loss = out.loss; preds = out.logits.detach(); del out; loss.backward()`, a common way to
#   keep HF's logits for metrics, holds the logits' storage through an alias, and the check,
#   by weak references to the output tensors, found none held: every step passed its limit by
#   the logits' bytes (GPT-2, 7,628 B over a 997,576 B limit, three steps), with no warning and
#   no replan (peft probe, 2026-12-06). A storage the step's own autograd graph holds is freed
#   by the backward's end, where the check runs.
class HeldOutputs:
    """Whether the caller of one optimized module holds its outputs through the backward."""

    def __init__(self) -> None:
        self.held = False

    def watch(self, node: Any, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
              plan: Plan, fixed: Callable[[], list[torch.Tensor]]) -> None:
        """Look, once, as the backward that runs the step's autograd node `node` ends, at the
        output tensors it returned under `plan`; `fixed()`: the parameters and buffers then.
        Nothing to do once held, or without a node. At its end, not its start: an output the
        backward saves (topk's indices, returned for logging) is alive at its start whatever
        the caller does, and at its end (the saved tensors freed) only where the caller holds
        it, through the whole backward where the plan frees it at its read. Counted at the
        start, a loop that kept only the loss was warned and got a slower plan; left out, a
        loop that kept the indices passed the limit by their bytes, silently."""
        room = plan.memory_limit_bytes - plan.predicted_peak_bytes
        if self.held or node is None or room >= resident_bytes(_beyond_loss(outputs)):
            return
        # NOTE [Outputs held by their storage]: an alias the caller keeps (out.logits.detach()
        # for metrics) holds the storage, not the output tensor
        storages = {part.untyped_storage().data_ptr(): (
            StorageWeakRef(part.untyped_storage()),
            allocated_bytes(part.untyped_storage().nbytes(), part.device))
            for t in _beyond_loss(outputs) for part in dense_parts(t)}
        ins = {p.untyped_storage().data_ptr() for x in inputs for p in dense_parts(x)}

        def check():
            if self.held:
                return
            alive = {ptr: size for ptr, (ref, size) in storages.items() if not ref.expired()}
            if not alive:
                return
            own = ins | {t.untyped_storage().data_ptr() for t in fixed()}
            held = sum(size for ptr, size in alive.items() if ptr not in own)
            if held > room:
                self.held = True
                warnings.warn(OutputsHeldWarning(
                    f"monet_opt: the caller held {held:,} B of the step's outputs through its "
                    f"backward (out = opt(x); loss = loss_fn(out, y); loss.backward()), which "
                    f"its plan frees once the loss is made: this step could pass its predicted "
                    f"{plan.predicted_peak_bytes:,} B by that much, and the memory limit by "
                    f"{held - room:,} B. The next steps are planned with the outputs held "
                    "(a ReplanWarning says so). To keep the tighter plan, let go of them before "
                    "the backward (compute the loss in one expression, or del out), or compute "
                    "the loss inside the module: monet_opt.WithLoss(model, loss_fn). NOTE "
                    "[Outputs held through the backward] in monet_opt/held_outputs.py."),
                    stacklevel=user_stacklevel())  # the line that ran the backward
        # at the backward's end, by the engine's callback: a post-hook on the node would have
        # the engine hold the node's incoming gradients through it (128 B over a plan). Not
        # where the graph is kept (retain_graph=True): its saved tensors, the outputs among
        # them (`out.square()`'s), outlive that backward whatever the caller holds, and
        # RetainedGraphWarning says so (it was said that the caller held them: 2026-12-06)
        node.register_prehook(lambda grad_outputs: None if retained_graphs.kept() else
                              torch.autograd.Variable._execution_engine.queue_callback(check))

    def cannot_fit(self, least: int | None, limit: int) -> None:
        """Warn that no plan holding the outputs fits `limit` (its least peak: `least`, None
        where the solver found none in its time)."""
        shown = "not found in the solver's time" if least is None else f"{least:,} B"
        warnings.warn(OutputsHeldWarning(
            f"monet_opt: no plan that holds the step's outputs through its backward fits the "
            f"memory limit, {limit:,} B (the least such peak: {shown}), so the steps keep "
            f"the plan that frees them and pass the limit by the outputs' bytes while the "
            f"caller holds them. Let go of them before the backward, raise the limit"
            + ("" if least is None else f" to {least:,} B")
            + ", or compute the loss inside the module (monet_opt.WithLoss)."),
            stacklevel=user_stacklevel())


def _beyond_loss(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """`outputs` but the first scalar: a module that returns its loss (monet_opt.WithLoss, HF
    given labels) has the caller hold it through its backward, as every loss is held, and the
    plan counts that (NOTE [The loss scalar], in this file). Counted as held, it made
    WithLoss at its least limit warn twice, and say to use WithLoss, where the step measured
    its prediction to the byte."""
    first = next((k for k, t in enumerate(outputs) if t.dim() == 0), None)
    return outputs if first is None else outputs[:first] + outputs[first + 1:]


def loss_bytes(joint) -> int:
    """NOTE [The loss scalar]: the user's loss is outside the graph, but any training step makes
    at least a scalar loss and its seed gradient; count those two scalars (of the output
    gradients' dtype). Anything larger the loss function allocates (a cross-entropy's
    log-probabilities) is not in the plan: fold the loss into the module to plan it too. The two
    scalars are counted for the whole step, so a step whose peak falls in its forward measures
    them under its plan. A loss the step returns in a larger storage: `held_loss`."""
    tangents = [n.meta["val"] for n in joint.graph.find_nodes(op="placeholder")
                if n.name.startswith("tangents")]
    return 2 * allocated_bytes(tangents[0].element_size(), tangents[0].device) if tangents else 0


def held_loss(joint, lowered, problem: solvers.Problem, returned: tuple[int, ...]
              ) -> tuple[int, int] | None:
    """(tensor, the one element `loss_bytes` counts of it) of the loss the step returns (its
    first scalar output, as `_beyond_loss` takes it), where its storage holds more than that
    element (NOTE [Outputs larger than their shapes] in monet_opt/output_bytes.py: CPU's
    mse_loss returns its mean in the elementwise losses' storage): the caller holds it through
    the backward, which the plan, freeing it after the forward, did not count."""
    outputs = next(iter(joint.graph.find_nodes(op="output"))).args[0]
    for k in returned:
        val = outputs[k].meta.get("val") if isinstance(outputs[k], fx.Node) else None
        if isinstance(val, torch.Tensor) and val.dim() == 0:
            t = lowered.output_tensors[k][0] if len(lowered.output_tensors[k]) == 1 else None
            one = allocated_bytes(val.element_size(), val.device)
            big = t is not None and problem.tensors[t].bytes > one and \
                problem.tensors[t].producer != solvers.NO_PRODUCER
            return (t, one) if big else None
    return None


def held_problem(problem: solvers.Problem, storages: set[int],
                 loss: tuple[int, int] | None = None) -> tuple[solvers.Problem, frozenset[int]]:
    """`problem` with the storages of the kept tensors (`storages`: tensor ids) held for the
    whole step: their bytes fixed, nothing when made, never written over (NOTE [Tensors kept
    on a module]); the loss `held_loss` found too, less the element counted for it already;
    and every other output of the ops making them (NOTE [Held tensors made again]). With the
    held tensors the step makes, which the executor reads from their forward copies."""
    if loss is not None and loss[0] not in storages:
        storages = storages | {loss[0]}
        problem = dataclasses.replace(problem, fixed_bytes=problem.fixed_bytes - loss[1])
    makers = {problem.tensors[t].producer for t in storages} - {solvers.NO_PRODUCER}
    made = frozenset(t for i in makers for t in problem.ops[i].outputs)
    if not made:
        return problem, made
    tensors = tuple(dataclasses.replace(x, bytes=0) if t in made else x
                    for t, x in enumerate(problem.tensors))
    ops = tuple(dataclasses.replace(op, overwrites=())  # a held output is no dying input's
                if (set(op.overwrites) | set(op.outputs)) & made and op.overwrites else op
                for op in problem.ops)
    ops = tuple(dataclasses.replace(op, recompute_time_s=0.0) if i in makers else op
                for i, op in enumerate(ops))  # its outputs are read, not made again
    return dataclasses.replace(problem, ops=ops, tensors=tensors, fixed_bytes=problem.fixed_bytes
                               + sum(problem.tensors[t].bytes for t in made)), made
