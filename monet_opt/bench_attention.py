"""Attention's implementations on this device at GPT-2's shapes (causal, 12 heads of 64): what
each scaled_dot_product_attention backend costs forward and backward and keeps for the
backward, and the fused kernel's backward against its products stand-in (NOTE [Other
implementations] in variants_impl.py): what the variant families see.

    python -m monet_opt.bench_attention [--device cuda] [--batch 8] [--lengths 256,512,1024]
        [--repeats 10] [--gpt2 BATCHxLENGTH]

Prints markdown tables; --gpt2 also lowers GPT-2 (12 layers, dropout 0) with the stand-in
family and says at how many attentions the profiler offers it.
"""
from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from monet_opt import variants_impl
from monet_opt.bench_bn import median_ms
from monet_opt.bench.run import device_name
from monet_opt.bench.settings import git_commit
from monet_opt.variant_probe import relative_error

aten = torch.ops.aten
HEADS, HEAD_DIM = 12, 64
STAND_IN = {"cpu": "attention.math_backward", "cuda": "attention.efficient_math_backward"}


def _peak_extra(fn, device: torch.device) -> int | None:
    """Bytes fn allocates at its peak beyond what was live before (CUDA only)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    del result
    return torch.cuda.max_memory_allocated() - before


def _mib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:.1f}"


def backend_row(backend: SDPBackend, dtype: torch.dtype, shape: tuple, device: torch.device,
                repeats: int) -> str:
    """One backend's forward and backward time and what autograd keeps beyond q, k, v and the
    output, or why it does not run here."""
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    cuda = device.type == "cuda"
    kept: dict[int, int] = {}
    try:
        with sdpa_kernel(backend):
            def pack(t):
                kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            forward = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                repeats, cuda)
            grad = torch.randn_like(out)
            backward = median_ms(lambda: out.backward(grad, retain_graph=True), repeats, cuda)
    except RuntimeError as exc:
        return f"| {backend.name.lower()} | {str(dtype)[6:]} | not offered here: " \
               f"{str(exc).splitlines()[0][:60]} | | |"
    for t in (q, k, v, out):
        kept.pop(t.untyped_storage().data_ptr(), None)
    return f"| {backend.name.lower()} | {str(dtype)[6:]} | {forward:.2f} | {backward:.2f} | " \
           f"{_mib(sum(kept.values()))} |"


def stand_in_row(shape: tuple, device: torch.device, repeats: int) -> str:
    """The fused float32 kernel's backward (CPU: flash; CUDA: memory-efficient) against the
    stand-in from the same saved tensors: times, the stand-in's extra peak, its error."""
    b, h, n, d = shape
    qkv = torch.randn(b, n, 3 * h * d, device=device)  # cut from one projection, as GPT-2's
    q, k, v = (t.view(b, n, h, d).transpose(1, 2) for t in qkv.split(h * d, dim=2))
    cuda = device.type == "cuda"
    if cuda:
        out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, True)
        args = (torch.randn_like(out), q, k, v, None, out, lse, seed, offset, 0.0,
                [True, True, True, False], True)
        kernel = lambda: aten._scaled_dot_product_efficient_attention_backward(*args)  # noqa
        stand_in = lambda: variants_impl.efficient_attention_backward(*args)  # noqa: E731
    else:
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[:2]
        args = (torch.randn_like(out), q, k, v, out, lse, 0.0, True)
        kernel = lambda: aten._scaled_dot_product_flash_attention_for_cpu_backward(*args)  # noqa
        stand_in = lambda: variants_impl.attention_backward(*args)  # noqa: E731
    err = relative_error(stand_in()[:3], kernel()[:3])
    return f"| {n} | {median_ms(kernel, repeats, cuda):.2f} | " \
           f"{median_ms(stand_in, repeats, cuda):.2f} | {_mib(_peak_extra(kernel, device))} | " \
           f"{_mib(_peak_extra(stand_in, device))} | {err:.1e} |"


def gpt2_offers(batch: int, length: int, device: torch.device) -> str:
    """GPT-2 (12 layers, dropout 0) lowered with the stand-in family only: how many of its
    attentions the profiler offers it at (measured faster, within IMPL_BOUND) and what each
    offer saves."""
    from transformers import GPT2Config, GPT2LMHeadModel

    import monet_opt
    cfg = GPT2Config(n_positions=max(length, 1024), use_cache=False, attn_pdrop=0.0,
                     resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).to(device).train()
    x = {"input_ids": torch.randint(0, cfg.vocab_size, (batch, length), device=device)}
    family = STAND_IN[device.type]
    problem = monet_opt.lower_problem(copy.deepcopy(model), x, profile_repeats=3,
                                      allow_lossy=True, variants={family})
    saved = sorted(-v.extra_time_s * 1e3 for v in problem.variants)
    detail = f" (saving {saved[0]:.2f}-{saved[-1]:.2f} ms each)" if saved else ""
    return f"GPT-2 batch {batch} x {length}: {family} offered at {len(saved)} of " \
           f"{cfg.n_layer} attentions{detail}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lengths", default="256,512,1024")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--gpt2", default=None, help="BATCHxLENGTH, e.g. 8x1024")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    lengths = [int(n) for n in args.lengths.split(",")]
    print(f"{device_name(device)}, torch {torch.__version__}, commit {git_commit()}; causal, "
          f"batch {args.batch}, {HEADS} heads of {HEAD_DIM}; median of {args.repeats} (ms)\n")
    print("| backend | dtype | forward | backward | kept beyond q, k, v, out (MiB) |")
    print("|---|---|---:|---:|---:|")
    for n in lengths:
        print(f"| **length {n}** | | | | |")
        for backend in (SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            for dtype in (torch.float32, torch.bfloat16):
                print(backend_row(backend, dtype, (args.batch, HEADS, n, HEAD_DIM), device,
                                  args.repeats))
    kernel = "memory-efficient" if device.type == "cuda" else "flash (CPU)"
    print(f"\nThe {kernel} kernel's float32 backward against its products stand-in "
          f"({STAND_IN[device.type]}):\n")
    print("| length | kernel | stand-in | kernel's peak extra (MiB) | stand-in's (MiB) | "
          "max rel. error |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in lengths:
        print(stand_in_row((args.batch, HEADS, n, HEAD_DIM), device, args.repeats))
    if args.gpt2:
        batch, length = (int(s) for s in args.gpt2.lower().split("x"))
        print("\n" + gpt2_offers(batch, length, device))


if __name__ == "__main__":
    main()
