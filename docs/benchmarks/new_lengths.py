"""Dynamic padding: GPT-2 narrow optimized for batch 4 x 256 tokens at 60 % of its store-all
peak, then batches of other lengths, as a collator padding to each batch's longest makes them:
the first step at each length plans it (ReplanWarning). Each length's first call (planning
included) and its plan, with NOTE [Plans for other shapes] and without it (the rule switched
off: every step gets the whole time_limit_s, no earlier plan offered), in one process. Run from
the checkout's root: `python docs/benchmarks/new_lengths.py [LENGTHS] [with,without]` (about
four minutes); figures in new_lengths.md."""
import sys
import time
import warnings

import monet_opt
import solvers
from monet_opt import api, zoo
from solvers import remembered

rule = api.replanned
model, x = zoo.gpt2_narrow(batch=4, seq=256)
p = monet_opt.lower_problem(model, x, profile_repeats=1)
store_all = solvers.simulate(p, solvers.schedule_from_kept(p, p.saved_for_backward))
limit = int(store_all.peak_bytes * 0.6)
lengths = [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else \
    [240, 224, 192, 160, 128]
print("| rule | tokens | first call, planning included (s) | predicted overhead | solver, "
      "solve time |\n|---|---|---|---|---|")
for mode in sys.argv[2].split(",") if len(sys.argv) > 2 else ("with", "without"):
    api.replanned = rule if mode == "with" else (lambda solver, problem, budget, s: (s, ()))
    remembered._plans.clear()
    t = time.perf_counter()
    opt = monet_opt.optimize(model, x, limit, profile_dir=None)
    plan = opt.plan
    print(f"| {mode} | 256 (optimize()) | {time.perf_counter() - t:.1f} | "
          f"{plan.predicted_overhead:+.2%} | {plan.solver}, {plan.solve_time_s:.1f} s |",
          flush=True)
    for seq in lengths:
        xi = {k: v[:, :seq].contiguous() for k, v in x.items()}  # input_ids, attention_mask
        opt.zero_grad(set_to_none=True)
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt(**xi).sum().backward()
        took = time.perf_counter() - t
        plan = next(v for k, v in opt.plans.items() if f"x{seq}]" in k)
        print(f"| {mode} | {seq} | {took:.1f} | {plan.predicted_overhead:+.2%} | {plan.solver}, "
              f"{plan.solve_time_s:.1f} s |", flush=True)
