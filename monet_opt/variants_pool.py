"""Pooling and shape-only variants (declared in `monet_opt.variants.FAMILIES`); all exact.

NOTE [Compact max-pool indices]
  max_pool2d_with_indices keeps, per output element, the flat position `ih * W + iw` of its
  window's maximum in the (H, W) input plane: int64, 8 bytes. That position always lies inside
  the element's window (PyTorch starts each argmax at a valid window cell and never leaves the
  window; NaNs win but stay inside), so it is one of kh*kw cells, and the window's top-left
  corner follows from the output position:
      ih = oh*sh - ph + a*dh,   iw = ow*sw - pw + b*dw,   offset = a*kw + b,  0 <= a < kh, b < kw.
  The forward keeps `offset` as uint8 (kh*kw <= 256), int16 (<= 32768) or int32; the backward
  rebuilds the int64 positions from a table of the kh*kw cells plus each output's corner. The
  rebuilt tensor equals the original element for element, so the op's result is bitwise the
  same (the profiler checks it on every model it offers the variant for). Large indices are
  compacted a slice of their leading dimension at a time, which bounds the encoder's int64
  temporaries (its workspace) to a slice's.
"""
from __future__ import annotations

import torch
import torch.fx as fx


def shape_only(like: tuple, *_result_strides) -> torch.Tensor:
    """A stand-in with the (shape, dtype, device) `like` that allocates one element: for ops
    that read an argument only for its shape (and dtype, device). It reads as contiguous: the
    result's strides, where a family takes them, are laid out apart (NOTE [Layouts a stand-in
    cannot show] in monet_opt/variants.py)."""
    shape, dtype, device = like
    return torch.zeros((), dtype=dtype, device=device).expand(shape)


def result_strides(node: fx.Node) -> tuple:
    """(the strides of `node`'s one result,): pooling's backward lays it out as its input."""
    return (tuple(node.meta["val"].stride()),)


def _pair(v, default=None) -> tuple[int, int]:
    v = list(v) if v else list(default or ())
    return (int(v[0]), int(v[-1]))


def maxpool_geometry(node: fx.Node) -> tuple[int, ...]:
    """(kh, kw, sh, sw, ph, pw, dh, dw, input width) of a max_pool2d_with_indices_backward."""
    _, x, kernel, stride, padding, dilation = node.args[:6]
    kh, kw = _pair(kernel)
    sh, sw = _pair(stride, kernel)
    ph, pw = _pair(padding, (0,))
    dh, dw = _pair(dilation, (1,))
    return (kh, kw, sh, sw, ph, pw, dh, dw, int(x.meta["val"].shape[-1]))


def compactable(node: fx.Node) -> bool:
    return isinstance(node.args[7], fx.Node) and node.args[7].meta["val"].dtype == torch.int64


def _offset_dtype(cells: int) -> torch.dtype:
    if cells <= 256:
        return torch.uint8
    return torch.int16 if cells <= 32768 else torch.int32


def _corners(indices: torch.Tensor, sh, sw, ph, pw) -> tuple[torch.Tensor, torch.Tensor]:
    """Each output position's window corner (row (OH, 1), column (OW,)), in input coordinates."""
    oh_n, ow_n = indices.shape[-2:]
    dev = indices.device
    rows = torch.arange(oh_n, device=dev, dtype=torch.int64).mul_(sh).sub_(ph).unsqueeze(1)
    cols = torch.arange(ow_n, device=dev, dtype=torch.int64).mul_(sw).sub_(pw)
    return rows, cols


# The int64 positions' size above which they are compacted a slice of the leading dimension at
# a time, and into how many slices at most: one slice's integer arithmetic holds three int64
# temporaries its size, which on GoogLeNet (b32, 128²) made the first max-pool's encoder 46 MiB
# of workspace, its least peak (docs/numbers.md, BatchNorm's gradient in place).
COMPACT_SLICE_ELEMENTS = 1 << 16
COMPACT_SLICES = 16


def compact_indices(indices: torch.Tensor, kh, kw, sh, sw, ph, pw, dh, dw,
                    width) -> torch.Tensor:
    """NOTE [Compact max-pool indices]: int64 flat positions -> in-window offsets, a slice of
    the leading dimension at a time (the same integers, less workspace)."""
    slices = min(COMPACT_SLICES, indices.numel() // COMPACT_SLICE_ELEMENTS, indices.shape[0])
    if slices <= 1:
        return _compact(indices, kh, kw, sh, sw, ph, pw, dh, dw, width)
    out = torch.empty_like(indices, dtype=_offset_dtype(kh * kw))
    for part, into in zip(indices.chunk(slices), out.chunk(slices)):
        into.copy_(_compact(part, kh, kw, sh, sw, ph, pw, dh, dw, width))
    return out


def _compact(indices: torch.Tensor, kh, kw, sh, sw, ph, pw, dh, dw, width) -> torch.Tensor:
    rows, cols = _corners(indices, sh, sw, ph, pw)
    ih = torch.div(indices, width, rounding_mode="floor")
    iw = indices - ih * width
    a = torch.div(ih - rows, dh, rounding_mode="floor") if dh != 1 else ih.sub_(rows)
    b = torch.div(iw - cols, dw, rounding_mode="floor") if dw != 1 else iw.sub_(cols)
    return a.mul_(kw).add_(b).to(_offset_dtype(kh * kw))


def full_indices(offsets: torch.Tensor, kh, kw, sh, sw, ph, pw, dh, dw,
                 width) -> torch.Tensor:
    """NOTE [Compact max-pool indices]: in-window offsets -> the int64 flat positions."""
    dev = offsets.device
    cells = (torch.arange(kh, device=dev, dtype=torch.int64).mul_(dh * width).unsqueeze(1)
             + torch.arange(kw, device=dev, dtype=torch.int64).mul_(dw)).reshape(-1)
    rows, cols = _corners(offsets, sh, sw, ph, pw)
    flat = cells.index_select(0, offsets.reshape(-1).to(torch.int32))
    return flat.view(offsets.shape).add_(rows * width + cols)
