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


SDPA_AT_IMPORT = sdpa_kernels()
CUDNN_AT_IMPORT = torch.backends.cudnn.enabled
MKLDNN_AT_IMPORT = torch.backends.mkldnn.enabled
DETERMINISTIC_AT_IMPORT = torch.are_deterministic_algorithms_enabled()
DTYPE_AT_IMPORT = torch.get_default_dtype()


def changed() -> tuple[tuple[str, object], ...]:
    """("sdpa", flags) where the attention kernels allowed are not as they were at import;
    ("cudnn", enabled) where cuDNN is turned on or off otherwise than at import: a BatchNorm's
    kernel is chosen as it is traced (NOTE [cuDNN's BatchNorm] in monet_opt/cudnn_bn.py), so
    a step traced with cuDNN on ran cuDNN's under `torch.backends.cudnn.flags(enabled=False)`,
    where eager runs ATen's (not bitwise alike; where torch sees no GPU it changes nothing);
    ("dtype", default) where torch's default dtype is another: a tensor the forward makes
    without one (torch.arange(n) / 3.0) is made in it, so after set_default_dtype(float64)
    eager's loss was float64 and the step's float32; ("mkldnn", enabled) where oneDNN is turned
    on or off otherwise than at import: the graph is the same, but a CPU convolution without
    it keeps an unfolded copy of its input, so the plan's peak was not the step's (a profile
    made with it on: 2.3x over the limit; NOTE [Backend settings in the key] in
    monet_opt/cache_keys.py); ("deterministic", on) where torch.use_deterministic_algorithms
    is otherwise than at import: AOTAutograd refuses to run a backward made under the other
    setting (every step after turning it on raised, where eager trains)."""
    kernels, cudnn, dtype = sdpa_kernels(), torch.backends.cudnn.enabled, \
        torch.get_default_dtype()
    mkldnn, deterministic = torch.backends.mkldnn.enabled, \
        torch.are_deterministic_algorithms_enabled()
    return ((("sdpa", kernels),) if kernels != SDPA_AT_IMPORT else ()) + \
        ((("cudnn", cudnn),) if cudnn != CUDNN_AT_IMPORT and torch.cuda.is_available()
         else ()) + \
        ((("mkldnn", mkldnn),) if mkldnn != MKLDNN_AT_IMPORT else ()) + \
        ((("deterministic", deterministic),) if deterministic != DETERMINISTIC_AT_IMPORT
         else ()) + \
        ((("dtype", dtype),) if dtype != DTYPE_AT_IMPORT else ())
