"""Comparing training runs recorded as (one dict of tensors per step, the final state_dict)."""
from __future__ import annotations

import torch


def assert_same(a, b, exact: bool) -> None:
    """Every recorded tensor bitwise equal (exact), or floats within 1e-5 relative (max-abs)."""
    for step, (u_step, v_step) in enumerate(zip(a[0] + [a[1]], b[0] + [b[1]])):
        assert u_step.keys() == v_step.keys()
        for name in u_step:
            u, v = u_step[name], v_step[name]
            if exact or not u.is_floating_point():
                assert torch.equal(u, v), f"step {step}: {name} differs"
            else:
                err = ((u - v).abs().max() / v.abs().max().clamp_min(1e-12)).item()
                assert err <= 1e-5, f"step {step}: {name} relative error {err:.2e}"
