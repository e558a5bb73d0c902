"""The public contract: inputs accepted and refused, errors that say what to do, state left
alone, and the module behaving like the model outside training steps."""
from __future__ import annotations

import copy
import inspect
import math
import warnings

import pytest
import torch
from torch import nn

import monet_opt
from monet_opt.units import format_bytes
from tests import models

HUGE = 1 << 40


@pytest.mark.parametrize("text, expected", [
    (1234, 1234), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), ("300 MiB", 300 * 2**20),
    ("2GiB", 2 * 2**30), ("4096", 4096), ("1e3KB", 10**6), (2.0**20, 2**20), ("1e3", 1000),
    ("2.0", 2),
    # exactly: as floats, 2,009,999 B and 9007199254740992
    ("2.01MB", 2_010_000), ("8.03MB", 8_030_000), ("9007199254740993", 9007199254740993),
    ("8gb", 8 * 10**9), ("100b", 100), ("2kB", 2000),  # all small, or SI's small k: bytes
])
def test_memory_limit_forms(text, expected):
    assert monet_opt.parse_memory_limit(text) == expected


@pytest.mark.parametrize("bad", [0, -5, math.nan, math.inf, "lots", "", "12 parsecs", "-1GB",
                                 None, True, [1], 1.5, "1.5", "0.5B",  # "1.5" was 1 B
                                 "1e400", "1e999999999"])  # Decimal's overflow, uncaught
def test_memory_limit_rejects(bad):
    with pytest.raises(ValueError, match="512MiB"):
        monet_opt.parse_memory_limit(bad)


@pytest.mark.parametrize("bits", ["8Gb", "512Mb", "2Mib", "1 Tb"])
def test_memory_limit_in_bits_is_refused(bits):  # "8Gb" was read as 8 GB
    with pytest.raises(ValueError, match="reads as bits.*B' for bytes"):
        monet_opt.parse_memory_limit(bits)


def test_optimize_rejects_bad_limit_and_solver():
    model, x, _ = models.small_cnn()
    with pytest.raises(ValueError, match="memory_limit"):
        monet_opt.optimize(model, x, "lots")
    with pytest.raises(ValueError, match="unknown solver 'gurobi'.*'chen'.*'checkmate'"):
        monet_opt.optimize(model, x, HUGE, solver="gurobi")
    with pytest.raises(TypeError, match="sample_input"):
        monet_opt.optimize(model, "an image", HUGE)


class Detached(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x).detach()


def test_a_step_without_backward_is_refused_saying_why():
    """Gradients off, nothing requiring grad, outputs that need none: each says what to do
    (before, an internal error 'the partition function was never called'); nothing changes."""
    model, x, _ = models.small_cnn()
    before = copy.deepcopy(model.state_dict())
    for off in (torch.no_grad, torch.inference_mode):
        with off(), pytest.raises(monet_opt.NoBackwardError, match="gradients are off.*outside"):
            monet_opt.optimize(model, x, HUGE, profile_dir=None)
    frozen = copy.deepcopy(model).requires_grad_(False)
    with pytest.raises(monet_opt.NoBackwardError, match="no parameter of .* requires grad"):
        monet_opt.optimize(frozen, x, HUGE, profile_dir=None)
    with pytest.raises(monet_opt.NoBackwardError, match="no output of Detached"):
        monet_opt.optimize(Detached(), torch.randn(4, 8), HUGE, profile_dir=None)
    with pytest.raises(TypeError, match="must be a torch.nn.Module, got function"):
        monet_opt.optimize(lambda t: t * 2, x, HUGE, profile_dir=None)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # an input that requires grad is enough to have a backward
    opt = monet_opt.optimize(frozen, x.clone().requires_grad_(), HUGE, profile_dir=None)
    assert opt.plan.predicted_peak_bytes > 0


