"""The main job, end to end: GPT-2 (12 layers, tied embeddings, dropout on) built from its config,
trained under a memory limit that halves its activation memory. Prints eager vs optimized
measured peak and step time, predicted vs measured peak, and how long a second optimize() takes
(it finds the profile and the schedule in the profile directory: a fresh temporary one, so the
first call really profiles and solves)."""
from __future__ import annotations

import copy
import statistics
import tempfile
import time
import warnings

import torch

import monet_opt
from monet_opt.bench.allocator import keep_freed_memory
from monet_opt.profiler import ProfileTimeLimitWarning
from monet_opt.units import format_bytes


def build_gpt2(batch: int = 4, seq: int = 256):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=12, n_embd=256, n_head=4, n_positions=seq, vocab_size=2048,
                     use_cache=False, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).train()
    ids = torch.randint(3, 2048, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids}


def loss_fn(out) -> torch.Tensor:
    return out.logits.sum()


def _step(module, x):
    loss_fn(module(**x)).backward()


def main(rounds: int = 9) -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    allocator = keep_freed_memory()  # NOTE [CPU allocator]: timings as a GPU's allocator gives
    model, x = build_gpt2()
    eager = copy.deepcopy(model)
    plan = _store_all_plan(model, x)
    limit = plan.fixed_bytes + plan.gradient_bytes + plan.store_all_activation_bytes // 2
    with tempfile.TemporaryDirectory(prefix="monet_opt-demo-") as profile_dir:
        t0 = time.perf_counter()
        opt = monet_opt.optimize(model, x, limit, profile_dir=profile_dir)
        first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = monet_opt.optimize(model, x, limit, profile_dir=profile_dir)
        second_s = time.perf_counter() - t0
    print(opt.plan.explain().split("\n\n")[0])
    peaks = {}
    for name, module, owner in (("eager", eager, eager), ("monet_opt", opt, model)):
        peaks[name] = monet_opt.measure_peak(lambda: _step(module, x),
                                             monet_opt.resident_tensors(owner, x))
        owner.zero_grad(set_to_none=True)
    times = {"eager": [], "monet_opt": []}
    for r in range(rounds + 1):
        order = [("eager", eager), ("monet_opt", opt)][:: 1 if r % 2 else -1]
        for name, module in order:
            start = time.perf_counter()
            _step(module, x)
            elapsed = time.perf_counter() - start
            if r:
                times[name].append(elapsed)
            (module.model if name == "monet_opt" else module).zero_grad(set_to_none=True)
    t_eager, t_opt = statistics.median(times["eager"]), statistics.median(times["monet_opt"])
    floor = plan.fixed_bytes + plan.gradient_bytes
    pred, meas = opt.plan.predicted_peak_bytes, peaks["monet_opt"]
    print(f"\nGPT-2 12x256, 4 heads, batch 4 x 256 tokens, vocab 2048, dropout 0.1, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU; {allocator}")
    print(f"first optimize() (trace, profile, solve): {first_s:.1f} s; second, from the profile "
          f"directory (trace only): {second_s:.1f} s = {second_s / first_s:.1%} of the first; "
          f"same plan: {again.plan == opt.plan}")
    print(f"{'':<12}{'measured peak':>16}{'above floor':>14}{'step (median)':>16}")
    for name, t in (("eager", t_eager), ("monet_opt", t_opt)):
        print(f"{name:<12}{format_bytes(peaks[name]):>16}"
              f"{format_bytes(peaks[name] - floor):>14}{t * 1e3:>13.0f} ms")
    print(f"memory limit {format_bytes(limit)} (activations halved); floor (params, buffers, "
          f"inputs, grads) {format_bytes(floor)}")
    print(f"activation memory: {(peaks['eager'] - floor) / max(1, meas - floor):.2f}x less; "
          f"step time {t_opt / t_eager - 1:+.1%} vs eager")
    print(f"predicted peak {pred} B, measured {meas} B, error {(pred - meas) / meas:+.3%}; "
          f"within limit: {meas <= limit}")


def _store_all_plan(model, x) -> monet_opt.Plan:
    """The plan without a limit, for its memory figures (fixed, gradients, store-all
    activations), which no op time changes: profiled under a tiny time limit (op times
    estimated), into no profile directory."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileTimeLimitWarning)
        return monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None,
                                  profile_time_limit_s=1e-3).plan


if __name__ == "__main__":
    main()
