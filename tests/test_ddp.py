"""An optimized module under DistributedDataParallel (two CPU processes, gloo) trains exactly
like the plain model under DDP: the same all-reduced gradients, parameters and BatchNorm
statistics after every step, bitwise, each step accumulating two micro-batches, the first
under no_sync() (NOTE [Accumulating in place])."""
from __future__ import annotations

import copy
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import monet_opt
from tests import models

WORLD = 2
STEPS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _steps(module, params_owner, x, rank: int) -> list[dict[str, torch.Tensor]]:
    opt = torch.optim.SGD(params_owner.parameters(), lr=0.05, momentum=0.9)
    record = []
    for step in range(STEPS):
        torch.manual_seed(100 * rank + step)  # each rank its own dropout masks
        with module.no_sync():  # a first micro-batch: gradients stay local
            module(x.flip(0)).sum().backward()
        module(x).sum().backward()  # the second adds into them, then all-reduces
        record.append({f"grad {n}": p.grad.clone() for n, p in params_owner.named_parameters()})
        opt.step()
        opt.zero_grad(set_to_none=True)
    record.append({k: v.clone() for k, v in params_owner.state_dict().items()})
    return record


def _worker(rank: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        base, _, _ = models.small_cnn()
        torch.manual_seed(1 + rank)  # each rank its own batch
        x = torch.randn(4, 3, 16, 16)
        plain = copy.deepcopy(base)
        eager = _steps(DDP(plain, gradient_as_bucket_view=True), plain, x, rank)
        model = copy.deepcopy(base)
        profile_dir = os.path.join(folder, "profiles")
        probe = monet_opt.optimize(copy.deepcopy(base), x, 1 << 40, profile_repeats=1,
                                   profile_dir=profile_dir)
        plan = probe.plan
        # halfway from the least peak to store-all's (NOTE [Limits between the least peak and
        # store-all] in tests/limits.py)
        limit = (plan.min_feasible_bytes + plan.store_all_peak_bytes) // 2
        opt = monet_opt.optimize(model, x, limit, profile_repeats=1, time_limit_s=5,
                                 profile_dir=profile_dir)
        ours = _steps(DDP(opt, gradient_as_bucket_view=True), model, x, rank)
        torch.save((eager, ours, opt.plan.recomputed_ops), os.path.join(folder, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_optimized_module_trains_like_the_model_under_ddp(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD)
    results = {rank: torch.load(tmp_path / f"{rank}.pt") for rank in range(WORLD)}
    grads = []
    for rank in range(WORLD):
        eager, ours, recomputed = results[rank]
        assert recomputed > 0, f"rank {rank}: the plan halfway to store-all recomputes nothing"
        for step, (want, got) in enumerate(zip(eager, ours)):
            assert want.keys() == got.keys()
            for k in want:
                assert torch.equal(want[k], got[k]), f"rank {rank}, step {step}: {k} differs"
        grads.append(ours[0])
    # DDP averaged the gradients: every rank holds the same, though their batches differ
    assert all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])


def test_names_ddp_leaves_out_are_the_optimized_modules():
    """NOTE [DDP's names to ignore]: DDP matches its module's names; set on the model, or on
    the optimized module in the model's names, nothing matched "model."-prefixed names and
    each rank's own parameters were averaged across ranks, silently."""
    base, x, _ = models.small_cnn()
    names = [n for n, _ in base.named_parameters()][:2]
    DDP._set_params_and_buffers_to_ignore_for_model(base, names)
    opt = monet_opt.optimize(base, x, 1 << 40, profile_dir=None, profile_repeats=1)
    ours = {n for n, _ in opt.named_parameters()}
    assert set(opt._ddp_params_and_buffers_to_ignore) == {f"model.{n}" for n in names} <= ours
    DDP._set_params_and_buffers_to_ignore_for_model(opt, names[:1])  # the model's names
    assert set(opt._ddp_params_and_buffers_to_ignore) == {f"model.{names[0]}"}
    DDP._set_params_and_buffers_to_ignore_for_model(opt, [f"model.{names[1]}"])  # the wrapper's
    assert base._ddp_params_and_buffers_to_ignore == [names[1]]
    assert "_ddp_params_and_buffers_to_ignore" not in vars(opt)