def test_infeasible_budget_error_states_both_numbers():
    model, x, _ = models.small_cnn()
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
        monet_opt.optimize(model, x, 1000, profile_repeats=1)
    err = info.value
    assert err.memory_limit_bytes == 1000
    assert isinstance(err.min_feasible_bytes, int) and err.min_feasible_bytes > 1000
    assert "1000 B" in str(err) and f"{err.min_feasible_bytes} B" in str(err)
    # the figure it states is reachable
    opt = monet_opt.optimize(model, x, err.min_feasible_bytes, profile_repeats=1)
    assert opt.plan.predicted_peak_bytes <= err.min_feasible_bytes


def test_infeasible_budget_error_tells_proven_from_not_found():
    """NOTE [Proven or not found]: under the step's sizes bound no plan can fit, and the error
    says so; between it and the least peak reached a longer solve may find one."""
    model, x, _ = models.small_cnn()
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
        monet_opt.optimize(model, x, 1000, profile_repeats=1)
    err = info.value
    bound = err.lower_bound_bytes
    assert err.proven and 1000 < bound <= err.min_feasible_bytes
    assert "the step's sizes alone need" in str(err) and f"({bound} B)" in str(err)
    assert "time_limit_s" not in str(err)
    # the least peak reached is not said to be the least there is (a limit under it can fit)
    assert "to at least" not in str(err) and "the least peak this solve reached" in str(err)
    if bound == err.min_feasible_bytes:
        pytest.skip("the least peak reached is the sizes bound: nothing lies between")
    between = (bound + err.min_feasible_bytes) // 2
    try:
        opt = monet_opt.optimize(model, x, between, profile_repeats=1, time_limit_s=2)
    except monet_opt.InfeasibleBudgetError as caught:
        err = caught
    else:  # the probes found one in their time: what the error said may exist, does
        assert bound <= opt.plan.predicted_peak_bytes <= between
        return
    assert not err.proven and err.lower_bound_bytes == bound and "time_limit_s=2" in str(err)
    assert ("a longer one would find none" if err.searched else "a plan between may exist") \
        in str(err)
    assert f"at least {format_bytes(err.min_feasible_bytes)}" in str(err)


def test_a_solve_that_ended_early_does_not_ask_for_a_longer_one():
    """The probes met their bound in under a second, and the error said a solve longer than
    120 s may find a plan: at 10, 120 and 300 s each ended at the same least peak."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Dropout(0.1), nn.Linear(512, 512),
                          nn.GELU(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 10))
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:  # between bound and least
        monet_opt.optimize(model, torch.randn(1024, 256), 11_000_000, profile_dir=None,
                           profile_repeats=1, time_limit_s=120)
    err = info.value
    assert not err.proven and err.lower_bound_bytes < 11_000_000 < err.min_feasible_bytes
    assert err.searched and "a longer one would find none" in str(err)


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # Python control flow on a tensor value: cannot be traced
            return self.lin(x)
        return -self.lin(x)


def test_untraceable_model_names_the_line():
    with pytest.raises(monet_opt.CaptureError, match=r"test_api.py:\d+: if x.sum\(\) > 0"):
        monet_opt.optimize(DataDependent(), torch.randn(2, 4), HUGE)


def test_second_capture_takes_the_route_that_worked(monkeypatch):
    """NOTE [The capture route]: GPT-2's masking reads a mask's values, so the direct trace
    fails and the trace with torch.compiler.is_compiling() true succeeds; a second optimize()
    of it goes straight there. The flag is down again once optimize() returns."""
    from monet_opt import capture
    model, x, _ = models.gpt2_tiny()
    routes = []
    compile_step = capture.compile_step

    def counting(model, spec, partition_fn, export_example=None, *more):
        routes.append("export" if export_example is not None else
                      "as compiling" if torch.compiler.is_compiling() else "direct")
        return compile_step(model, spec, partition_fn, export_example, *more)

    monkeypatch.setattr(capture, "compile_step", counting)
    monkeypatch.setattr(capture, "_ROUTE", {})
    monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    assert routes == ["direct", "as compiling"]
    assert not torch.compiler.is_compiling()
    routes.clear()
    monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None)
    assert routes == ["as compiling"]


@pytest.mark.parametrize("route", ["as compiling", "export"])
def test_every_capture_route_trains_like_eager(monkeypatch, route):
    """Each route that traces GPT-2 gives a module whose steps match eager's (the direct trace
    cannot: its masking reads a mask's values)."""
    from monet_opt import capture
    from tests.test_executor import assert_same, run_steps
    monkeypatch.setattr(capture, "ROUTES", (route,))
    monkeypatch.setattr(capture, "_ROUTE", {})
    base, x, loss_fn = models.gpt2_tiny()
    base.train()
    opt = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, profile_dir=None)
    eager = copy.deepcopy(base)
    assert_same(run_steps(opt, opt.model, x, loss_fn), run_steps(eager, eager, x, loss_fn),
                exact=False, what=f"{route} route vs eager")


