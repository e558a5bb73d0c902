"""NOTE [Sharded models] (monet_opt/refusals.py): FullyShardedDataParallel wrapped around an
optimized module is not among its modules, and swaps its parameters for views of a flat shard
around each forward: with none registered the step ran the model itself (no plan: 92 % over
its limit on two ranks), with use_orig_params=True the plan ran with its shards uncounted, both
silently. Refused at the call now, as fully_shard is. One gloo process."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

import monet_opt
from tests.test_ddp import _free_port


@pytest.fixture
def world():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("orig", [False, True])
def test_fsdp_around_an_optimized_module_is_refused(world, orig):
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1)), torch.randn(4, 8)
    opt = monet_opt.optimize(model, x, 1 << 30, profile_dir=None, profile_repeats=1)
    wrapped = FullyShardedDataParallel(opt, device_id=torch.device("cpu"), use_orig_params=orig)
    with pytest.raises(TypeError, match="FullyShardedDataParallel wrapped around the optimized "
                       "module.*DistributedDataParallel"):
        wrapped(x)
