"""Another implementation of the same op: the same tensors read, other time and workspace.

NOTE [Other implementations]
  MONeT's largest single win on a GPU was choosing cuDNN's convolution algorithm per layer
  (-14 % step time on ResNet-50 at 8 GB, research/monet.md): algorithms differ in time and in
  workspace, so the best one depends on the memory left at that moment. A family here reads the
  op's arguments as they are and runs the op under other backend settings: convolution's
  backward with oneDNN (mkldnn) off on CPU, so ATen's own kernels run; on CUDA with cuDNN's
  benchmark setting flipped and deterministic algorithms. Measured on CPU, 2 threads (16 images,
  backward for input and weight): a 1x1 convolution from 256 to 64 channels at 32x32 took 77.6 ms
  with oneDNN and 37.4 ms without; 3x3 ones took twice as long without (25.5 vs 51.1 ms).
  Without oneDNN the backward also needs less scratch where the weight is large (a 512-channel
  3x3 one 147,456 B against oneDNN's 9,437,184 B): the variant's extra workspace is negative,
  and it is offered for that even where slower (NOTE [A variant's workspace beyond its op's]
  in monet_opt/lower_variants.py).

  Attention: where the joint graph has the fused CPU kernel (`_scaled_dot_product_flash_
  attention_for_cpu`, no dropout), its backward can instead run the plain matrix products from
  the same saved tensors (the logsumexp the forward kept rebuilds the probabilities, L x S per
  head, as workspace). On CPU that never paid where measured (causal, 64 per head: 1x12x256
  3.1 vs 4.7 ms, 4x12x256 14.0 vs 27.3 ms, 1x12x1024 39.1 vs 118.1 ms) and needs more memory,
  so the profiler's figures keep it out of every plan. On CUDA the same products stand in for
  the memory-efficient kernel's backward (float32, no dropout: the kernel float32 attention
  runs on a GPU); flash attention runs in half precision only, where the products' rounding
  would not meet IMPL_BOUND, so it has no stand-in. On an H200 (causal, batch 8, 12 heads of
  64; docs/benchmarks/gpu/h200/attention.md) the products matched the kernel within 2.7e-6
  but took 3x its time (3.79 vs 1.21 ms at 1,024 tokens) and 9x its extra memory, so the
  profiler offered them at none of GPT-2's 12 attentions. Choosing the forward's backend
  instead would not pay either: in float32 the math backend keeps the probabilities and is
  slower both ways, and the fused kernels keep the same tensors (a logsumexp).

  The sums run in another order, so the results differ in the last bits (measured up to 6.5e-6
  relative on those shapes): not bitwise, so offered only with allow_lossy=True, within
  IMPL_BOUND. The CUDA setting is untested here (no GPU was lent): the profiler still checks
  every site's result against the op's before the family may be used.
"""
from __future__ import annotations

import contextlib

import torch
import torch.fx as fx

aten = torch.ops.aten
IMPL_BOUND = 1e-4  # max-abs relative error per output (measured at most 6.5e-6 on CPU)


@contextlib.contextmanager
def _mkldnn_off():
    """oneDNN off for a moment (torch.backends.mkldnn.flags would also set its TF32 flag,
    which warns on every call in CPU builds)."""
    was = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(was)


@contextlib.contextmanager
def _cudnn_flipped():
    """cuDNN's benchmark setting flipped and its deterministic algorithms, for a moment; its
    other settings (TF32 among them) as they were (torch.backends.cudnn.flags would reset
    them to its defaults)."""
    cudnn = torch.backends.cudnn
    was = (cudnn.benchmark, cudnn.deterministic)
    cudnn.benchmark, cudnn.deterministic = not was[0], True
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.deterministic = was


def _other_backend(device: torch.device):
    if device.type == "cpu":
        return _mkldnn_off()
    if device.type == "cuda":
        return _cudnn_flipped()
    return contextlib.nullcontext()


def accepts_conv(node: fx.Node) -> bool:
    """Where another backend exists: oneDNN built in on CPU, cuDNN on CUDA."""
    x = node.args[1]
    if not isinstance(x, fx.Node) or x.meta["val"].dtype not in (torch.float32, torch.bfloat16,
                                                                 torch.float16):
        return False
    kind = x.meta["val"].device.type
    return (kind == "cpu" and torch.backends.mkldnn.is_available()) or \
        (kind == "cuda" and torch.backends.cudnn.is_available())


def conv_backward(grad, x, *args):
    with _other_backend(x.device):
        return aten.convolution_backward(grad, x, *args)


def the_argument(k: int):
    """A family's `reads` for another implementation: the op's own argument k."""
    return lambda node: node.args[k]


def accepts_attention(node: fx.Node) -> bool:
    """The fused CPU kernel's backward, float32, without dropout."""
    q = node.args[1]
    return isinstance(q, fx.Node) and q.meta["val"].dtype == torch.float32 and \
        float(node.args[6]) == 0.0


def accepts_efficient_attention(node: fx.Node) -> bool:
    """The memory-efficient CUDA kernel's backward, float32, without dropout (its mask comes
    from a Philox stream no plain op replays), not asked for a gradient of its bias."""
    q = node.args[1]
    return isinstance(q, fx.Node) and q.meta["val"].dtype == torch.float32 and \
        float(node.args[9]) == 0.0 and not node.args[10][3]


def efficient_attention_backward(grad, q, k, v, attn_bias, out, logsumexp, philox_seed,
                                 philox_offset, dropout_p, grad_input_mask, is_causal=False, *,
                                 scale=None):
    """The memory-efficient CUDA kernel's backward as plain products: its logsumexp holds each
    query row's, padded to a multiple of 32 rows; its bias is additive; no bias gradient."""
    grads = attention_backward(grad, q, k, v, out, logsumexp[..., :q.shape[-2]], 0.0, is_causal,
                               attn_mask=attn_bias, scale=scale)
    return (*grads, None)


def attention_backward(grad, q, k, v, out, logsumexp, dropout_p, is_causal, *, attn_mask=None,
                       scale=None):
    """The fused CPU attention's backward as plain products: P = exp(q k^T s + mask - lse),
    dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = s dS K, dK = s dS^T Q."""
    s = scale if scale is not None else q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(s)
    if is_causal:  # top-left aligned, as scaled_dot_product_attention's
        scores.masked_fill_(torch.ones(scores.shape[-2:], dtype=torch.bool,
                                       device=q.device).triu_(1), float("-inf"))
    if attn_mask is not None:  # the kernel takes additive masks only (of q's dtype)
        scores.add_(attn_mask)
    lse = logsumexp.masked_fill(logsumexp.isneginf(), 0.0)  # rows with nothing to attend to
    p = scores.sub_(lse.unsqueeze(-1)).exp_()
    dv = torch.matmul(p.transpose(-2, -1), grad)
    dp = torch.matmul(grad, v.transpose(-2, -1))
    ds = p.mul_(dp.sub_((grad * out).sum(-1, keepdim=True))).mul_(s)
    return _heads_inner(torch.matmul(ds, k)), _heads_inner(
        torch.matmul(ds.transpose(-2, -1), q)), _heads_inner(dv)


def _heads_inner(grad: torch.Tensor) -> torch.Tensor:
    """(B, H, n, d) laid out as (B, n, H, d), as the kernel lays its gradients out whatever
    its inputs' layout (the graph's views of them expect it; the profiler checks strides)."""
    b, h, n, d = grad.shape
    return grad.new_empty(b, n, h, d).transpose(1, 2).copy_(grad)
