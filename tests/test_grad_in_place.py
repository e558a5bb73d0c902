"""NOTE [BatchNorm's gradient in place] (monet_opt/grad_in_place.py): a ReLU or ReLU6 backward
writes dx into a dy that dies there, bitwise the functional op, and the plan counts it so; a
BatchNorm's, whose out= form only copies a dx made anew, does not."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx
from torch import nn

import monet_opt
import solvers
from monet_opt import grad_in_place, variants, variants_bits
from solvers import SolveResult, Status, schedule_from_kept, simulate
from tests import models

aten = torch.ops.aten


def _allocated(fn) -> list[int]:
    """The sizes torch.profiler's allocation events see while fn() runs (what the live-bytes
    counter, a dispatch mode, does not see: allocations inside an op)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    sizes, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.alloc_size > 0:
            sizes.append(event.extra_fields.alloc_size)
    return sizes


def test_every_form_written_into_makes_no_result_of_its_own():
    """NOTE [BatchNorm's gradient in place]: BatchNorm's out= form made dx anew and copied it
    into dy below the dispatcher (allocation events: the whole dx), while the plan counted it
    written in place; every form the executor writes into must write there itself. Dropout's
    multiplies by its bool mask cast to dx's dtype, a temporary eager's op makes too: one
    allocation of dx's size, not two."""
    torch.manual_seed(0)
    a, b = torch.randn(64, 128), torch.randn(64, 128)
    y = torch.rand(64, 128).softmax(-1)
    cases = [(aten.threshold_backward.default, (a, b, 0.0), {}),
             (aten.hardtanh_backward.default, (a, b, 0.0, 6.0), {}),
             *[c for c in _elementwise_cases(a, b, y)
               if c[0] is not aten.native_dropout_backward.default], *_scatter_cases(a)]
    assert {op for op, _, _ in cases} == set(grad_in_place.OUT_FORMS) - {
        aten.native_dropout_backward.default}
    for op, args, kwargs in cases:
        into = args[0].clone()
        made = _allocated(lambda: grad_in_place.into(op, 0)(into, *args[1:], **kwargs))
        assert not [n for n in made if n >= a.nbytes], op
    mask = torch.rand(64, 128) > 0.5
    into = torch.randn(64, 128)
    made = _allocated(lambda: grad_in_place.into(aten.native_dropout_backward.default, 0)(
        into, mask, 2.0))
    assert made.count(into.nbytes) <= 1, made


def test_batchnorm_backward_is_not_written_into_dy():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    problem = monet_opt.lower_problem(model, torch.randn(4, 3, 16, 16), profile_repeats=1)
    assert _bn_in_place(problem) == 0 and _bn_in_place(problem, "threshold_backward") == 1


