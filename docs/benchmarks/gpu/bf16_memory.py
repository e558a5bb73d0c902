"""Where GPT-2's least plan under bfloat16 autocast goes over its limit on CUDA (the xfail in
tests/test_cuda.py: 60.7 KB over 1.11 MB on an H200, 2026-11-26). Run by next_run.sh from the
checkout's root. Prints the plan, its predicted peak and the op it is predicted at, the
measured peak, and the blocks alive at the measured peak (from the caching allocator's trace),
largest first, each with the first frames that allocated it; then the same for float32, whose
plan stays within its limit, for comparison."""
from __future__ import annotations

import copy
import sys

import torch

import monet_opt
from tests import models
from tests.test_executor import HUGE, call


def _frames(entry) -> str:
    keep = [f for f in entry.get("frames", ()) if "monet_opt" in f["filename"]
            or "tests/" in f["filename"] or "functorch" in f["filename"]
            or f["filename"].startswith("<eval_with_key")]
    return " <- ".join(f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}"
                       for f in keep[:3]) or "?"


def live_at_peak(trace: list[dict]) -> tuple[int, int, list[tuple[int, int | None, dict]]]:
    """The allocator's trace replayed: the largest total of live blocks, the event index where
    it was reached, and those blocks as (index allocated, index freed or None, event)."""
    live: dict[int, tuple[int, dict]] = {}
    total = best = best_at = 0
    best_live: list[tuple[int, dict]] = []
    freed: dict[int, int] = {}
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = (i, e)
            total += e["size"]
            if total > best:
                best, best_at, best_live = total, i, list(live.values())
        elif e["action"] == "free_requested" and e["addr"] in live:
            made, _ = live.pop(e["addr"])
            freed[made] = i
            total -= trace[made]["size"]
    return best, best_at, [(made, freed.get(made), e) for made, e in best_live]


def one(dtype: torch.dtype | None) -> None:
    torch.manual_seed(0)
    base, x, loss_fn = models.gpt2_tiny(dropout=0.0)
    base = base.cuda().train()
    x = {k: v.cuda() for k, v in x.items()}
    cast = torch.autocast("cuda", dtype=dtype) if dtype else torch.autocast("cuda", enabled=False)
    with cast:
        full = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1,
                                  profile_dir=None)
        limit = full.plan.min_feasible_bytes
        try:
            monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1,
                               profile_dir=None, time_limit_s=10)
        except monet_opt.InfeasibleBudgetError as e:  # a shorter solve's least is higher
            limit = e.min_feasible_bytes
        least = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1,
                                   profile_dir=None, time_limit_s=10)
        print(least.plan.explain())
        tl = least.plan.timeline
        if tl is not None:
            k = max(range(len(tl.live_bytes)), key=tl.live_bytes.__getitem__)
            phase = "backward" if k >= tl.backward_start else "forward"
            print(f"predicted peak {least.plan.predicted_peak_bytes} B at run {k} of "
                  f"{len(tl.live_bytes)} ({phase}); limit {limit} B")

        def step():
            loss_fn(call(least, x)).backward()

        step()
        least.model.zero_grad(set_to_none=True)
        resident = monet_opt.resident_tensors(least.model, x)
        measured = monet_opt.measure_peak(step, resident)
        least.model.zero_grad(set_to_none=True)
        print("measured peak", measured, "over the limit by", measured - limit,
              "resident", sum(t.untyped_storage().nbytes() for t in resident))
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=200_000)
        step()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        least.model.zero_grad(set_to_none=True)
    trace = snap["device_traces"][torch.cuda.current_device()]
    best, best_at, blocks = live_at_peak(trace)
    print(f"allocator trace: {len(trace)} events; the step's own blocks at their peak: {best} B "
          f"at event {best_at}")
    for made, freed, e in sorted(blocks, key=lambda b: -b[2]["size"])[:25]:
        print(f"  {e['size']:>9} B  made at event {made}, freed at {freed}  {_frames(e)}")


if __name__ == "__main__":
    for dtype in (torch.bfloat16, None):
        print(f"\n===== GPT-2 tiny, least plan, autocast {dtype} =====")
        one(dtype)
    sys.stdout.flush()
