"""Masks kept as bits: ReLU's sign and dropout's mask (variant families in monet_opt/variants.py).

NOTE [1-bit masks]
  A bool tensor takes a byte per element. `pack_bits` stores 8 per byte (uint8, padded to a
  multiple of 8); `unpack_bits` rebuilds the bool tensor exactly. The backward then holds a
  bool temporary the size of the mask while the op runs: that is the variant's workspace,
  measured by the profiler. Unpacking makes that byte per element once (0 or 1 in place, read
  as bool); it made a second beside it, which a ReLU's backward written into its dy held at
  its peak (NOTE [Workspace written into] in monet_opt/variant_probe.py). The bits follow the
  masked tensor's order in memory (its `memory_order`), and the rebuilt mask has its layout:
  after a channels-last ReLU, threshold_backward lays its result out channels-last, and so
  must the variant (else the profiler refuses it, as it did every ReLU's in channels-last
  GoogLeNet before).

NOTE [A ReLU's mask and its gradient in place]
  threshold_backward writes dx into a dy that dies there (NOTE [BatchNorm's gradient in
  place] in monet_opt/grad_in_place.py), but where a mask variant ran in its place it made dx
  anew, so the plan counted dx again as the variant's workspace. ResNet-18 (b16, 112², CPU)
  then peaked least at its stem ReLU's backward, masked: max-pool's dx and the ReLU's, 12.25 MiB
  each, and the unpacked mask. Where the lowering lets the op write into dy, the variant now
  does too (`*_run_into`): dy.masked_fill_(mask, 0.0), the same values as where(mask, 0.0, dy)
  element by element (+0.0 where masked, dy's own bits elsewhere, NaN included), in dy's
  layout, which the lowering checked is dx's (tests/test_grad_in_place.py).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from monet_opt import grad_in_place

aten = torch.ops.aten


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


def memory_order(t: torch.Tensor) -> tuple[int, ...]:
    """The dimensions of `t` from the outermost in memory to the innermost: `t.permute(order)`
    is contiguous for a dense tensor (channels-last NCHW: (0, 2, 3, 1)); the identity where no
    permutation makes it so (an expanded or overlapping tensor)."""
    order = tuple(sorted(range(t.dim()), key=lambda d: -t.stride(d)))
    shape = [t.shape[d] for d in order]
    stride = [t.stride(d) for d in order]
    expected = 1
    for size, st in reversed(list(zip(shape, stride))):
        if size != 1 and st != expected:
            return tuple(range(t.dim()))
        expected *= size
    return order


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(order.index(d) for d in range(len(order)))


def unpack_bits(packed: torch.Tensor, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    weights = torch.ones(8, dtype=torch.uint8, device=packed.device).bitwise_left_shift(
        torch.arange(8, dtype=torch.uint8, device=packed.device))
    # one byte per element, made 0 or 1 in place and read as bool: `.ne(0)` made a second
    # byte per element beside the first (NOTE [1-bit masks])
    bits = packed.unsqueeze(1).bitwise_and(weights).ne_(0).view(torch.bool).view(-1)
    numel = 1
    for s in shape:
        numel *= s
    return bits[:numel].view(shape)


# ---- ReLU and other thresholds: threshold_backward(grad, out, threshold) needs out's sign ----

def relu_bool_encode(out: torch.Tensor, threshold) -> torch.Tensor:
    return out.le(threshold)


def relu_bool_run(grad: torch.Tensor, zero: torch.Tensor, threshold) -> torch.Tensor:
    # `where` lays its result out as threshold_backward does, after the mask (so after the
    # ReLU's output); masked_fill's is always contiguous, which the profiler refused for
    # channels-last networks (the values are the same).
    return torch.where(zero, 0.0, grad)


def relu_bool_run_into(grad: torch.Tensor, zero: torch.Tensor, threshold) -> torch.Tensor:
    """relu_bool_run with dx written into grad (NOTE [A ReLU's mask and its gradient in
    place])."""
    return grad.masked_fill_(zero, 0.0)


def relu_bit_params(node: fx.Node) -> tuple:
    return (node.args[2], memory_order(node.args[1].meta["val"]))


def relu_bit_encode(out: torch.Tensor, threshold, order) -> torch.Tensor:
    return pack_bits(out.le(threshold).permute(order))


def _relu_bit_mask(params: tuple, grad: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    # NOTE [1-bit masks]: the mask rebuilt in the ReLU output's layout, so `where` lays the
    # result out as threshold_backward does (as in relu_bool_run)
    order = params[1]
    return unpack_bits(packed, tuple(grad.shape[d] for d in order)).permute(_inverse(order))


def relu_bit_run(params: tuple, grad: torch.Tensor, packed: torch.Tensor,
                 threshold) -> torch.Tensor:
    return torch.where(_relu_bit_mask(params, grad, packed), 0.0, grad)


def relu_bit_run_into(params: tuple, grad: torch.Tensor, packed: torch.Tensor,
                      threshold) -> torch.Tensor:
    """relu_bit_run with dx written into grad (NOTE [A ReLU's mask and its gradient in
    place])."""
    return grad.masked_fill_(_relu_bit_mask(params, grad, packed), 0.0)


# ---- dropout: native_dropout_backward(grad, mask, scale) reads a bool mask ----

def dropout_bit_run(grad: torch.Tensor, packed: torch.Tensor, scale: float) -> torch.Tensor:
    return aten.native_dropout_backward(grad, unpack_bits(packed, grad.shape), scale)


def dropout_bit_run_into(grad: torch.Tensor, packed: torch.Tensor, scale: float
                         ) -> torch.Tensor:
    """dropout_bit_run with dx written into grad (NOTE [Dropout's gradient in place] in
    monet_opt/grad_in_place.py)."""
    return grad_in_place.dropout_backward_out(grad, unpack_bits(packed, grad.shape), scale,
                                              out=grad)
