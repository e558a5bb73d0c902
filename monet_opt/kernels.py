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
