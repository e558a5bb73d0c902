"""Dynamic padding: a GPT-2 optimized for its longest batch, then batches of other lengths, as
a collator padding to each batch's longest makes them: the first step at each length plans it
(ReplanWarning). Each length's first call (planning included) and its plan, with NOTE [Plans
for other shapes] and without it (the rule switched off: every step gets the whole
time_limit_s, no earlier plan offered), in one process, each after an optimize() of its own.

    python docs/benchmarks/new_lengths.py                  # GPT-2 narrow, 256 tokens, 60 % of peak
    python docs/benchmarks/new_lengths.py --tiny           # tests/models.py's GPT-2, 64 tokens

Run from the checkout's root (about four minutes each); figures in new_lengths.md."""
import sys
import time
import warnings
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # tests.models

import torch  # noqa: E402

import monet_opt  # noqa: E402
import solvers  # noqa: E402
from monet_opt import api, zoo  # noqa: E402
from solvers import remembered  # noqa: E402
from tests import models  # noqa: E402

rule = api.replanned
if "--tiny" in sys.argv:  # half its activations; the lengths as a shuffled epoch might bring
    torch.manual_seed(0)
    model, _, _ = models.gpt2_tiny()
    x = {"input_ids": torch.randint(3, 500, (4, 64))}
    limit, lengths = "50% of activations", [37, 12, 50, 29, 8, 45, 21, 33]
else:
    model, x = zoo.gpt2_narrow(batch=4, seq=256)
    p = monet_opt.lower_problem(model, x, profile_repeats=1)
    store_all = solvers.simulate(p, solvers.schedule_from_kept(p, p.saved_for_backward))
    limit, lengths = int(store_all.peak_bytes * 0.6), [240, 224, 192, 160, 128]
longest = x["input_ids"].shape[1]
print("| rule | tokens | first call, planning included (s) | predicted overhead | solver, "
      "solve time |\n|---|---|---|---|---|")
for mode in ("with", "without"):
    api.replanned = rule if mode == "with" else (lambda solver, problem, budget, s: (s, (), True))
    remembered._plans.clear()
    t = time.perf_counter()
    opt = monet_opt.optimize(model, x, limit, profile_dir=None)
    plan, total = opt.plan, 0.0
    print(f"| {mode} | {longest} (optimize()) | {time.perf_counter() - t:.1f} | "
          f"{plan.predicted_overhead:+.2%} | {plan.solver}, {plan.solve_time_s:.1f} s |",
          flush=True)
    for seq in lengths:
        xi = {k: v[:, :seq].contiguous() for k, v in x.items()}  # input_ids, attention_mask
        opt.zero_grad(set_to_none=True)
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt(**xi).logits.sum().backward() if "--tiny" in sys.argv else \
                opt(**xi).sum().backward()
        took = time.perf_counter() - t
        total += took
        plan = next(v for k, v in opt.plans.items() if f"x{seq}]" in k)
        print(f"| {mode} | {seq} | {took:.1f} | {plan.predicted_overhead:+.2%} | {plan.solver}, "
              f"{plan.solve_time_s:.1f} s |", flush=True)
    print(f"| {mode} | all {len(lengths)} new lengths | {total:.1f} | | |", flush=True)
