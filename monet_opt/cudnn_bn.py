"""On CUDA, a training BatchNorm runs cuDNN's kernels wherever eager's would.

NOTE [cuDNN's BatchNorm]
  Eager PyTorch runs a training BatchNorm on CUDA as `cudnn_batch_norm` and its backward as
  `cudnn_batch_norm_backward` wherever `torch._C._select_batch_norm_backend` says cuDNN (a
  float or half input of 3 to 5 dimensions with float weight and bias, and cuDNN on). The
  joint graph AOTAutograd traces holds ATen's own kernels instead
  (`_native_batch_norm_legit_functional`, `native_batch_norm_backward`), and on an H100 they
  cost ResNet-50 (batch 184, 224x224) 53.6 ms of a 126.5 ms step, where eager's whole step took
  101 ms (docs/benchmarks/gpu/README.md). So where eager would pick cuDNN, the graphs the
  profiler times and the executor runs call the functions below in those ops' places. The
  problem, the lowering and the variants still see the ATen ops: each function takes that op's
  arguments and returns what it returns (same shapes, dtypes and layouts), so only the kernel
  changes, and with it the time the profiler measures.

  - `forward` runs cuDNN's training kernel on copies of the running statistics, which it
    updates in place, and returns the copies as the functional op's new statistics: the
    buffers end the step as eager's do, bit for bit.
  - `recompute` (the backward's rerun of a forward BatchNorm, NOTE [Recomputing BatchNorm] in
    recompute.py) runs the same kernel on throwaway statistics (C floats each), so that its
    output, batch mean and inverse std are the forward's bitwise and the buffers are not
    touched twice.
  - `backward` runs cuDNN's backward on the saved batch mean and inverse std (cuDNN's
    "saved inverse variance" is ATen's invstd) and drops the gradients its output_mask does
    not ask for.
  Only where cuDNN's reserve space is empty (plain BatchNorm in NCHW: cuDNN's SPATIAL mode):
  the ATen ops have no output to carry it from the forward to the backward. A rerun or a
  backward is checked with its weight standing in for the running statistics it does not read,
  and a backward for the bias it does not take: so a BatchNorm with a weight and no bias runs
  ATen's forward and cuDNN's backward, which is correct (the saved statistics mean the same to
  both) though not eager's kernel.
"""
from __future__ import annotations

import contextlib

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from monet_opt.errors import internal_assert

aten = torch.ops.aten
TRAIN = aten._native_batch_norm_legit_functional.default
RECOMPUTE = aten._native_batch_norm_legit.no_stats
BACKWARD = aten.native_batch_norm_backward.default
_cache: dict[tuple, bool] = {}


def forward(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """_native_batch_norm_legit_functional's outputs from cuDNN's kernel."""
    new_mean, new_var = running_mean.clone(), running_var.clone()
    out, mean, invstd, reserve = aten.cudnn_batch_norm(x, weight, bias, new_mean, new_var,
                                                       True, momentum, eps)
    internal_assert(reserve.numel() == 0, "cuDNN's BatchNorm kept a reserve space")
    return out, mean, invstd, new_mean, new_var


def forward_in_place(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """_native_batch_norm_legit's outputs (the running statistics updated in place) from
    cuDNN's kernel (NOTE [Statistics updated in place] in monet_opt/stats_in_place.py)."""
    out, mean, invstd, reserve = aten.cudnn_batch_norm(x, weight, bias, running_mean,
                                                       running_var, True, momentum, eps)
    internal_assert(reserve.numel() == 0, "cuDNN's BatchNorm kept a reserve space")
    return out, mean, invstd


def recompute(x, weight, bias, training, momentum, eps):
    """_native_batch_norm_legit.no_stats's outputs from the kernel `forward` runs."""
    throwaway = torch.zeros_like(weight), torch.ones_like(weight)
    out, mean, invstd, _ = aten.cudnn_batch_norm(x, weight, bias, *throwaway, True, momentum, eps)
    return out, mean, invstd


def backward(grad, x, weight, running_mean, running_var, mean, invstd, train, eps, output_mask):
    """native_batch_norm_backward's outputs (train=True) from cuDNN's backward."""
    if x.device not in _no_reserve:
        _no_reserve[x.device] = torch.empty(0, dtype=torch.uint8, device=x.device)
    grads = aten.cudnn_batch_norm_backward(x, grad, weight, None, None, mean, invstd, eps,
                                           _no_reserve[x.device])
    return tuple(g if wanted else None for g, wanted in zip(grads, output_mask))


_no_reserve: dict[torch.device, torch.Tensor] = {}  # an empty reserve space per device
_KERNELS = {TRAIN: forward, RECOMPUTE: recompute, BACKWARD: backward}
_IN_PLACE = {TRAIN: forward_in_place}


def in_place_kernel(node: fx.Node):
    """What runs for a training BatchNorm `node` that updates its running statistics in place
    (NOTE [Statistics updated in place] in monet_opt/stats_in_place.py): cuDNN's kernel where
    `kernel` would swap it, else ATen's in-place op."""
    swapped = kernel(node) is not node.target
    return _IN_PLACE[TRAIN] if swapped else aten._native_batch_norm_legit.default


def kernel(node: fx.Node):
    """What runs for `node`: the function above in a BatchNorm op's place where eager would
    run cuDNN's kernel, else the node's own target."""
    swap = _KERNELS.get(node.target) if node.op == "call_function" else None
    if swap is None:
        return node.target
    val = lambda a: a.meta.get("val") if isinstance(a, fx.Node) else a  # noqa: E731
    if node.target is TRAIN:
        x, weight, bias, rm, rv, training, _momentum, eps = map(val, node.args)
    elif node.target is RECOMPUTE:
        x, weight, bias, training, _momentum, eps = map(val, node.args)
        rm = rv = None
    else:
        _g, x, weight, _rm, _rv, _mean, _invstd, training, eps, _mask = map(val, node.args)
        bias, rm, rv = weight, None, None
    if rm is None:  # a training BatchNorm may go without running statistics (NOTE above)
        rm = rv = weight
    return swap if training is True and runs_cudnn(x, weight, bias, rm, rv, eps) else node.target


def runs_cudnn(x, weight, bias, running_mean, running_var, eps) -> bool:
    """Whether eager runs this training BatchNorm (fake or real tensors) with cuDNN's kernels
    and an empty reserve space."""
    if not isinstance(x, torch.Tensor) or x.device.type != "cuda" or weight is None or \
            bias is None:
        return False
    described = [None if t is None else (tuple(t.shape), t.stride(), t.dtype)
                 for t in (x, weight, bias, running_mean, running_var)]
    key = (tuple(described), str(x.device), float(eps), torch.backends.cudnn.enabled)
    if key not in _cache:
        mode = x.fake_mode if isinstance(x, FakeTensor) else contextlib.nullcontext()
        with mode:
            backend = torch._C._select_batch_norm_backend(x, weight, bias, running_mean,
                                                          running_var, True, eps)
            _cache[key] = backend == torch._C._BatchNormBackend.Cudnn and \
                torch._C._get_cudnn_batch_norm_reserve_space_size(x, True) == 0
    return _cache[key]


def use_cudnn(gm: fx.GraphModule) -> int:
    """Point every BatchNorm node of `gm` that eager would run with cuDNN at the functions
    above; returns how many. Call recompile() after."""
    count = 0
    for target in _KERNELS:
        for node in gm.graph.find_nodes(op="call_function", target=target):
            run = kernel(node)
            if run is not target:
                node.target = run
                count += 1
    return count
