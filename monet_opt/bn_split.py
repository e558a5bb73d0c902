"""Recompute a training-mode BatchNorm from the statistics its forward already made.

NOTE [BatchNorm recomputed from its statistics]
  A training-mode BatchNorm does two things: it reduces its input to the batch mean and rstd,
  then it normalizes (out = x * alpha + beta per channel, alpha = rstd * weight, beta = bias -
  mean * alpha). The backward keeps mean and rstd anyway (a few bytes per channel), so a
  recomputation of `out` needs only the second half. On CPU that half is a tenth of the whole:
  16x256x32x32 float32, 2 threads, 5.3 ms for the training op and 0.5 ms for the normalization
  alone (16x64x64x64: 5.0 and 0.9 ms). MONeT's BatchNorm recomputes so too.

  So each training BatchNorm of the joint graph gets a second node after it, `apply_stats`,
  which the lowering sees as a second op: the first (the statistics) makes mean and rstd, the
  second reads the input, mean and rstd and makes `out`, and every reader of `out` reads it from
  the second. In the forward the second passes the first's `out` through (the training kernel
  already made it), so the forward runs as eager does; recomputed, it runs only the
  normalization. Its time is that normalization's (profiled so); the statistics op is charged
  the rest of the training op's time, so the forward costs what it did. The first op's own
  `out` is read by nothing in the problem: the simulator frees it right after the op, the
  moment the second makes its own, which in the forward is the same storage.

  Bitwise: ATen's CPU kernel shares one transform between training and inference: alpha =
  invstd * weight, beta = bias - mean * alpha, out = x * alpha + beta, with whatever fused
  multiply-adds the build compiled in. Inference mode with running_var = 1 - eps (so that invstd
  = 1/sqrt(var + eps) is exactly 1), weight = rstd * weight (so alpha is the training alpha,
  bit for bit) and running_mean = mean runs that transform on the same numbers. The split is
  made only where a check on random data of the node's own shape, layout, dtype and device,
  with the training kernel the forward will run (cuDNN's where eager's is: NOTE [cuDNN's
  BatchNorm]), comes out bitwise equal (`exact`); elsewhere (CUDA's training and inference
  kernels differ) the BatchNorm stays one op and recomputes whole.

  The normalization allocates rstd * weight, the 1 - eps vector and the kernel's alpha and
  beta for a moment: the second op's workspace. The pass-through in the forward allocates as
  many bytes (one empty tensor, one ATen call where making them took nine: NOTE [Direct
  calls] in monet_opt/direct_calls.py), so the forward's memory is what the simulator says at
  that op, to the byte.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from monet_opt import cudnn_bn

aten = torch.ops.aten
NAME = "batchnorm.saved_stats"  # what optimize(variants=...) calls it
_BN_INFERENCE = aten._native_batch_norm_legit_no_training.default
FUSED_ARG = 6  # apply_stats's argument that is the forward's own output
_exact_cache: dict[tuple, bool] = {}


def apply_stats(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                mean: torch.Tensor, rstd: torch.Tensor, eps: float,
                fused: torch.Tensor | None = None) -> torch.Tensor:
    """The training BatchNorm's output from its batch mean and rstd; `fused`, where given, is
    that output already made (the forward), returned as is."""
    if fused is not None:  # as many bytes as the temporaries below, in one call
        torch.empty(_workspace(rstd, weight), dtype=torch.uint8, device=rstd.device)
        return fused  # NOTE [BatchNorm recomputed from its statistics]
    scale = rstd if weight is None else rstd * weight
    unit = torch.ones_like(rstd) - eps
    return _BN_INFERENCE(x, scale, bias, mean, unit, 0.0, eps)[0]


def workspace_bytes(node: fx.Node) -> int:
    """What apply_stats allocates beside its output: rstd * weight and the 1 - eps vector."""
    _x, weight, _bias, _mean, rstd, _eps = node.args[:FUSED_ARG]
    return _workspace(rstd.meta["val"], weight.meta["val"] if isinstance(weight, fx.Node)
                      else None)


def _workspace(rstd: torch.Tensor, weight: torch.Tensor | None) -> int:
    """rstd * weight (none without a weight: the scale is rstd), the 1 - eps vector, and the
    transform's alpha and beta the inference kernel makes (it counted neither, nor the first
    where there was no weight: 24 B short of the 48 measured on 3 channels, and a fuzzed CNN's
    least plan 12 B over its limit; fuzz probe, 2026-12-06)."""
    scale_dtype = rstd.dtype if weight is None else torch.promote_types(rstd.dtype, weight.dtype)
    scale = 0 if weight is None else scale_dtype.itemsize
    return rstd.numel() * (scale + rstd.element_size() + 2 * scale_dtype.itemsize)


def split_batch_norm(gm: fx.GraphModule) -> int:
    """Give every training BatchNorm of `gm` whose normalization reproduces its output bitwise
    an `apply_stats` node (NOTE [BatchNorm recomputed from its statistics]); returns how many."""
    count = 0
    for node in list(gm.graph.find_nodes(op="call_function", target=cudnn_bn.TRAIN)):
        outs = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        if not {0, 1, 2} <= outs.keys() or not exact(node):
            continue
        x, weight, bias, _rm, _rv, _training, _momentum, eps = node.args
        after = max((outs[k] for k in (0, 1, 2)), key=_position(gm))
        with gm.graph.inserting_after(after):
            new = gm.graph.call_function(apply_stats, (x, weight, bias, outs[1], outs[2], eps,
                                                       outs[0]))
        new.meta.update(node.meta)
        new.meta["val"] = outs[0].meta["val"]
        outs[0].replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
        count += 1
    if count:
        gm.recompile()
    return count


def _position(gm: fx.GraphModule):
    order = {n: k for k, n in enumerate(gm.graph.nodes)}
    return order.__getitem__


def exact(node: fx.Node) -> bool:
    """Whether apply_stats gives this BatchNorm's output bitwise, checked once per (shape,
    layout, dtypes, device, eps) on random data."""
    x, weight, bias, _rm, _rv, _training, momentum, eps = node.args
    vals = [a.meta["val"] if isinstance(a, fx.Node) else None for a in (x, weight, bias)]
    key = tuple(None if v is None else (tuple(v.shape), v.stride(), v.dtype, str(v.device))
                for v in vals) + (float(eps),)
    if key not in _exact_cache:
        _exact_cache[key] = _check(*vals, momentum, eps)
    return _exact_cache[key]


def _check(x, weight, bias, momentum: float, eps: float) -> bool:
    if x is None or not x.dtype.is_floating_point:
        return False
    # the training kernel the forward will run (NOTE [cuDNN's BatchNorm])
    train = cudnn_bn.recompute if cudnn_bn.runs_cudnn(x, weight, bias, weight, weight, eps) \
        else cudnn_bn.RECOMPUTE
    with unset_fake_temporarily(), torch.no_grad():
        gen = torch.Generator(device=x.device).manual_seed(0)

        def real(v):
            if v is None:
                return None
            # random storage seen through the fake's strides: an expanded view's 0 strides
            # cannot be written through (copy_ refuses), its storage can
            size = 1 + sum((n - 1) * s for n, s in zip(v.shape, v.stride()) if n > 0)
            if 0 in v.shape:
                size = 0
            base = torch.randn(size, generator=gen, device=v.device) * 2 + 0.5
            return base.to(v.dtype).as_strided(tuple(v.shape), v.stride())

        xr, w, b = real(x), real(weight), real(bias)
        out, mean, rstd = train(xr, w, b, True, momentum, eps)
        got = apply_stats(xr, w, b, mean, rstd, eps)
        same_storage = got.untyped_storage().nbytes() == out.untyped_storage().nbytes()
        return got.dtype == out.dtype and got.stride() == out.stride() and same_storage and \
            torch.equal(got, out)

