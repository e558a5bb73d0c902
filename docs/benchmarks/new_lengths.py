"""Dynamic padding: GPT-2 narrow optimized for batch 4 x 256 tokens at 60 % of its store-all
peak, then batches of other lengths, as a collator padding to each batch's longest makes them:
the first step at each length plans it (ReplanWarning); time of that first call. Run from
the checkout's root: `python docs/benchmarks/new_lengths.py` (about three minutes); figures in
close_enough.md."""
import time
import warnings

import monet_opt
import solvers
from monet_opt import zoo

model, x = zoo.gpt2_narrow(batch=4, seq=256)
p = monet_opt.lower_problem(model, x, profile_repeats=1)
store_all = solvers.simulate(p, solvers.schedule_from_kept(p, p.saved_for_backward))
limit = int(store_all.peak_bytes * 0.6)
t = time.perf_counter()
opt = monet_opt.optimize(model, x, limit, profile_dir=None)
print("| tokens | first call, planning included (s) |\n|---|---|")
print(f"| 256 (optimize()) | {time.perf_counter() - t:.1f} |")
for seq in (240, 224, 192, 160, 128):
    xi = {k: v[:, :seq].contiguous() for k, v in x.items()}  # input_ids, attention_mask
    opt.zero_grad(set_to_none=True)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt(**xi).sum().backward()
    print(f"| {seq} | {time.perf_counter() - t:.1f} |", flush=True)
