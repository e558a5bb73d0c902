"""NOTE [Direct calls]: the step's graphs call each ATen op's C++ entry, not OpOverload's
Python, and hold no detaches but those they return; results are unchanged."""
from __future__ import annotations

import copy
import operator

import torch
import torch.fx as fx

import monet_opt
from monet_opt import direct_calls, rewrite
from tests import models
from tests.test_executor import HUGE

aten = torch.ops.aten


def _graph() -> fx.GraphModule:
    """relu, detach(detach(relu)) * 2, and a detach it returns, as AOTAutograd writes them."""
    g = fx.Graph()
    x = g.placeholder("x")
    r = g.call_function(aten.relu.default, (x,))
    kept = g.call_function(aten.detach.default, (g.call_function(aten.detach.default, (r,)),))
    g.output((g.call_function(aten.mul.Tensor, (kept, 2.0)),
              g.call_function(aten.detach.default, (r,))))
    return fx.GraphModule(torch.nn.Module(), g)


def test_the_code_calls_the_ops_entries_and_drops_the_detaches_it_does_not_return():
    gm = _graph()
    x = torch.randn(3, 4)
    want = gm(x)
    assert direct_calls.drop_detaches(gm) == 2  # the returned one stays
    gm.graph.set_codegen(direct_calls.DirectCodeGen())
    gm.recompile()
    assert "torch.ops." not in gm.code and gm.code.count("_op_aten_detach_default(") == 1
    assert gm.forward.__globals__["_op_aten_relu_default"] is aten.relu.default._op
    args = [x]
    got = gm(args)
    assert args == []  # the boxed convention: the graph takes a list and clears it
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_only_aten_overloads_without_a_python_dispatcher_are_called_directly():
    assert direct_calls.direct(aten.add.Tensor)
    assert not direct_calls.direct(operator.getitem)
    assert not direct_calls.direct(aten.add)  # the packet, not an overload
    assert not direct_calls.direct(direct_calls.drop_detaches)


def test_an_optimized_step_runs_such_code_and_trains_as_eager(monkeypatch):
    made = []
    partition = rewrite.partition
    monkeypatch.setattr(rewrite, "partition", lambda *a, **k: made.append(
        partition(*a, **k)) or made[-1])
    torch.manual_seed(0)
    base, x, loss_fn = models.small_cnn()
    eager = copy.deepcopy(base)
    optimized = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1)
    fw, bw = made[-1]
    code = fw.code + bw.code
    assert "torch.ops." not in code and "detach" not in code and "_op_aten_" in code
    for model in (eager, optimized):
        torch.manual_seed(1)
        loss_fn(model(x)).backward()
    for (name, p), q in zip(eager.named_parameters(), optimized.model.parameters()):
        assert torch.equal(p.grad, q.grad), name
