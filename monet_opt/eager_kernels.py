"""While a model is traced, the ops below are recorded as the kernels eager runs, not as the
Python decompositions AOTAutograd's tracer would put in their place (NOTE [Eager's own
kernels]).
"""
from __future__ import annotations

import contextlib
import warnings

import torch
import torch.fx.traceback as fx_traceback
from torch._C import DispatchKey

# NOTE [Eager's own kernels]
#   AOTAutograd traces with PyTorch's Python dispatcher on, and under it some ATen ops run a
#   Python decomposition registered for their Autograd or CompositeImplicitAutograd key in
#   place of the C++ kernel eager calls. For most such ops the decomposition computes what the
#   kernel does, bit for bit (batch norm, matmul, nearest upsampling: checked; dropout's forward,
#   and its backward with the scale NOTE [Dropout's scale] gives it). For the
#   ops named here it does not:
#   - linear, bilinear, bicubic and trilinear upsampling (F.interpolate, nn.Upsample): the
#     decomposition's pointwise arithmetic rounds otherwise than the native kernel (outputs up
#     to 1.2e-6 apart on a 2x4x13x11 bicubic); nearest modes (bitwise either way where
#     tested) are taken too, so that their backward is eager's kernel as well;
#   - GRU and plain RNNs with dropout between layers: the decomposition draws its masks over
#     other shapes than eager's composite does, so a two-layer GRU's outputs differed by 0.16;
#   - multi_margin_loss and multilabel_margin_loss: sums in another order (a loss 1.17820704
#     where eager's was 1.17820692; with p=2 and class weights, gradients 3e-8 apart).
#   With their Python kernels set aside for the trace, the joint graph holds the ops eager
#   runs (upsample_bilinear2d and its backward; GRU as eager's cells and dropouts), and the
#   step is bitwise eager's (tests/test_eager_kernels.py). One difference is left there: eager's
#   GRU cell runs its gate activations in place on strided slices of one gate tensor, the traced
#   graph on fresh contiguous ones, and ATen's CPU loops run the end of each row shorter than
#   two vector widths as scalar code: a GRU whose width is not a multiple of that (32 floats on
#   AVX-512) rounded its sigmoids otherwise than eager. The ops a GRU's cell records are so
#   tagged (GATES, in node.meta["custom"]), and its sigmoids run by rows as eager's do (NOTE
#   [A GRU's gates by rows] in monet_opt/gru_gates.py).
#   LSTM cannot go that way on CPU: eager's kernel there is oneDNN's, whose forward returns its
#   workspace only with grad mode on, which a compiled forward never has. Its decomposition
#   also picks oneDNN when the LSTM's input needs no gradient, and then the traced backward
#   lacks that workspace and fails. So the decomposition is kept for LSTM, with oneDNN off while
#   it traces: the step runs, but as ATen matrix products, not eager's fused kernel, so its
#   results differ from eager's by rounding, and with dropout between layers by the masks
#   drawn; LSTM_WARNING says so.
_EAGER = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
          "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
          "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d",
          "upsample_bicubic2d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa",
          "gru", "rnn_tanh", "rnn_relu", "multi_margin_loss", "multilabel_margin_loss_forward")
_WITHOUT_ONEDNN = ("lstm",)
_CELLS = ("gru", "gru_cell")  # their C++ composites record the ops tagged GATES
GATES = "monet_opt.gru_cell"
_KEYS = (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd)

LSTM_WARNING = (
    "monet_opt: {model} has an LSTM. It is traced as PyTorch's decomposition into matrix "
    "products, not eager's fused kernel (oneDNN's on CPU cannot run inside a compiled forward), "
    "so the optimized module's outputs and gradients differ from eager's by rounding, and "
    "with dropout between LSTM layers it draws other masks. Everything else about the plan "
    "(its memory limit, its prediction) holds.")


def _overloads(names: tuple[str, ...]):
    for name in names:
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            yield getattr(packet, overload)


def _without_onednn(kernel):
    # Not torch.backends.mkldnn.flags(): it also sets oneDNN's TF32 flag, which warns.
    def run(*args, **kwargs):
        enabled = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        try:
            return kernel(*args, **kwargs)
        finally:
            torch._C._set_mkldnn_enabled(enabled)
    return run


@contextlib.contextmanager
def eager_kernels():
    """Inside: the ops of _EAGER trace as eager's kernels, LSTM as its decomposition without
    oneDNN. Every op's Python kernels are as they were on exit."""
    swapped = []
    for names, replacement in ((_EAGER, None), (_WITHOUT_ONEDNN, _without_onednn)):
        for op in _overloads(names):
            for key in _KEYS:
                kernel = op.py_kernels.pop(key, None)
                if kernel is None:
                    continue
                swapped.append((op, key, kernel))
                if replacement is not None:
                    op.py_kernels[key] = replacement(kernel)
            op._dispatch_cache.clear()
    tagging = list(_overloads(_CELLS))
    for op in tagging:
        op.py_kernels[DispatchKey.CompositeImplicitAutograd] = _tagged(op)
        op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op in tagging:
            del op.py_kernels[DispatchKey.CompositeImplicitAutograd]
            op._dispatch_cache.clear()
        for op, key, kernel in swapped:
            op.py_kernels[key] = kernel
            op._dispatch_cache.clear()


def _tagged(op):
    """`op`'s C++ composite, the nodes it records tagged GATES."""
    def run(*args, **kwargs):
        with fx_traceback.annotate({GATES: True}):
            return op._op_dk(DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
    return run


def warn_if_lstm(model: torch.nn.Module) -> None:
    """The one difference from eager that eager_kernels leaves (NOTE [Eager's own kernels])."""
    if any(isinstance(m, torch.nn.LSTM) for m in model.modules()):
        warnings.warn(LSTM_WARNING.format(model=type(model).__name__), stacklevel=3)
