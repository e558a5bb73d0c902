"""Comparing training runs recorded as (one dict of tensors per step, the final state_dict)."""
from __future__ import annotations

import copy

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


def at_least_peak(model, sample, probe=None):
    """`model` optimized at the least peak an optimize() of `probe` (a copy of `model` unless
    given: a module that cannot be deep-copied) reports, and that limit. Both use the test's
    own profile directory, where the first keeps the schedule that reached its least peak, so
    the second meets that limit however its own time-limited search ends (NOTE [Least peaks
    remembered])."""
    import monet_opt
    probe = copy.deepcopy(model) if probe is None else probe
    least = monet_opt.optimize(probe, sample, 1 << 40, profile_repeats=1,
                               time_limit_s=5).plan.min_feasible_bytes
    return monet_opt.optimize(model, sample, least, profile_repeats=1, time_limit_s=5), least


def assert_same_grads(opt, model, eager, sample, steps: int, seeded: bool = False) -> None:
    """`steps` backward passes of `opt` (which trains `model`'s parameters) and of `eager`,
    each on `sample` (a tensor) and the module's loss, every gradient bitwise alike after each;
    each pair seeded alike where `seeded`."""
    for step in range(steps):
        for module in (opt, eager):
            if seeded:
                torch.manual_seed(step)
            module(sample).backward()
        for a, b in zip(model.parameters(), eager.parameters()):
            assert torch.equal(a.grad, b.grad), f"step {step}"
            a.grad = b.grad = None


def measured_peak_of(plan) -> int:
    """The peak a step of `plan` measures where the user's loss is a sum of the outputs: its
    prediction, less the loss scalar and its seed gradient (8 B) at the forward's steps, where
    the plan counts them though they are not yet made (NOTE [The loss scalar] in
    monet_opt/held_outputs.py)."""
    live, turn = plan.timeline.live_bytes, plan.timeline.backward_start
    return max(max(live[:turn], default=0) - 8, max(live[turn:], default=0))
