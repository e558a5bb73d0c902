"""What a tensor takes on its device (NOTE [CUDA blocks]: checked on CPU with fake CUDA
tensors), and the benchmarks' lowered problems kept in a file, so that a GPU machine profiles
and another solves."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import monet_opt
from monet_opt import bench_solvers
from monet_opt.lower import storage_bytes
from monet_opt.memory import CUDA_BLOCK, CUDA_LARGE, allocated_bytes, cuda_slack


@pytest.mark.parametrize("floats, cuda_bytes", [
    (0, 0), (1, 512), (128, 512), (129, 1024), (1 << 20, 4 << 20),
    ((1 << 20) + 1, (4 << 20) + 512)])
def test_cuda_tensors_take_the_allocators_blocks(floats, cuda_bytes):
    with FakeTensorMode():
        on_cuda, on_cpu = torch.empty(floats, device="cuda"), torch.empty(floats)
    assert storage_bytes(on_cuda) == cuda_bytes
    assert storage_bytes(on_cpu) == 4 * floats  # the live-bytes counter's exact bytes
    assert allocated_bytes(4 * floats, torch.device("cuda")) % CUDA_BLOCK == 0


def test_cuda_slack_counts_a_whole_large_block_only_where_one_can_be_handed_out():
    peak = 1000 * CUDA_LARGE
    assert cuda_slack(peak, CUDA_LARGE) == peak // 500  # small-pool tensors only
    assert cuda_slack(peak, CUDA_LARGE + 1) == CUDA_LARGE + peak // 500


def test_lowered_problems_are_read_back_from_their_file(tmp_path, monkeypatch):
    path = tmp_path / "problems.json.gz"
    first = bench_solvers.Lowerings()
    first.use("cpu", str(path))
    families = {"relu.bit_mask", "relu.bool_mask", "maxpool.shape_only"}
    problem, _, where = first.get("tiny_cnn", {"batch": 2}, {"variants": families})
    assert where.startswith("CPU") and path.exists()

    def no_lowering(*_a, **_k):
        raise AssertionError("lowered again, though the file holds the problem")

    monkeypatch.setattr(monet_opt, "lower_problem", no_lowering)
    again = bench_solvers.Lowerings()
    again.use("cpu", str(path))
    same = sorted(families, reverse=True)  # another order of the same set
    got, _, _ = again.get("tiny_cnn", {"batch": 2}, {"variants": set(same)})
    assert got.to_json() == problem.to_json()
    with pytest.raises(AssertionError, match="lowered again"):
        again.get("tiny_cnn", {"batch": 4}, {"variants": families})


def test_problem_files_match_default_options_and_keep_to_one_device(tmp_path, monkeypatch):
    """A problem lowered with lower_problem's defaults spelt out is the one asked for without
    them (bench_variants --lower-only writes allow_lossy=False; bench_solvers asks with no
    options), and a file of another device's problems is never added to from here."""
    path = tmp_path / "problems.json.gz"
    first = bench_solvers.Lowerings()
    first.use("cpu", str(path))
    problem, _, _ = first.get("tiny_cnn", {"batch": 2}, {"allow_lossy": False, "variants": True})
    monkeypatch.setattr(monet_opt, "lower_problem", lambda *a, **k: pytest.fail("lowered again"))
    again = bench_solvers.Lowerings()
    again.use("cpu", str(path))
    assert again.get("tiny_cnn", {"batch": 2}, {})[0].to_json() == problem.to_json()
    again.saved = {k: (p, s, "NVIDIA H200, torch 2.11") for k, (p, s, _) in again.saved.items()}
    with pytest.raises(SystemExit, match="would mix devices"):
        again.get("tiny_cnn", {"batch": 4}, {})


def test_a_frozen_weight_with_a_trainable_bias_is_counted():
    """NOTE [A weight gradient made unasked]: the CPU's convolution_backward makes the frozen
    weight's gradient when asked for the bias's; the step measured the weight's bytes over its
    prediction, and over the limit at the least plan."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(16 * 64, 4))
    model[2].weight.requires_grad_(False)
    x = torch.randn(2, 3, 8, 8)
    least = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1,
                               variants=False).plan.min_feasible_bytes
    opt = monet_opt.optimize(model, x, least, profile_dir=None, profile_repeats=1,
                             variants=False)
    peak = monet_opt.measure_peak(lambda: opt(x).sum().backward(),
                                  monet_opt.resident_tensors(model, x))
    assert peak <= opt.plan.predicted_peak_bytes <= least


class _Replacing(torch.nn.Module):
    """Keeps a 128 KiB state between calls and replaces it at each (as HF RecurrentGemma's
    recurrent states)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.state = torch.ones(32768)

    def step(self) -> None:
        self.state = None
        self.state = torch.ones(32768) * 2.0


def test_a_resident_tensor_the_step_lets_go_of_is_freed_in_it(monkeypatch):
    """measure_peak held the resident tensors through the step: the old state stayed alive,
    131,072 B over the step's own peak (w, the new state and its temporary). By the live-bytes
    counter; the allocation events see no free of a block made before their window."""
    from monet_opt import alloc_events
    monkeypatch.setenv(alloc_events.SWITCH, "0")
    module = _Replacing()
    # handed as a generator: once a frame-evaluation hook is installed (any torch.cond or
    # torch.compile earlier in the process, as under xdist), CPython keeps a call's arguments
    # alive on the caller's stack through the call, and the list would hold the old state
    resident = (t for t in monet_opt.resident_tensors(module))
    peak = monet_opt.measure_peak(module.step, resident)
    assert peak == 4 + 2 * 32768 * 4
