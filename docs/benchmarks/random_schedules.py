"""Random schedules run against the simulator (docs/benchmarks/random_schedules.md): for each
model and seed, tests/test_random_schedules.py's random solver (a random part of what the
backward reads kept, a random variant in about half the places, the rest recomputed on demand;
with --cuts, a random live set from each of one to four random places in the backward on),
one step measured against the plan's prediction, then a second step adding into the gradients
in place, both against eager's gradients and buffers bitwise.

    .venv/bin/python docs/benchmarks/random_schedules.py [--cuts] [SEEDS] [MODEL,...]

SEEDS: a count (seeds from 0) or FIRST:END (seeds FIRST to END - 1). A MODEL "cov:NAME" is
monet_opt.bench_coverage's model NAME (its output summed).
"""
from __future__ import annotations

import copy
import random
import sys
import warnings
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[2]))  # PYTHONPATH first: a worktree

import monet_opt  # noqa: E402
from solvers import SolveResult, registry  # noqa: E402
from solvers.milp import MilpOptions  # noqa: E402
from solvers.ondemand import schedule_from_cuts  # noqa: E402
from tests import models  # noqa: E402
from tests.test_eager_kernels import CASES  # noqa: E402
from tests.test_executor import call  # noqa: E402
from tests.problems import as_result  # noqa: E402
from tests.test_random_schedules import _random_solver, random_variants  # noqa: E402
from tests.test_workspace_written_into import _MaskLast  # noqa: E402


def _case(name: str):
    def make():
        model, shape = CASES[name]()
        return model, torch.randn(shape), lambda out: out.sum()
    return make


FACTORIES = {f.__name__: f for f in (models.small_cnn, models.pool_cnn, models.mlp,
                                     models.silu_cnn, models.transformer_block,
                                     models.gpt2_tiny, models.bert_tiny,
                                     models.resnet18_small, models.mobilenet_v2_small)}
FACTORIES |= {"rnn": _case("rnn_tanh_dropout"), "gru": _case("gru_dropout"),
              "dropout_last": lambda: (_MaskLast("dropout"), torch.randn(16, 8),
                                       lambda out: out.sum())}


def _coverage(name: str):
    from monet_opt import bench_coverage

    def make():
        model, x = bench_coverage.build(name)
        return model, x, lambda out: out.float().sum()
    return make


def _cut_solver(seed: int):
    """Random variants as _random_solver's; from the backward's start and from one to four
    random places in it on, a random half of what the backward reads held alone (NOTE [Cuts
    where the schedule goes over] in solvers/lazy_cuts.py), the rest recomputed on demand."""
    def solve(problem, budget, _options) -> SolveResult:
        rng = random.Random(seed)
        chosen, reads = random_variants(problem, rng)
        n = len(problem.backward_ops)
        cuts = [0] + sorted(rng.sample(range(1, max(2, n)), min(rng.randint(1, 4),
                                                                 max(1, n - 1))))
        live = [frozenset(t for t in reads if rng.random() < 0.5) for _ in cuts]
        return as_result(problem, schedule_from_cuts(problem, cuts, live, chosen))
    return solve


def run(name: str, seed: int, cuts: bool = False) -> str:
    """One random schedule (the solver "milp" stands for it, and for every plan of the run's
    steps) against eager: a line saying how they compare."""
    solver = _cut_solver(seed) if cuts else _random_solver(seed)
    milp, registry._REGISTRY["milp"] = registry._REGISTRY["milp"], (solver, MilpOptions)
    try:
        return _run(name, seed)
    finally:  # the real MILP back for whatever the process solves next
        registry._REGISTRY["milp"] = milp


def _run(name: str, seed: int) -> str:
    torch.manual_seed(0)
    base, x, loss_fn = (_coverage(name[4:]) if name.startswith("cov:") else FACTORIES[name])()
    opt = monet_opt.optimize(copy.deepcopy(base), x, 1 << 40, solver="milp", profile_repeats=1,
                             profile_dir=None)
    resident = monet_opt.resident_tensors(opt.model, x)
    torch.manual_seed(1)
    measured = monet_opt.measure_peak(lambda: loss_fn(call(opt, x)).backward(), resident)
    predicted = opt.plan.predicted_peak_bytes
    torch.manual_seed(2)
    loss_fn(call(opt, x)).backward()
    eager = copy.deepcopy(base)
    for step in (1, 2):
        torch.manual_seed(step)
        loss_fn(call(eager, x)).backward()
    grads = [n for (n, p), q in zip(opt.model.named_parameters(), eager.parameters())
             if (p.grad is None) != (q.grad is None)
             or (p.grad is not None and not torch.equal(p.grad, q.grad))]
    bufs = [n for (n, b), c in zip(opt.model.named_buffers(), eager.buffers())
            if not torch.equal(b, c)]
    ok = 0 <= predicted - measured <= 8 and not grads and not bufs
    return (f"{'ok ' if ok else 'BAD'} {name} seed {seed}: predicted {predicted:,} B, measured "
            f"{measured:,} B ({measured - predicted:+,}), {opt.plan.recomputed_ops} op runs "
            f"recomputed, {len(opt.plan.variants)} variants, at {opt.plan.peak_op.split(',')[0]}"
            + (f"; gradients differ: {grads[:3]}" if grads else "")
            + (f"; buffers differ: {bufs[:3]}" if bufs else ""))


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    args = sys.argv[1:]
    cuts = "--cuts" in args
    args = [a for a in args if a != "--cuts"]
    first, _, end = (args[0] if args else "16").rpartition(":")
    seeds = range(int(first or 0), int(end))
    names = args[1].split(",") if len(args) > 1 else list(FACTORIES)
    bad = 0
    for name in names:
        for seed in seeds:
            try:
                line = run(name, seed, cuts)
            except Exception as e:  # a schedule the executor cannot run is a finding too
                line = f"ERR {name} seed {seed}: {type(e).__name__}: {str(e)[:200]}"
            bad += not line.startswith("ok")
            print(line, flush=True)
    print(f"{bad} of {len(seeds) * len(names)} disagree")