@pytest.mark.parametrize("op", ["threshold", "hardtanh"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_elementwise_dx_written_into_dy_is_the_functional_ops(op, channels_last, dtype):
    torch.manual_seed(0)
    x = torch.randn(4, 6, 9, 11, dtype=dtype) * 4
    x[0, 0, :2] = float("nan")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    dy = torch.randn_like(x)
    args = (x, 0.0) if op == "threshold" else (x, 0.0, 6.0)
    want = getattr(aten, f"{op}_backward")(dy, *args)
    into = dy.clone()
    got = grad_in_place.into(getattr(aten, f"{op}_backward").default, 0)(into, *args)
    assert got.data_ptr() == into.data_ptr() and got.stride() == want.stride()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}


def _elementwise_cases(a, b, y):
    """(op, args, kwargs) of NOTE [Elementwise backward ops in place]."""
    return [(aten.mul.Tensor, (a, b), {}), (aten.mul.Tensor, (a, 0.7978845608), {}),
            (aten.div.Tensor, (a, b), {}), (aten.sub.Tensor, (a, b), {}),
            (aten.sub.Tensor, (a, b), {"alpha": 2}), (aten.neg.default, (a,), {}),
            (aten.tanh_backward.default, (a, y), {}), (aten.sigmoid_backward.default, (a, y), {}),
            (aten.gelu_backward.default, (a, b), {"approximate": "tanh"}),
            (aten.gelu_backward.default, (a, b), {}), (aten.silu_backward.default, (a, b), {}),
            (aten._softmax_backward_data.default, (a, y, -1, a.dtype), {}),
            (aten._softmax_backward_data.default, (a, y, 1, a.dtype), {}),
            (aten._log_softmax_backward_data.default, (a, y.log(), -1, a.dtype), {}),
            (aten._log_softmax_backward_data.default, (a, y.log(), 1, a.dtype), {}),
            (aten.native_dropout_backward.default, (a, y > 0.01, 1 / 0.9), {}),
            (aten.native_dropout_backward.default, (b, y < 0.02, 1 / 0.3), {})]


def _scatter_cases(zeros):
    """(op, args, kwargs) of NOTE [Scattered gradients in place]: a gradient added into zeros
    at indices, some repeated."""
    rows, cols = zeros.shape[-2:]
    gen = torch.Generator().manual_seed(1)
    cols_at = torch.randint(0, cols, (cols // 2,), generator=gen)
    src = torch.randn(rows, cols // 2, generator=gen, dtype=zeros.dtype)
    at = torch.randint(0, cols, (rows, cols // 2), generator=gen)
    return [(aten.index_add.default, (zeros, 1, cols_at, src), {}),
            (aten.index_add.default, (zeros, 1, cols_at, src), {"alpha": 2}),
            (aten.scatter_add.default, (zeros, 1, at, src), {}),
            (aten.index_put.default, (zeros, [None, cols_at], src, True), {})]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_scattered_gradients_written_into_their_zeros_are_the_functional_ops(dtype):
    """NOTE [Scattered gradients in place]"""
    for op, args, kwargs in _scatter_cases(torch.zeros(48, 300, dtype=dtype)):
        into = args[0].clone()
        out = grad_in_place.into(op, 0)(into, *args[1:], **kwargs)
        assert out.data_ptr() == into.data_ptr() and torch.equal(out, op(*args, **kwargs)), op


class _Scatters(nn.Module):
    """A residual block adding h.index_select(1, idx) to h, a gather and an index of it: each
    backward adds into zeros of h's size."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x):
        h = self.a(x)
        idx = torch.randint(0, 64, (64,))
        h = h + 0.5 * h.index_select(1, idx) + h.gather(1, idx.expand_as(h)) + h[:, idx.flip(0)]
        return self.b(torch.tanh(h)).sum()


def test_a_step_scattering_gradients_peaks_no_higher_than_eager():
    """Store-all peaked 16 KiB over eager (132,104 B against 115,984 with the index_select
    alone), which no schedule met."""
    torch.manual_seed(0)
    model, x = _Scatters(), torch.randn(64, 64)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, "100% of peak", profile_dir=None, profile_repeats=1)
    torch.manual_seed(1)
    eager_peak = monet_opt.measure_peak(lambda: eager(x).backward(),
                                        monet_opt.resident_tensors(eager, x))
    torch.manual_seed(1)
    peak = monet_opt.measure_peak(lambda: opt(x).backward(), monet_opt.resident_tensors(model, x))
    assert peak <= eager_peak and peak <= opt.plan.predicted_peak_bytes
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.equal(p.grad, q.grad)


@pytest.mark.parametrize("shape", [(4, 6, 9, 11), (3, 1000), (2, 4, 64, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_elementwise_ops_written_into_an_input_are_the_functional_ops(shape, dtype):
    """NOTE [Elementwise backward ops in place]: each op, into each argument it may write,
    bitwise the functional op (NaN and -0.0 among the inputs) and laid out as it."""
    torch.manual_seed(0)
    a, b = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype) + 0.1
    a.view(-1)[:3], b.view(-1)[5], a.view(-1)[7] = float("nan"), -0.0, -0.0
    b.view(-1)[8], b.view(-1)[9] = float("inf"), float("-inf")
    y = torch.softmax(torch.randn(shape, dtype=dtype), -1)
    checked = 0
    for op, args, kwargs in _elementwise_cases(a, b, y):
        want = op(*args, **kwargs)
        for k in grad_in_place.may_write(_node(op, args, kwargs, want)):
            if not isinstance(args[k], torch.Tensor):
                continue
            written = list(args)
            written[k] = args[k].clone()
            got = grad_in_place.into(op, k)(*written, **kwargs)
            assert got.data_ptr() == written[k].data_ptr() and got.stride() == want.stride()
            assert torch.equal(got.view(_BITS[dtype]), want.view(_BITS[dtype])), (op, k)
            checked += 1
    assert checked == 21  # the binary ops into either tensor argument


def _node(op, args, kwargs, val):
    """An FX node calling `op` (its tensor arguments placeholders), its value `val`."""
    graph = fx.Graph()
    nodes = tuple(graph.placeholder(f"x{k}") if isinstance(a, torch.Tensor) else a
                  for k, a in enumerate(args))
    node = graph.call_function(op, nodes, kwargs)
    node.meta["val"] = val
    return node


@pytest.mark.parametrize("family", ["relu.bool_mask", "relu.bit_mask"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_relu_mask_written_into_dy_is_the_variants_result(family, channels_last, dtype):
    """NOTE [A ReLU's mask and its gradient in place]: masked_fill_ into dy, bitwise the
    variant's `where` (NaNs and signed zeros in dy included), in dy's layout."""
    torch.manual_seed(0)
    y = torch.relu(torch.randn(4, 6, 9, 11, dtype=dtype))
    dy = torch.randn_like(y)
    dy[0, 0, :2], dy[1, 1, :3] = float("nan"), -0.0
    if channels_last:
        y, dy = (t.contiguous(memory_format=torch.channels_last) for t in (y, dy))
    params = (0,) if family == "relu.bool_mask" else (0, variants_bits.memory_order(y))
    encoded = variants.encode(family, y, *params)
    want = variants.run((family,), (params,), dy, encoded, 0)
    into = dy.clone()
    got = variants.run_into((family,), (params,), into, encoded, 0)
    assert variants.writes_into((family,)) and got.data_ptr() == into.data_ptr()
    assert got.stride() == want.stride() == aten.threshold_backward(dy, y, 0).stride()
    assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_dropout_bit_mask_written_into_dy_is_the_ops_result(dtype):
    """NOTE [Dropout's gradient in place]: the bit-mask variant's mul_ into dy, bitwise
    native_dropout_backward (NaN, infinities and -0.0 in dy), in dy's layout."""
    torch.manual_seed(0)
    out, mask = aten.native_dropout(torch.randn(4, 6, 9, 11, dtype=dtype), 0.3, True)
    dy = torch.randn_like(out).permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    dy[0, 0, :2], dy[1, 1, :3], dy[2, 2, :2] = float("nan"), -0.0, float("inf")
    want = aten.native_dropout_backward(dy, mask, 1 / 0.7)
    encoded = variants.encode("dropout.bit_mask", mask)
    into = dy.clone()
    got = variants.run_into(("dropout.bit_mask",), ((),), into, encoded, 1 / 0.7)
    assert variants.writes_into(("dropout.bit_mask",)) and got.data_ptr() == into.data_ptr()
    assert got.stride() == want.stride()
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(got.view(bits), want.view(bits))


def _every_variant(problem, budget, *args, **kwargs):
    """A solver that keeps what store-all keeps, every variant chosen."""
    chosen = frozenset(range(len(problem.variants)))
    schedule = schedule_from_kept(problem, problem.with_variants(chosen).saved_for_backward,
                                  chosen)
    sim = simulate(problem, schedule)
    return SolveResult(solver="test", status=Status.FEASIBLE, schedule=schedule,
                       objective_s=sim.time_s, peak_bytes=sim.peak_bytes, bound_s=None,
                       gap=None, solve_time_s=0.0, min_feasible_bytes=sim.peak_bytes)


@pytest.mark.parametrize("family", ["relu.bool_mask", "relu.bit_mask"])
def test_a_relu_run_masked_writes_into_dy_and_measures_its_prediction(monkeypatch, family):
    """NOTE [A ReLU's mask and its gradient in place]: each ReLU, its mask variant chosen,
    writes dx into its dying dy; the variant's workspace does not count dx again, and the step
    measures its prediction to the byte and trains bitwise as eager."""
    monkeypatch.setattr(solvers, "solve", _every_variant)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))
    x = torch.randn(8, 3, 32, 32)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, 1 << 40, profile_dir=None, profile_repeats=1,
                             variants=[family])
    problem = monet_opt.lower_problem(copy.deepcopy(model), x, profile_repeats=1,
                                      variants=[family])
    in_place = {k for k, op in enumerate(problem.ops)
                if op.name.startswith("threshold_backward") and op.inplace_bytes}
    assert len(in_place) == 2 and len(opt.plan.variants) == 2
    assert all(v.extra_workspace_bytes < problem.ops[v.op].inplace_bytes
               for v in problem.variants if v.op in in_place)
    assert _as_eager(opt, model, eager, x) == opt.plan.predicted_peak_bytes


def _as_eager(opt, model, eager, x) -> int:
    """Asserts that one step of `opt` (optimizing `model`) leaves gradients and buffers
    bitwise as one of `eager`; the step's measured peak."""
    grads = []
    for module, owner in ((opt, model), (eager, eager)):
        owner.zero_grad(set_to_none=True)
        module(x).square().sum().backward()
        grads.append([p.grad for p in owner.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), eager.buffers()))
    model.zero_grad(set_to_none=True)
    measured = monet_opt.measure_peak(lambda: opt(x).square().sum().backward(),
                                      monet_opt.resident_tensors(model, x))
    return measured


def _least(model, x, **kw):
    with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
        monet_opt.optimize(copy.deepcopy(model), x, 1, profile_dir=None, profile_repeats=1,
                           time_limit_s=5, **kw)
    return info.value.min_feasible_bytes


def _bn_in_place(problem, kind: str = "native_batch_norm_backward") -> int:
    return sum(1 for op in problem.ops if op.name.startswith(kind) and op.inplace_bytes)


def test_a_least_peak_lower_for_it_measures_its_prediction_and_trains_as_eager(monkeypatch):
    """The second convolution is 1x1: a 3x3 one's backward has 1.5 MiB of oneDNN scratch on CPU
    (NOTE [Allocation events]), which set the least peak above the ReLU6 backwards' either
    way."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU6(),
                          nn.Conv2d(32, 8, 1), nn.ReLU6(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    x = torch.randn(8, 3, 32, 32)
    least = _least(model, x)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, least, profile_dir=None, profile_repeats=1,
                             time_limit_s=5)
    problem = monet_opt.lower_problem(copy.deepcopy(model), x, profile_repeats=1)
    assert _bn_in_place(problem, "hardtanh_backward") == 2
    assert _as_eager(opt, model, eager, x) == opt.plan.predicted_peak_bytes <= least
    monkeypatch.setattr(grad_in_place, "may_write", lambda node: ())
    assert _least(eager, x) > least  # without it the least peak is higher


def test_a_variant_run_in_its_place_counts_its_dx(monkeypatch):
    """BatchNorm from its output (lossy, NOTE [BatchNorm from its output]) runs in place of
    the in-place op and makes dx anew: its workspace counts dx, so a plan using it still
    measures its prediction (counted as in place, it measured dx over it). The variant no
    longer pays on this model, so the plan is made to use it."""
    family = "batchnorm.output_activated"

    monkeypatch.setattr(solvers, "solve", _every_variant)
    torch.manual_seed(0)
    base, x, _ = models.silu_cnn()
    opt = monet_opt.optimize(base, x, 1 << 40, profile_dir=None, profile_repeats=1,
                             variants=[family], allow_lossy=True)
    assert len(opt.plan.variants) == 3 and all(v.startswith(family) for v in opt.plan.variants)
    measured = monet_opt.measure_peak(lambda: opt(x).sum().backward(),
                                      monet_opt.resident_tensors(base, x))
    assert measured == opt.plan.predicted_peak_bytes


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.branch = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16),
                                    nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                    nn.BatchNorm2d(16))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))

    def forward(self, x):
        y = self.stem(x)
        return self.head(torch.relu(self.branch(y) + y))


def test_the_last_of_several_readers_writes_into_a_gradient():
    """NOTE [In-place accumulation] (solvers/problem.py): a residual block's gradient is read
    by the shortcut's and the branch's backward; the last of them writes into it. The step
    measures its prediction to the byte and trains bitwise as eager."""
    torch.manual_seed(0)
    model, x = _Residual(), torch.randn(8, 3, 32, 32)
    eager = copy.deepcopy(model)
    problem = monet_opt.lower_problem(copy.deepcopy(model), x, profile_repeats=1)
    readers = {}
    for op in problem.ops:
        for t in op.inputs:
            readers[t] = readers.get(t, 0) + 1
    shared = [op.name for op in problem.ops if op.inplace_bytes and any(
        readers[t] > 1 and problem.tensors[t].bytes == op.inplace_bytes for t in op.inputs)]
    assert shared
    least = _least(model, x)
    opt = monet_opt.optimize(model, x, least, profile_dir=None, profile_repeats=1,
                             time_limit_s=5)
    assert _as_eager(opt, model, eager, x) == opt.plan.predicted_peak_bytes <= least
