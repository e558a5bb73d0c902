"""NOTE [torch.func transforms] in monet_opt/output_grad.py: under grad and vmap the optimized
module runs its model as it is, saying so; a batched backward is refused saying what to do."""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch.func import functional_call, grad, vmap

import monet_opt
from tests.models import mlp, small_cnn


def test_per_sample_gradients_run_the_model_as_it_is():
    """vmap(grad(functional_call(opt, ...))) stopped in torch ("Cannot access storage of
    TensorWrapper"); now it gives the model's per-sample gradients, with a TransformWarning."""
    torch.manual_seed(0)
    model, x, _ = mlp()
    opt = monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None,
                             profile_repeats=1)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def per_sample(module):
        loss = lambda p, one: functional_call(module, p, (one[None],)).square().sum()  # noqa: E731
        torch.manual_seed(1)
        return vmap(grad(loss), in_dims=(None, 0), randomness="same")(params, x)

    with pytest.warns(monet_opt.TransformWarning, match="torch.func transform"):
        ours = per_sample(opt)
    eager = per_sample(model)
    assert all(torch.equal(ours[k], eager[k]) for k in eager)


def test_a_batched_backward_says_what_to_do():
    """autograd.grad(..., is_grads_batched=True) stopped in torch ("Cannot access storage of
    BatchedTensorImpl")."""
    torch.manual_seed(0)
    model, x, _ = small_cnn()
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    out = opt(x).flatten(1)[:, :2]
    seeds = torch.eye(2)[:, None].expand(2, *out.shape)
    with pytest.raises(monet_opt.DoubleBackwardError, match="opt.model"):
        torch.autograd.grad(out, next(model.parameters()), seeds, is_grads_batched=True)


def test_mutation_allowed_on_saved_tensors_runs_the_model():
    """Under allow_mutation_on_saved_tensors() (a batch refilled in place before the
    backward) the step's backward stopped with a bare KeyError('out')."""
    torch.manual_seed(0)
    model, x, _ = small_cnn()
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    for module in (opt, eager):
        batch = x.clone()
        torch.manual_seed(1)
        with torch.autograd.graph.allow_mutation_on_saved_tensors():
            with pytest.warns(monet_opt.TransformWarning, match="allow_mutation") if \
                    module is opt else contextlib.nullcontext():
                loss = module(batch).square().sum()
            batch.mul_(2.0)
            loss.backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                           eager.parameters()))



def test_forward_mode_dual_tensors_run_the_model_as_it_is():
    """NOTE [Forward-mode AD]: dual tensors (an input's, and jacobian's forward-mode strategy)
    reached the step's autograd Function: torch's "You must implement the jvp function"; now
    eager's tangents and Jacobian, with a TransformWarning."""
    import torch.autograd.forward_ad as fwAD
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    x = torch.randn(8, 16)  # no dropout: eager's vmap refuses random ops
    opt = monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None,
                             profile_repeats=1)
    tangent, rest = torch.randn_like(x), x[:2, 3:]
    seen = []
    for module in (model, opt):
        with fwAD.dual_level(), contextlib.ExitStack() as stack:
            if module is opt:
                stack.enter_context(pytest.warns(monet_opt.TransformWarning, match="dual"))
            seen.append(fwAD.unpack_dual(module(fwAD.make_dual(x, tangent))).tangent)
        with contextlib.ExitStack() as stack:
            if module is opt:
                stack.enter_context(pytest.warns(monet_opt.TransformWarning, match="dual"))
            seen.append(torch.autograd.functional.jacobian(
                lambda s, m=module: m(torch.cat([s, rest], 1)), x[:2, :3], vectorize=True,
                strategy="forward-mode"))
    assert torch.equal(seen[0], seen[2]) and torch.equal(seen[1], seen[3])


def test_a_jit_trace_is_the_model_s():
    """NOTE [Traced by torch.jit]: torch.jit.trace(opt, x) planned a step inside the tracer and
    failed with torch's internal asserts, blaming the input's layout."""
    torch.manual_seed(0)
    model, x, _ = small_cnn()
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1)
    with pytest.warns(monet_opt.TransformWarning, match="torch.jit.trace"):
        traced = torch.jit.trace(opt, x, check_trace=False)
    torch.manual_seed(1)
    ours = traced(x)
    torch.manual_seed(1)
    assert torch.equal(ours, model(x))
