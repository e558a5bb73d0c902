"""BatchNorm output-activated: the backward rebuilds its input from the output (lossy, opt-in).

NOTE [BatchNorm from its output]
  `native_batch_norm_backward(grad, x, weight, running_mean, running_var, mean, invstd, train,
  eps, mask)` reads x only through x_hat = (x - mean) * invstd. In training, out = weight * x_hat
  + bias per channel and x_hat has zero mean over each channel, so the channel mean of `out` is
  the bias, and x_hat = (out - mean_c(out)) / weight: the output stands in for the input, no bias
  needed. The family keeps nothing new: the backward reads `out`, which the forward makes anyway
  and which pays where another op keeps it too (SiLU, GELU, a convolution or a linear layer
  after the BatchNorm read their input in their backward); the input (a convolution's output,
  usually) can then go as soon as the BatchNorm has run. MONeT offers the same choice.

  Not bitwise: x is rebuilt as (out - mean_c(out)) / (weight * invstd) + mean, so each element
  carries the rounding of `out` divided by |weight|: about 2**-24 * (|x_hat| + 2 |bias| /
  |weight|) in x_hat. It grows without limit as a channel's weight nears zero (at zero the
  output is the bias alone and the input is gone). So the backward refuses to run when some
  channel has |weight| < SCALE_FLOOR * (1 + |bias|) (bias read as mean_c(out)), raising
  `BatchNormScaleError` rather than return wrong gradients; below that floor the error in
  x_hat stays under 2**-24 * 2 * (1 + 2 / SCALE_FLOOR) ~ 2e-5. The profiler withdraws the family
  where the model's weights already fail the guard, and where its result is off by more than
  the lossy bound. Rebuilding takes one temporary the size of x: the family's workspace. The
  guard reads a flag on the host: one synchronisation per BatchNorm backward on CUDA.

NOTE [Guards on a cached profile]
  The profiler withdraws the family where the weights fail the guard, but parameter values are
  in no profile key: a profile made on healthy weights was served to the same model with a
  channel's weight at zero, its plan kept the family, and the first backward raised
  BatchNormScaleError where a fresh profile would have trained. So each plan checks the
  weights it is made for (`guarded`) and withdraws the family where they fail, as profiling
  does; the step is solved without it. A weight the step computes (a parametrization) is
  checked by the backward only.
"""
from __future__ import annotations

import operator
import warnings
from typing import Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from monet_opt import bn_split
from monet_opt.errors import VariantGuardError
from solvers import Problem

aten = torch.ops.aten
NAME = "batchnorm.output_activated"
SCALE_FLOOR = 2.0 ** -6
_BN_FORWARD_OPS = (aten._native_batch_norm_legit_functional.default,
                   aten._native_batch_norm_legit.default,
                   aten.native_batch_norm.default)


class BatchNormScaleError(VariantGuardError):
    """A BatchNorm planned to rebuild its input from its output has a channel whose weight is
    too near zero for that (NOTE [BatchNorm from its output])."""


def accepts(node: fx.Node) -> bool:
    """Training-mode, float32, with a weight, and its output found in the graph."""
    x, weight = node.args[1], node.args[2]
    return bool(node.args[7]) and isinstance(weight, fx.Node) and isinstance(x, fx.Node) and \
        x.meta["val"].dtype == torch.float32 and output_node(node) is not None


def output_node(node: fx.Node) -> fx.Node | None:
    """The forward node whose value is the BatchNorm's output, read from the backward node's
    saved mean (a getitem of the forward op): the forward's first output, or where the
    forward was split (NOTE [BatchNorm recomputed from its statistics]) the `apply_stats`
    node that its readers read it from."""
    mean = node.args[5]
    if not (isinstance(mean, fx.Node) and mean.target is operator.getitem):
        return None
    forward = mean.args[0]
    if not isinstance(forward, fx.Node) or forward.target not in _BN_FORWARD_OPS:
        return None
    for user in mean.users:
        if user.target is bn_split.apply_stats:
            return user
    for user in forward.users:
        if user.target is operator.getitem and user.args[1] == 0:
            return user
    return None


def from_output(grad, out, weight, running_mean, running_var, mean, invstd, train, eps,
                output_mask):
    """native_batch_norm_backward with the output `out` in the input's place."""
    dims = [d for d in range(out.dim()) if d != 1]
    shape = [1, -1] + [1] * (out.dim() - 2)
    bias = out.mean(dims)
    weak = _weak(weight, bias)
    if bool(weak.any()):
        c = int(weak.nonzero()[0, 0])
        raise BatchNormScaleError(
            f"monet_opt: a BatchNorm planned to rebuild its input from its output (lossy "
            f"variant 'batchnorm.output_activated') has weight {float(weight[c]):.3g} in "
            f"channel {c} of {weight.numel()}, below {SCALE_FLOOR} * (1 + |bias|): its output "
            "no longer determines its input. Optimize again without allow_lossy=True, or "
            "with variants= leaving out 'batchnorm.output_activated'.")
    x = out - bias.reshape(shape)
    x.div_((weight * invstd).reshape(shape)).add_(mean.reshape(shape))
    return aten.native_batch_norm_backward(grad, x, weight, running_mean, running_var, mean,
                                           invstd, train, eps, output_mask)


def _weak(weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Per channel, whether the output no longer determines the input."""
    return weight.abs() < SCALE_FLOOR * (1 + bias.abs())


def guarded(problem: Problem, joint: fx.GraphModule, primals: Sequence[torch.Tensor]
            ) -> Problem:
    """`problem` without the family at BatchNorms whose weights, in `primals` now, fail the
    guard (NOTE [Guards on a cached profile])."""
    prefix = f"{NAME}:"
    if not any(v.name.startswith(prefix) for v in problem.variants):
        return problem
    nodes = {n.name: n for n in joint.graph.nodes}
    values = dict(zip((n for n in joint.graph.nodes if n.op == "placeholder"), primals))
    failing = [k for k, v in enumerate(problem.variants) if v.name.startswith(prefix)
               and _fails(nodes.get(v.name[len(prefix):]), values)]
    if not failing:
        return problem
    warnings.warn(f"monet_opt: {len(failing)} BatchNorm(s) have a channel whose weight is "
                  f"below {SCALE_FLOOR} * (1 + |bias|), too near zero to rebuild the input from "
                  f"the output; lossy variant '{NAME}' is not used there: "
                  f"{[problem.variants[k].name for k in failing][:3]}", RuntimeWarning,
                  stacklevel=3)
    return problem.only_variants(set(range(len(problem.variants))) - set(failing))


def _fails(node: fx.Node | None, values: dict[fx.Node, torch.Tensor]) -> bool:
    if node is None or node.target is not aten.native_batch_norm_backward.default:
        return False
    weight = values.get(node.args[2])
    if weight is None:  # made by the step: the backward's guard checks it
        return False
    mean = node.args[5]
    forward = mean.args[0] if isinstance(mean, fx.Node) and mean.args else None
    bias = values.get(forward.args[2]) if isinstance(forward, fx.Node) and \
        forward.target in _BN_FORWARD_OPS else None
    with unset_fake_temporarily(), torch.no_grad():  # planning runs inside the trace
        return bool(_weak(weight, torch.zeros_like(weight) if bias is None else bias).any())
