"""The profiled scheduling problem: the lowered one with each op's and variant's measured
costs."""
from __future__ import annotations

import dataclasses
import warnings

import torch

import solvers
from monet_opt.families import acceptable
from monet_opt.held_outputs import loss_bytes
from monet_opt.lower import Lowered
from monet_opt.lower_variants import with_costs
from monet_opt.memory import with_cuda_slack
from monet_opt.op_costs import measured_ops
from monet_opt.profiler import profile
from solvers.variants import useless as useless_variants


def measured_problem(joint, lowered: Lowered, primals: list[torch.Tensor], repeats: int,
                     allow_lossy: bool = False, time_limit_s: float | None = None,
                     memory_limit: int | None = None) -> solvers.Problem:
    """`lowered.problem` with each op's and variant's measured costs, outputs' bytes (NOTE
    [Outputs larger than their shapes]) and the loss scalars' bytes. A variant not bitwise the
    op's is withdrawn (warning) unless its family is lossy, lossy ones are allowed and it is
    within the family's bound; so is one the time limit left unmeasured (the profiler warns)."""
    measured = profile(joint, lowered, primals, repeats, time_limit_s, memory_limit)
    lowered = measured_ops(lowered, measured, joint)
    problem = with_costs(lowered, measured.variant_costs).problem if lowered.variant_sites \
        else lowered.problem
    useless = useless_variants(problem)  # NOTE [Variants that cannot pay]
    exact = [measured.variant_measured[v] and acceptable(site, err, allow_lossy)
             and v not in useless
             for v, (site, err) in enumerate(zip(lowered.variant_sites,
                                                 measured.variant_error))]
    if not all(exact):
        bad = [problem.variants[v].name for v, ok in enumerate(exact) if not ok and
               measured.variant_measured[v] and v not in useless]
        if bad:
            warnings.warn(f"monet_opt: {len(bad)} operator variant(s) did not reproduce the "
                          f"op's result (bitwise, or within a lossy family's bound) on this "
                          f"device and are not used: {bad[:3]}", RuntimeWarning, stacklevel=2)
        problem = problem.only_variants({v for v, ok in enumerate(exact) if ok})
    problem = dataclasses.replace(problem, fixed_bytes=problem.fixed_bytes + loss_bytes(joint))
    return with_cuda_slack(problem, primals)  # NOTE [CUDA blocks]

