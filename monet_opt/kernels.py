"""The attention kernels scaled_dot_product_attention may use now (NOTE [Attention kernels are
traced])."""
from __future__ import annotations

import torch

# NOTE [Attention kernels are traced]
#   scaled_dot_product_attention picks its kernel (flash, memory-efficient, math, cuDNN) as it
#   is traced, and the step runs that kernel; under torch.nn.attention.sdpa_kernel(...) eager
#   runs the one allowed, whose results differ in the last bits (CPU math against flash:
#   outputs 1.2e-7, a gradient 2.9e-6 apart, silently). So the kernels allowed are part of the
#   autocast state that tells steps apart: another set plans a step for it (ReplanWarning).
def sdpa_kernels() -> tuple[bool, ...]:
    b = torch.backends.cuda
    return (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(),
            b.cudnn_sdp_enabled())


# NOTE [Two precision APIs]
#   torch has two ways to let float32 matmuls and convolutions run in lower precision: the
#   legacy `torch.set_float32_matmul_precision("medium")` / `allow_tf32`, and per backend
#   `torch.backends.{cuda.matmul,mkldnn.matmul,cudnn.conv,...}.fp32_precision = "tf32"`, which
#   PyTorch now recommends. Once the second is set, the legacy getters raise ("mix of the legacy
#   and new APIs"), and monet_opt read them at import, at optimize() and at every step: a user
#   who had set TF32 the new way could not import it (modes probe, 2026-12-06). Where the
#   legacy getter raises, the per-backend values are read instead (they never raise; oneDNN's
#   matmul in "bf16" changes its results on a CPU with bfloat16 instructions), and the legacy
#   value where it reads, as before.
_PRECISIONS = ("", "cuda.matmul", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn", "cudnn.conv",
               "cudnn.rnn")


def fp32_precisions() -> tuple[tuple[str, str], ...]:
    """(backend, precision) of each per-backend float32 precision not "none" (NOTE [Two
    precision APIs]); "" is torch.backends' own."""
    found = []
    for path in _PRECISIONS:
        where = torch.backends
        for part in filter(None, path.split(".")):
            where = getattr(where, part, None)
        value = getattr(where, "fp32_precision", "none")
        if value != "none":
            found.append((path, value))
    return tuple(found)


def legacy(read):
    """`read()`, or None where the per-backend precisions were set (NOTE [Two precision
    APIs])."""
    try:
        return read()
    except RuntimeError:
        return None


# What each setting that tells steps apart reads now (changed()).
SETTINGS = {
    "sdpa": sdpa_kernels,
    "cudnn": lambda: torch.backends.cudnn.enabled,
    "mkldnn": lambda: torch.backends.mkldnn.enabled,
    "deterministic": torch.are_deterministic_algorithms_enabled,
    "threads": torch.get_num_threads,
    "matmul": lambda: legacy(torch.get_float32_matmul_precision) or fp32_precisions(),
    "dtype": torch.get_default_dtype,
}
AT_IMPORT = {name: read() for name, read in SETTINGS.items()}


def changed() -> tuple[tuple[str, object], ...]:
    """(setting, value) for each setting otherwise than at import, in SETTINGS' order.
    "sdpa": the attention kernels allowed (NOTE [Attention kernels are traced]). "cudnn": a
    BatchNorm's kernel is chosen as it is traced (NOTE [cuDNN's BatchNorm] in
    monet_opt/cudnn_bn.py), so a step traced with cuDNN on ran cuDNN's under
    `torch.backends.cudnn.flags(enabled=False)`, where eager runs ATen's (not bitwise alike;
    where torch sees no GPU it changes nothing, and is left out). "dtype": a tensor the forward
    makes without one (torch.arange(n) / 3.0) is made in torch's default dtype, so after
    set_default_dtype(float64) eager's loss was float64 and the step's float32. The rest change
    kernels, not the graph, and so the step's memory, which its plan must be measured for
    (NOTE [Backend settings in the key] in monet_opt/cache_keys.py): "mkldnn", a CPU
    convolution without oneDNN keeps an unfolded copy of its input (a plan made with it on:
    2.3x over its limit); "threads", oneDNN's convolution backward keeps scratch per thread
    (a plan made at 1 thread, stepped at 2: 29,952 B over); "matmul", a float32 matmul
    precision of "medium" runs bfloat16 kernels with their own scratch (3 % over).
    "deterministic": besides, AOTAutograd refuses to run a backward made under the other
    setting (every step after turning it on raised, where eager trains)."""
    now = {name: read() for name, read in SETTINGS.items()}
    return tuple((name, value) for name, value in now.items() if value != AT_IMPORT[name] and
                 (name != "cudnn" or torch.cuda.is_available()))
