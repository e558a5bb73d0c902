"""The operator-variant library (MONeT's idea in stock PyTorch; DESIGN "Operator variants").

Each family is data: a backward ATen op, the argument of it that the family does without, how
the forward encodes that argument right after it is made (`encode`, or None when the op needs
only its shape), and what the backward runs instead of the op (`run`, given the op's arguments
with the encoded tensor in that place). Lowering turns each match into a `solvers.Variant`; the
profiler measures its time and workspace; the executor emits `encode`/`run` where the schedule
chooses it. Every family here is exact: the backward's result is bitwise the eager one.

NOTE [1-bit masks]
  A bool tensor takes a byte per element. `pack_bits` stores 8 per byte (uint8, padded to a
  multiple of 8); `unpack_bits` rebuilds the bool tensor exactly. The backward then holds a
  bool temporary the size of the mask while the op runs: that is the variant's workspace,
  measured by the profiler.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx

aten = torch.ops.aten


@dataclass(frozen=True)
class Family:
    """name: unique, used in plans. op/arg: the backward op and the argument it replaces.
    encode(x, *params) -> the smaller tensor the forward keeps (None: keep nothing, the op
    needs x's shape only). params(node): constants encode needs from the backward node.
    run(*args) -> the op's result, args as the op's with the replaced one swapped for the
    encoded tensor (or, without encode, for a (shape, dtype) pair)."""

    name: str
    op: torch._ops.OpOverload
    arg: int
    encode: Callable[..., torch.Tensor] | None
    run: Callable[..., torch.Tensor]
    params: Callable[[fx.Node], tuple] = lambda node: ()


def pack_bits(b: torch.Tensor) -> torch.Tensor:
    """NOTE [1-bit masks]: a bool tensor as uint8, 8 elements per byte."""
    flat = b.reshape(-1)
    pad = -flat.numel() % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    cols = flat.view(-1, 8)
    out = cols[:, 0].to(torch.uint8)
    for k in range(1, 8):
        out = out.bitwise_or(cols[:, k].to(torch.uint8).bitwise_left_shift(k))
    return out


def unpack_bits(packed: torch.Tensor, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    weights = torch.ones(8, dtype=torch.uint8, device=packed.device).bitwise_left_shift(
        torch.arange(8, dtype=torch.uint8, device=packed.device))
    bits = packed.unsqueeze(1).bitwise_and(weights).ne(0).view(-1)
    numel = 1
    for s in shape:
        numel *= s
    return bits[:numel].view(shape)


# ---- ReLU and other thresholds: threshold_backward(grad, out, threshold) needs out's sign ----

def _relu_bool_encode(out: torch.Tensor, threshold) -> torch.Tensor:
    return out.le(threshold)


def _relu_bool_run(grad: torch.Tensor, zero: torch.Tensor, threshold) -> torch.Tensor:
    return grad.masked_fill(zero, 0)


def _relu_bit_encode(out: torch.Tensor, threshold) -> torch.Tensor:
    return pack_bits(out.le(threshold))


def _relu_bit_run(grad: torch.Tensor, packed: torch.Tensor, threshold) -> torch.Tensor:
    return grad.masked_fill(unpack_bits(packed, grad.shape), 0)


# ---- dropout: native_dropout_backward(grad, mask, scale) reads a bool mask ----

def _dropout_bit_run(grad: torch.Tensor, packed: torch.Tensor, scale: float) -> torch.Tensor:
    return aten.native_dropout_backward(grad, unpack_bits(packed, grad.shape), scale)


# ---- max-pool: the backward reads its input only for the shape ----

def _maxpool_shape_run(grad, like, *rest) -> torch.Tensor:
    shape, dtype = like
    stand_in = torch.zeros((), dtype=dtype, device=grad.device).expand(shape)
    return aten.max_pool2d_with_indices_backward(grad, stand_in, *rest)


FAMILIES: tuple[Family, ...] = (
    Family("relu.bool_mask", aten.threshold_backward.default, 1, _relu_bool_encode,
           _relu_bool_run, params=lambda node: (node.args[2],)),
    Family("relu.bit_mask", aten.threshold_backward.default, 1, _relu_bit_encode,
           _relu_bit_run, params=lambda node: (node.args[2],)),
    Family("dropout.bit_mask", aten.native_dropout_backward.default, 1, pack_bits,
           _dropout_bit_run),
    Family("maxpool.shape_only", aten.max_pool2d_with_indices_backward.default, 1, None,
           _maxpool_shape_run),
)
_BY_NAME = {f.name: f for f in FAMILIES}


def families_for(node: fx.Node) -> list[Family]:
    return [f for f in FAMILIES if node.target is f.op]


def family(name: str) -> Family:
    return _BY_NAME[name]


# ---- what executed graphs call (module-level, so FX code can name them) ----

def encode(name: str, x: torch.Tensor, *params) -> torch.Tensor:
    return _BY_NAME[name].encode(x, *params)


def run(name: str, *args) -> torch.Tensor:
    return _BY_NAME[name].run(*args)