def test_optimize_compiles_without_running_the_step(monkeypatch):
    """NOTE [Compiling, not running]: optimize() builds the compiled step without running its
    forward graph (not even on fake tensors); the real steps after it run the compiled graphs
    and match eager's."""
    from monet_opt import capture
    from tests.test_executor import assert_same, run_steps
    runs = []
    boxed = capture._boxed

    def counting(gm):
        run = boxed(gm)

        def counted(args):
            out = run(args)  # raises _Compiled on the call that only compiles
            runs.append(len(out))
            return out
        counted._boxed_call = True
        return counted

    monkeypatch.setattr(capture, "_boxed", counting)
    base, x, loss_fn = models.small_cnn()
    opt = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, profile_dir=None)
    assert runs == []
    eager = copy.deepcopy(base)
    assert_same(run_steps(opt, opt.model, x, loss_fn), run_steps(eager, eager, x, loss_fn),
                exact=True, what="first steps after a compile that ran nothing")
    assert len(runs) >= 2  # forward and backward graphs, per step


def test_optimize_leaves_model_state_and_rng_alone():
    torch.manual_seed(0)
    model, x, _ = models.small_cnn()
    before = copy.deepcopy(model.state_dict())
    torch.manual_seed(42)
    rng = torch.get_rng_state()
    monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    assert torch.equal(torch.get_rng_state(), rng)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())


def test_eval_and_no_grad_run_the_model_itself():
    torch.manual_seed(0)
    model, x, _ = models.small_cnn()
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    opt.eval()
    assert not model.training
    y = opt(x[:1])  # any shape: nothing is planned in eval mode
    assert torch.equal(y, model(x[:1]))
    opt.train()
    with torch.no_grad():
        before = model.stem[1].running_mean.clone()
        y = opt(x)
        assert not y.requires_grad
        assert not torch.equal(before, model.stem[1].running_mean)  # a train-mode forward


class PositionalOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, /, scale=1.0, *rest, **options):
        return self.lin(x) * scale


def test_forward_has_the_models_signature():
    """NOTE [The model's signature]: on the instance and on the class (with self first), for a
    forward with positional-only, variadic and keyword parameters too; the step still runs."""
    model, x = PositionalOnly(), torch.randn(2, 4)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1, profile_dir=None,
                             time_limit_s=1)
    assert inspect.signature(opt.forward) == inspect.signature(model.forward)
    assert str(inspect.signature(type(opt).forward)) == "(self, x, /, scale=1.0, *rest, **options)"
    opt(x).sum().backward()
    assert model.lin.weight.grad is not None


def test_shares_parameters_and_state_dict_keys():
    model, x, _ = models.small_cnn()
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    assert {id(p) for p in opt.parameters()} == {id(p) for p in model.parameters()}
    assert opt.state_dict().keys() == model.state_dict().keys()
    opt.load_state_dict(copy.deepcopy(model.state_dict()))


def _grads_match(opt_module, model, ref, call, loss_fn):
    torch.manual_seed(3)
    loss_fn(call(opt_module)).backward()
    torch.manual_seed(3)
    loss_fn(call(ref)).backward()
    named_ref = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        q = named_ref[name]
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), name


