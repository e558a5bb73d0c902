"""A warning where the loss hands the step an output gradient the plan does not count (NOTE
[The output's gradient] in monet_opt/lower.py).

The plan counts the output gradients as `out.sum()` hands them: an expanded scalar, free. A loss
whose backward makes a full-size gradient (cross-entropy, a mean, a square, a cast) makes it,
and what it saved and its backward's temporaries, where the forward turns into the backward,
so such a step can peak over the plan by about that much (cross-entropy: three logits-sized
tensors; a square's: 1.6x the logits' bytes on tests/models.py's GPT-2). Each output of the
step that requires a gradient gets a tensor hook that looks at the gradient it is handed (its
storage: an expanded scalar's is one element) and warns where it holds more than SHARE of the
plan's predicted peak, saying how many bytes and what to do: compute the loss inside the module
optimized (WithLoss). The hook returns nothing: the gradient goes on as it came.

NOTE [Double backward]
  A backward with create_graph=True (a gradient penalty such as WGAN-GP's, second-order MAML,
  Hessian-vector products) cannot go through the step: AOTAutograd's compiled backward is not
  itself differentiable, and said so as "torch.compile with aot_autograd does not currently
  support double backward", naming a tool the user never called. The same hook sees the
  gradient arrive with grad mode on (which create_graph=True sets) and raises
  DoubleBackwardError saying what to do instead, before the step's backward runs.

NOTE [torch.func transforms]
  Under torch.func's transforms (grad, vmap: per-sample gradients as vmap(grad(functional_call(
  opt, params, x)))) the step's tensors are functorch's wrappers, which its compiled graphs
  cannot run: they stopped in torch ("Cannot access storage of TensorWrapper", "... of
  BatchedTensorImpl"), naming neither monet_opt nor what to do. A forward called inside a
  transform runs the model as it is, as eager does, with a TransformWarning
  saying that it is not planned; a backward handed batched gradients (autograd.grad(...,
  is_grads_batched=True)) raises DoubleBackwardError's kin, saying to take it through the model.

NOTE [Traced by torch.jit]
  torch.jit.trace(opt, x), and the tools built on it (fvcore's FlopCountAnalysis), planned a
  new step inside the jit tracer, which failed with PyTorch's internal asserts and a message
  blaming the inputs' layout, where the input was the sample itself (tools probe,
  2026-12-06). Under the jit tracer the model runs as it is, as under torch.func's
  transforms, with the same TransformWarning: the trace is the model's.

NOTE [Forward-mode AD]
  Dual tensors (torch.autograd.forward_ad.make_dual, and what
  torch.autograd.functional.jacobian(..., strategy="forward-mode") makes) reached the step's
  autograd Function, which has no jvp: torch raised "You must implement the jvp function for
  custom autograd.Function", naming neither monet_opt nor what to do, where eager gives the
  tangents (higher-order probe, 2026-12-06). A parameter or an input with a tangent at the
  current dual level now runs the model as it is, as under torch.func's transforms, with the
  same TransformWarning: forward-mode AD is not a training step's backward.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn
from torch.autograd import forward_ad

from monet_opt.input_spec import InputSpec
from monet_opt.errors import DoubleBackwardError, user_stacklevel

SHARE = 0.01  # of the predicted peak: an output gradient above this is warned about


class OutputGradientWarning(RuntimeWarning):
    """The loss handed the step a full-size output gradient, which the plan does not count
    (NOTE [The output's gradient] in monet_opt/lower.py)."""


def watch(outputs: list[torch.Tensor], predicted_peak_bytes: int) -> None:
    """Hook every output tensor that requires a gradient (the step's output tensors, before the
    user's loss sees them), but a leaf: a parameter or an input returned as it is, whose
    gradient goes to its .grad, not through the step, and which outlives the step (a hook on it
    stayed: a parameter returned every step gathered one a step, 3,001 after 3,000 steps, each
    run by every backward, the step 0.75 -> 7.2 ms)."""
    for out in outputs:
        if out.requires_grad and not out.is_leaf:
            out.register_hook(_hook(predicted_peak_bytes))


class TransformWarning(RuntimeWarning):
    """A torch.func transform ran the model unplanned (NOTE [torch.func transforms])."""


def eager_only(*groups: list) -> bool:
    """Whether the step cannot run here: under a torch.func transform (NOTE [torch.func
    transforms]), on forward-mode AD's dual tensors among `groups`' (the parameters, the
    inputs; NOTE [Forward-mode AD]), under
    torch.autograd.graph.allow_mutation_on_saved_tensors(), whose dispatch mode reads every
    out= op's result as `out` (the step's backward writes into gradients through other names:
    a bare KeyError('out')), or under torch.jit's tracer (NOTE [Traced by torch.jit]); if so,
    says that the step runs the model as it is."""
    if torch._C._functorch.maybe_current_level() is not None:
        why = "under a torch.func transform (grad, vmap, jacrev, ...), whose tensors"
    elif forward_ad._current_level >= 0 and any(
            isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None
            for group in groups for t in group):
        why = "on forward-mode AD's dual tensors (torch.autograd.forward_ad), whose tangents"
    elif torch.autograd.graph._allow_mutation_on_saved_tensors_enabled:
        why = "under torch.autograd.graph.allow_mutation_on_saved_tensors(), whose mode"
    elif torch.jit.is_tracing():  # NOTE [Traced by torch.jit]
        why = ("under torch.jit.trace (fvcore's FlopCountAnalysis, TensorBoard's add_graph), "
               "whose tracer")
    else:
        return False
    warnings.warn(TransformWarning(
        f"monet_opt: the optimized module was called {why} its planned step cannot run: it "
        "runs the model as it is (eager, no memory plan). NOTE [torch.func transforms] in "
        "monet_opt/output_grad.py."), stacklevel=user_stacklevel())
    return True


def _hook(peak: int):
    def check(grad: torch.Tensor | None) -> None:  # None: an output the loss did not read
        if grad is not None and (torch._C._functorch.is_functorch_wrapped_tensor(grad) or
                                 torch._C._functorch.is_legacy_batchedtensor(grad)):
            raise DoubleBackwardError(
                "monet_opt: a batched backward (torch.autograd.grad(..., is_grads_batched=True), "
                "or a torch.func transform over it) reached the optimized step, whose compiled "
                "backward cannot run on batched gradients. Take that backward through the "
                "model itself (opt.model(x): eager, no plan). NOTE [torch.func transforms] "
                "in monet_opt/output_grad.py.")
        if torch.is_grad_enabled():  # NOTE [Double backward]
            raise DoubleBackwardError(
                "monet_opt: a backward with create_graph=True (a gradient penalty, second-order "
                "MAML, a Hessian-vector product) reached the optimized step, whose compiled "
                "backward cannot itself be differentiated. Take that derivative inside the "
                "optimized module's forward (a physics-informed residual or a gradient "
                "penalty computed in the forward and returned: derivatives the forward takes "
                "are planned with the step), or compute the term with the model itself "
                "(opt.model(x): eager, no plan).")
        if grad is None:
            return
        held = grad.untyped_storage().nbytes()
        # an expanded scalar (out.sum()'s) holds one element: free, however small the step
        if held > grad.element_size() and held > SHARE * peak:
            warnings.warn(
                f"monet_opt: the loss handed the step a {held:,} B output gradient (a full-size "
                f"one, as cross-entropy, a mean, a square or a cast make, or outputs that view one "
                f"another, whose gradients autograd sums); the plan counts output "
                f"gradients as free (as out.sum() hands them), so this step can peak over its "
                f"predicted {peak:,} B by that much and by what the loss's own backward makes. "
                f"To plan it too, optimize the model with its loss: monet_opt.WithLoss(model, "
                f"loss_fn), called as (inputs, targets) (HF models: pass labels and "
                f"backpropagate out.loss). Where the rest of a larger model makes it (a "
                f"backbone under detection heads), leave room for it in the limit instead. "
                f"NOTE [The output's gradient] in monet_opt/lower.py.", OutputGradientWarning,
                stacklevel=user_stacklevel())  # the line that ran the backward
    check.ours = True  # NOTE [Hooks on an output others are computed from]: not the caller's
    return check


class WithLoss(nn.Module):
    """The model and its loss as one module, so that the plan covers the loss too (NOTE [The
    output's gradient] in monet_opt/lower.py): forward(inputs, targets) returns
    loss_fn(model(inputs), targets), with `inputs` a tensor, a tuple of positional arguments or
    a dict of keyword arguments. The model is held, not copied: the optimized module trains its
    parameters.

        opt = monet_opt.optimize(monet_opt.WithLoss(model, F.cross_entropy), (x, y), "2GiB")
        opt(x, y).backward()
    """

    def __init__(self, model: nn.Module, loss_fn) -> None:
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, inputs: Any, targets: Any) -> torch.Tensor:
        args, kwargs = InputSpec.split(inputs)  # what a sample_input means to optimize()
        return self.loss_fn(self.model(*args, **kwargs), targets)
