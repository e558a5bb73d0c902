"""monet_opt.aot_call: a compiled step called with its flat arguments as aot_function calls its
cache (NOTE [Arguments flattened once])."""
import torch
from functorch.compile import make_boxed_func
from torch._functorch.aot_autograd import aot_function

import monet_opt
from monet_opt.aot_call import FlatCall
from tests.models import SmallCNN


def _boxed(gm, _inputs):
    return make_boxed_func(gm)


def _refused(*args):
    raise AssertionError("aot_function called where its cache should have been")


def test_the_cache_is_called_with_the_same_results():
    def f(w, x, scale):
        return {"y": (x @ w).relu() * scale, "n": x.sum()}

    compiled = aot_function(f, fw_compiler=_boxed, bw_compiler=_boxed)
    call = FlatCall(compiled)
    w = torch.randn(4, 3, requires_grad=True)
    x, scale = torch.randn(2, 4), torch.tensor(2.0)
    first = call(w, x, scale)  # compiles through aot_function
    assert call._cache() is not None, "this torch keeps aot_function's cache elsewhere"
    call._compiled = _refused
    again = call(w, x, scale)
    expected = f(w, x, scale)
    for out in (first, again):
        assert set(out) == {"y", "n"}
        assert torch.equal(out["y"], expected["y"]) and torch.equal(out["n"], expected["n"])
    grad, = torch.autograd.grad(again["y"].sum(), w)
    assert torch.equal(grad, torch.autograd.grad(expected["y"].sum(), w)[0])


def test_a_none_argument_goes_through_aot_function():
    """pytree drops a None, which the cache's flat list would not: aot_function is called."""
    compiled = aot_function(lambda x, nothing: x * 2, fw_compiler=_boxed, bw_compiler=_boxed)
    call = FlatCall(compiled)
    x = torch.randn(3, requires_grad=True)
    assert torch.equal(call(x, None), x * 2)
    assert torch.equal(call(x, None), x * 2)


def test_an_optimized_step_calls_the_cache():
    model, x = SmallCNN(), torch.randn(4, 3, 16, 16)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, time_limit_s=5)
    torch.manual_seed(0)
    expected = model(x).sum()
    expected.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    opt._first.run._compiled._compiled = _refused  # the cache alone
    torch.manual_seed(0)
    got = opt(x).sum()
    got.backward()
    assert torch.equal(got, expected)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