def test_input_gradient_and_frozen_parameters():
    torch.manual_seed(0)
    model, x, loss_fn = models.small_cnn()
    model.stem[0].weight.requires_grad_(False)
    ref = copy.deepcopy(model)
    x = x.clone().requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    tight = monet_opt.optimize(model, x, opt.plan.min_feasible_bytes, profile_repeats=1)
    assert tight.plan.recomputed_ops > 0
    _grads_match(tight, model, ref, lambda m: m(x if m is tight else x_ref), loss_fn)
    assert model.stem[0].weight.grad is None
    assert torch.equal(x.grad, x_ref.grad)


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x, y, scale=None):
        h = torch.relu(self.a(x)) * torch.sigmoid(self.b(y))
        out = {"h": h, "parts": (h.sum(-1), self.a.weight)}
        return out if scale is None else {"h": h * scale, "parts": out["parts"]}


def test_tuple_and_dict_inputs_and_pytree_outputs():
    torch.manual_seed(0)
    model = TwoInputs()
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    ref = copy.deepcopy(model)
    loss_fn = lambda out: out["h"].sum() + out["parts"][0].sum()  # noqa: E731
    opt = monet_opt.optimize(model, (x, y), HUGE, profile_repeats=1)
    _grads_match(opt, model, ref, lambda m: m(x, y), loss_fn)
    model.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)
    s = torch.tensor(2.0)
    opt_kw = monet_opt.optimize(model, {"x": x, "y": y, "scale": s}, HUGE, profile_repeats=1)
    _grads_match(opt_kw, model, ref, lambda m: m(x=x, y=y, scale=s), loss_fn)
    # the same arguments positionally run the sample's plan (NOTE [Arguments passed as the
    # sample's]), with new_shapes="error" too; another structure is refused there
    model.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", monet_opt.ReplanWarning)
        _grads_match(opt_kw, model, ref, lambda m: m(x, y, s), loss_fn)
    assert len(opt_kw.plans) == 1
    strict = monet_opt.optimize(model, {"x": x, "y": y, "scale": s}, HUGE, profile_repeats=1,
                                new_shapes="error")
    strict(x, y, s)
    with pytest.raises(monet_opt.PlanMismatchError, match="structured"):
        strict(x, y)


def test_tied_weights_get_one_gradient():
    torch.manual_seed(0)
    model, x, loss_fn = models.gpt2_tiny()
    ref = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    _grads_match(opt, model, ref, lambda m: m(**x), loss_fn)
    assert model.lm_head.weight is model.transformer.wte.weight


def test_explain_lists_every_op():
    model, x, _ = models.small_cnn()
    opt = monet_opt.optimize(model, x, HUGE, profile_repeats=1)
    full = monet_opt.optimize(model, x, opt.plan.min_feasible_bytes, profile_repeats=1)
    text = full.plan.explain()
    assert "predicted peak" in text and "recomputed x1" in text and "kept" in text
    assert len(text.splitlines()) >= len(full.plan.rows)
    # the op at the peak, in the phase where the timeline puts it
    tl = full.plan.timeline
    at = max(range(len(tl.live_bytes)), key=tl.live_bytes.__getitem__)
    phase = "backward" if at >= tl.backward_start else "forward"
    name = full.plan.peak_op.split()[0].rstrip(",")
    assert f", {phase}, workspace" in full.plan.peak_op and f"at                {name}" in text
    assert name in {r.name for r in full.plan.rows}
    # the rows priced as the simulator prices them, variants (where the solve chose some: a
    # loaded fresh-clone CI run's reached the least peak without) and recomputed runs included
    assert full.plan.recomputed_ops
    total = sum(r.time_s + r.recomputed * r.rerun_s for r in full.plan.rows)
    assert total == pytest.approx(full.plan.predicted_step_time_s, rel=1e-9)


@pytest.mark.parametrize("variants", [True, False])
def test_lower_problem_gives_the_profiled_problem(variants):
    model, x, _ = models.small_cnn()
    before = copy.deepcopy(model.state_dict())
    p = monet_opt.lower_problem(model, x, profile_repeats=1, variants=variants)
    assert p.forward_ops and p.backward_ops
    assert bool(p.variants) == variants
    assert all(p.ops[i].time_s > 0 for i in p.forward_ops)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
