"""NOTE [Buffers the pass reads] (monet_opt/pass_inputs.py): the profiling pass reads a buffer
alone on its storage as it is, and a plan keeps nothing of the tensors it was traced on."""
from __future__ import annotations

import copy
import gc
import weakref

import torch

import monet_opt
from monet_opt.pass_inputs import pass_copies, written


class _Projected(torch.nn.Module):
    """Two Linears behind a 256 KiB buffer the forward reads."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(256, 256), torch.nn.Linear(256, 10)
        self.register_buffer("proj", torch.randn(256, 256) / 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x @ self.proj)))


def test_planning_holds_the_limit_beside_a_large_buffer_and_keeps_no_batch():
    """Each plan's pass ran on a clone of the buffer beside it and, held to the least peak from
    sizes, passed the limit by the buffer's bytes: optimize() and the first step of each new
    batch size (1,259,368 B under 1,070,000); each plan kept that clone and its batch alive
    for good (recipe probe, 2026-12-06)."""
    torch.manual_seed(0)
    model, x = _Projected(), torch.randn(64, 256)
    full = monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None,
                              time_limit_s=5)
    limit = full.plan.min_feasible_bytes + 65536  # reachable; less than the least + the buffer
    made = []
    peak = monet_opt.measure_peak(lambda: made.append(monet_opt.optimize(
        model, x, limit, profile_dir=None, time_limit_s=5)), monet_opt.resident_tensors(model, x))
    assert peak <= limit
    opt = made.pop()
    for batch in (60, 48):
        gone = _step_gone(opt, model, torch.randn(batch, 256), limit)
        gc.collect()
        assert gone() is None


def _step_gone(opt, model, batch, limit) -> weakref.ref:
    """One step on `batch`, planned within `limit` and run; a reference to the batch."""
    peak = monet_opt.measure_peak(lambda: opt(batch).sum().backward(),
                                  monet_opt.resident_tensors(model, batch))
    assert peak <= limit  # planned within it, then run
    model.zero_grad(set_to_none=True)
    return weakref.ref(batch)


def test_only_buffers_laid_out_otherwise_are_copied():
    table = torch.randn(10, 4)
    alone, slice_, strided, shared = torch.randn(3), table[:2], torch.randn(4, 3).t(), \
        torch.randn(5)
    leaf = torch.randn(2, requires_grad=True)  # its clone: not a leaf
    copies = pass_copies([alone, slice_, strided, shared, leaf], others=[shared[:]])
    assert copies[0] is alone
    assert all(c is not t and torch.equal(c, t) for c, t in
               zip(copies[1:4], (slice_, strided, shared)))
    assert copies[4] is not leaf


def test_the_pass_copies_a_placeholder_a_graph_writes_into():
    """What a graph writes into, directly or through a view, is run on a copy (none of the
    graphs AOTAutograd traces does; the pass also checks by version counters)."""
    graph = torch.fx.Graph()
    x, y, z = (graph.placeholder(name) for name in ("x", "y", "z"))
    aten = torch.ops.aten
    graph.call_function(aten.add_.Tensor, (x, 1))
    flat = graph.call_function(aten.view.default, (y, [-1]))
    graph.call_function(aten.mul_.Tensor, (flat, 2))
    graph.output(graph.call_function(aten.add.Tensor, (z, 1)))
    assert written(torch.fx.GraphModule(torch.nn.Module(), graph)) == {"x", "y"}
