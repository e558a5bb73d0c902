"""The demo's GPT-2 at half its activations, trained by HF's custom loop, which holds the
outputs (the logits) through the backward: outputs = opt(**batch); outputs.loss.backward().
Three steps: each one's measured peak against the memory limit and the plan in use (NOTE
[Outputs held through the backward] in monet_opt/held_outputs.py).

    .venv/bin/python docs/benchmarks/held_outputs.py
"""
import tempfile
import warnings

import torch

import monet_opt
from monet_opt.bench.allocator import keep_freed_memory
from monet_opt.demo import _store_all_plan, build_gpt2

torch.set_num_threads(2)
keep_freed_memory()  # NOTE [CPU allocator], as the demo measures
model, x = build_gpt2()
x = {**x, "labels": x["input_ids"]}
plan = _store_all_plan(model, x)
limit = plan.fixed_bytes + plan.gradient_bytes + plan.store_all_activation_bytes // 2
opt = monet_opt.optimize(model, x, limit, profile_dir=tempfile.mkdtemp())
logits = opt(**x).logits
print(f"limit {limit:,} B; logits {logits.untyped_storage().nbytes():,} B")
del logits
model.zero_grad(set_to_none=True)
for k in range(3):
    def step():
        outputs = opt(**x)
        outputs.loss.backward()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        peak = monet_opt.measure_peak(step, monet_opt.resident_tensors(model, x))
    model.zero_grad(set_to_none=True)
    used = list(opt.plans.values())[-1]
    print(f"step {k + 1}: measured {peak:,} B ({peak - limit:+,} B against the limit); plan "
          f"in use predicted {used.predicted_peak_bytes:,} B; "
          f"warnings {[w.category.__name__ for w in seen]}")
