"""The operator-variant library: exact encodings, and what they are worth to a plan."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import monet_opt
from monet_opt import (alloc_events, conv_split, grad_in_place, measured, memory, variants,
                       variants_bits, variants_pool)
from solvers import schedule_from_kept, simulate
from solvers.variants import lightest
from tests import models
from tests.test_executor import HUGE, _check_memory, assert_same, run_steps

aten = torch.ops.aten


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (9,), (3, 5, 7), (2, 64, 33)])
def test_bit_packing_round_trips(shape):
    b = torch.rand(shape) < 0.4
    packed = variants_bits.pack_bits(b)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-b.numel() // 8)
    assert torch.equal(variants_bits.unpack_bits(packed, b.shape), b)


def test_each_family_reproduces_its_op_bitwise():
    torch.manual_seed(0)
    y = torch.relu(torch.randn(4, 8, 9, 9))
    y[0, 0, 0, :3] = torch.tensor([float("nan"), 0.0, -0.0])
    g = torch.randn_like(y)
    want = aten.threshold_backward(g, y, 0)
    for name, params in (("relu.bool_mask", (0,)), ("relu.bit_mask", (0, (0, 1, 2, 3)))):
        fam = variants.family(name)
        got = variants.run((name,), (params,), g, fam.encode(y, *params), 0)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num()), name
    out, mask = aten.native_dropout(y, 0.3, True)
    want = aten.native_dropout_backward(g, mask, 1 / 0.7)
    fam = variants.family("dropout.bit_mask")
    assert torch.equal(fam.run(g, fam.encode(mask), 1 / 0.7), want)
    out, idx = aten.max_pool2d_with_indices(y, [3, 3], [2, 2], [1, 1])
    gp = torch.randn_like(out)
    rest = ([3, 3], [2, 2], [1, 1], [1, 1], False, idx)
    want = aten.max_pool2d_with_indices_backward(gp, y, *rest)
    like = (tuple(y.shape), y.dtype, y.device)
    got = variants.run(("maxpool.shape_only",), ((y.stride(),),), gp, like, *rest)
    assert torch.equal(got, want)


@pytest.mark.parametrize("grad_layout", ["channels_last", "contiguous", "expanded"])
@pytest.mark.parametrize("family", ["relu.bool_mask", "relu.bit_mask"])
def test_relu_masks_lay_out_their_result_as_the_op(grad_layout, family):
    """After a channels-last ReLU, threshold_backward's result is channels-last whatever its
    gradient's layout; the mask variants' are too, so the profiler keeps them (masked_fill's
    was contiguous, and so was the 1-bit mask unpacked: refused in channels-last networks)."""
    torch.manual_seed(0)
    y = torch.relu(torch.randn(4, 17, 5, 3)).to(memory_format=torch.channels_last)
    g = {"channels_last": torch.randn(4, 17, 5, 3).to(memory_format=torch.channels_last),
         "contiguous": torch.randn(4, 17, 5, 3),
         "expanded": torch.randn(4, 17, 1, 1).expand(4, 17, 5, 3)}[grad_layout]
    want = aten.threshold_backward(g, y, 0)
    params = (0,) if family == "relu.bool_mask" else (0, variants_bits.memory_order(y))
    got = variants.run((family,), (params,), g, variants.encode(family, y, *params), 0)
    assert torch.equal(got, want) and got.stride() == want.stride()


@pytest.mark.parametrize("make, order", [
    (lambda: torch.empty(2, 3, 4, 5), (0, 1, 2, 3)),
    (lambda: torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last), (0, 2, 3, 1)),
    (lambda: torch.empty(5, 7).t(), (1, 0)),
    (lambda: torch.empty(2, 1, 4, 5).to(memory_format=torch.channels_last), None),
    (lambda: torch.empty(3, 1).expand(3, 4), (0, 1)),
    (lambda: torch.empty(4, 6)[:, ::2], (0, 1))])
def test_memory_order_makes_the_tensor_contiguous(make, order):
    """memory_order: outermost to innermost in memory; the identity where nothing does."""
    t = make()
    got = variants_bits.memory_order(t)
    if order is not None:
        assert got == order
    dense = t.numel() == t.untyped_storage().nbytes() // t.element_size()
    assert t.permute(got).is_contiguous() if dense else got == tuple(range(t.dim()))


GEOMETRIES = [  # kernel, stride, padding, dilation, ceil_mode
    ((2, 2), (2, 2), (0, 0), (1, 1), False), ((3, 3), (2, 2), (1, 1), (1, 1), False),
    ((3, 2), (1, 2), (1, 0), (1, 1), True), ((3, 3), (2, 1), (1, 1), (2, 3), True),
    ((5, 5), (3, 3), (2, 2), (1, 1), True), ((17, 17), (1, 1), (8, 8), (1, 1), False)]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "unbatched", "nan"])
@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "sliced"])
def test_compact_maxpool_indices_rebuild_exactly(geometry, layout, sliced, monkeypatch):
    """NOTE [Compact max-pool indices]: offsets of 1 byte (2 for 17x17 windows) rebuild the
    int64 indices element for element, so the backward is bitwise the op's; also compacted a
    slice of the leading dimension at a time, as large indices are."""
    if sliced:
        monkeypatch.setattr(variants_pool, "COMPACT_SLICE_ELEMENTS", 1)
    kernel, stride, padding, dilation, ceil = geometry
    torch.manual_seed(0)
    x = torch.randn(2, 3, 23, 19)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    elif layout == "unbatched":
        x = x[0]
    elif layout == "nan":
        x[0, 0, 3:9, 2:7] = float("nan")
    out, idx = aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil)
    params = (*kernel, *stride, *padding, *dilation, x.shape[-1])
    offsets = variants.family("maxpool.compact_indices").encode(idx, *params)
    assert offsets.dtype == (torch.uint8 if kernel[0] * kernel[1] <= 256 else torch.int16)
    assert torch.equal(variants_pool.full_indices(offsets, *params), idx)
    g = torch.randn_like(out)
    rest = (kernel, stride, padding, dilation, ceil)
    want = aten.max_pool2d_with_indices_backward(g, x, *rest, idx)
    like = (tuple(x.shape), x.dtype, x.device)
    both = variants.run(("maxpool.shape_only", "maxpool.compact_indices"),
                        ((want.stride(),), params), g, like, *rest, offsets)
    assert torch.equal(both.isnan(), want.isnan()) and torch.equal(both, want)
    assert both.stride() == want.stride()  # NOTE [Layouts a stand-in cannot show]


def test_large_indices_are_compacted_in_slices():
    """Compacting takes three int64 temporaries the size of what it compacts: on GoogLeNet (b32,
    128²) 46 MiB at the first max-pool, its least peak. A slice at a time (here 8), an eighth."""
    x = torch.randn(32, 16, 64, 64)
    _, idx = aten.max_pool2d_with_indices(x, (3, 3), (2, 2), (1, 1), (1, 1), True)
    params = (3, 3, 2, 2, 1, 1, 1, 1, x.shape[-1])
    sliced, ws = memory.counted(lambda: variants_pool.compact_indices(idx, *params), False, idx)
    whole, ws_whole = memory.counted(lambda: variants_pool._compact(idx, *params), False, idx)
    assert torch.equal(sliced, whole) and sliced.stride() == whole.stride()
    assert ws_whole >= 2 * idx.nbytes and ws <= ws_whole // 6


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_shape_only_families_reproduce_their_ops_bitwise(layout):
    """Average pooling, adaptive average pooling and a convolution without weight gradient
    read the argument these families drop for its shape, dtype and device only; pooling's
    result is laid out as its input was (NOTE [Layouts a stand-in cannot show])."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 11, 9)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    like = (tuple(x.shape), x.dtype, x.device)

    def same(got, want):
        return torch.equal(got, want) and got.stride() == want.stride()

    for rest in [([2, 2], [2, 2], [0, 0], False, True, None),
                 ([3, 3], [2, 1], [1, 1], True, False, None), ([3, 2], [2, 2], [1, 0], True,
                                                                True, 5)]:
        g = torch.randn_like(aten.avg_pool2d(x, *rest))
        want = aten.avg_pool2d_backward(g, x, *rest)
        assert same(variants.run(("avgpool.shape_only",), ((want.stride(),),), g, like, *rest),
                    want)
    g = torch.randn_like(aten._adaptive_avg_pool2d(x, [4, 3]))
    want = aten._adaptive_avg_pool2d_backward(g, x)
    assert same(variants.run(("adaptive_avgpool.shape_only",), ((want.stride(),),), g, like),
                want)
    if layout == "channels_last":  # conv.shape_only accepts contiguous inputs only
        return
    w = torch.randn(6, 4, 3, 3)
    g = torch.randn_like(torch.conv2d(x, w, padding=1))
    for mask in ([True, False, True], [True, False, False], [False, False, True]):
        rest = ([6], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask)
        want = aten.convolution_backward(g, x, w, *rest)
        got = variants.run(("conv.shape_only",), ((),), g, like, w, *rest)
        assert all(torch.equal(a, b) for a, b, m in zip(got, want, mask) if m)


def test_library_rules():
    """Families of one op replacing different arguments must decode (so they combine);
    exact ones state no error, lossy ones a bound; lossy ones are only offered on request."""
    with pytest.raises(ValueError, match="exactly one of run, decode"):
        variants.Family("x", aten.relu.default, 0, None)
    with pytest.raises(ValueError, match="must state its bound"):
        variants.Family("x", aten.relu.default, 0, None, decode=abs, exact=False)
    by_op = {}
    for f in variants.FAMILIES:
        by_op.setdefault(f.op, set()).add(f.arg)
    assert by_op[aten.max_pool2d_with_indices_backward.default] == {1, 7}
    assert all(f.max_rel_error < 0.05 for f in variants.FAMILIES)


def _no_recompute_peak(problem, chosen) -> int:
    kept = problem.with_variants(chosen).saved_for_backward
    return simulate(problem, schedule_from_kept(problem, kept, chosen)).peak_bytes


@pytest.fixture
def free_variants(monkeypatch):
    """The profiler reports every variant's time as zero (workspaces as measured), so which
    variants a plan needs at a limit does not hinge on CPU timing noise: with them free, a plan
    that fits without recomputation beats any that recomputes."""
    real = measured.profile

    def profile(*args, **kwargs):
        result = real(*args, **kwargs)
        return dataclasses.replace(result, variant_costs=tuple(
            (0.0, enc_ws, 0.0, run_ws) for _, enc_ws, _, run_ws in result.variant_costs))
    monkeypatch.setattr(measured, "profile", profile)


@pytest.fixture
def even_times(monkeypatch):
    """The profiler reports every op at 1 ms (variants' costs as given), so a recomputation
    is never within auto's close-enough margin of the step (NOTE [Close enough]): under load
    a cheap op's recomputation was, and auto stopped at a plan recomputing it where the test
    wanted the plan that recomputes nothing."""
    real = measured.profile

    def profile(*args, **kwargs):
        result = real(*args, **kwargs)
        return dataclasses.replace(result, op_time_s=(1e-3,) * len(result.op_time_s),
                                   op_rerun_s=(None,) * len(result.op_time_s))
    monkeypatch.setattr(measured, "profile", profile)


def test_maxpool_variants_combine_in_a_plan(free_variants, even_times):
    """NOTE [Compact max-pool indices] on a ResNet-like stem (conv, BN, ReLU, 3x3/2 pool):
    compact indices do not lower the least peak (recomputing the stem late is as small), but
    they keep the stem's indices small while the wider layers' backward holds the peak. At the
    peak of keeping everything with every variant in use, where without compact indices
    something must be recomputed, the plan uses both max-pool variants on the same op and trains
    bitwise like store-all, within the limit."""
    torch.manual_seed(0)
    base, x, loss_fn = models.pool_cnn()
    pool = {"maxpool.shape_only", "maxpool.compact_indices"}
    problem = monet_opt.lower_problem(copy.deepcopy(base), x, profile_repeats=1)
    light = lightest(problem)
    compact = {v for v in light if problem.variants[v].name.startswith("maxpool.compact")}
    limit = _no_recompute_peak(problem, light)
    assert compact and limit < _no_recompute_peak(problem, light - compact)
    tight = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1,
                               time_limit_s=10)
    assert tight.plan.recomputed_ops == 0, tight.plan.explain()
    by_node: dict[str, set[str]] = {}
    for name in tight.plan.variants:
        fam, node = name.split(":")
        by_node.setdefault(node, set()).add(fam)
    assert pool in by_node.values(), tight.plan.explain()
    ref = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1)
    assert_same(run_steps(tight, tight.model, x, loss_fn), run_steps(ref, ref.model, x, loss_fn),
                exact=True, what="max-pool variants combined vs store-all")
    _check_memory(tight, x, loss_fn, limit, "max-pool variants combined")


@pytest.mark.parametrize("kind", ["frozen_conv", "conv", "avgpool", "adaptive_avgpool"])
def test_shape_only_families_lower_the_least_peak(kind, monkeypatch):
    """A frozen convolution, a trainable one's input step (NOTE [Conv backward split]), average
    pooling, adaptive average pooling: dropping the input their backward reads for its shape
    lowers the least reachable peak (no recomputation can: the op needs the input while it
    runs), the least-peak plan uses the family, and it trains bitwise like store-all, within
    the limit. The split is made here on CPU too, where it is off by default; where CPU
    scratch is counted, the convolutions' input step is seen to save nothing there."""
    family = "conv.shape_only" if kind.endswith("conv") else f"{kind}.shape_only"
    if kind.endswith("conv") and alloc_events.enabled():
        pytest.skip("on CPU the input step copies its stand-in to a dense input, scratch the "
                    "allocator's events count: no saving (NOTE [Conv backward split])")
    monkeypatch.setattr(conv_split, "SPLIT_DEVICES", frozenset({"cpu", "cuda"}))
    torch.manual_seed(0)
    base, x, loss_fn = models.shape_only_net(kind)
    lowers_the_least_peak(base, x, loss_fn, family, without=False)


def lowers_the_least_peak(base, x, loss_fn, family: str, without, state_bytes: int = 0):
    """Offered every exact family, `base`'s least reachable peak is lower than offered
    `without` (optimize's `variants=`); the plan at that peak uses `family`, trains bitwise like
    store-all and stays within its limit (measured). Returns store-all's run_steps record."""
    fewer = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1,
                               variants=without)
    with_ = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1)
    limit = with_.plan.min_feasible_bytes
    assert limit < fewer.plan.min_feasible_bytes
    tight = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1,
                               time_limit_s=10)
    assert family in {name.split(":")[0] for name in tight.plan.variants}, tight.plan.explain()
    store_all = run_steps(with_, with_.model, x, loss_fn)
    assert_same(run_steps(tight, tight.model, x, loss_fn), store_all, exact=True,
                what=f"{family} vs store-all")
    _check_memory(tight, x, loss_fn, limit, family, state_bytes)
    return store_all


def test_variants_lower_the_least_peak_and_train_exactly():
    """On a network with ReLU, max-pool and dropout: with variants the least reachable peak is
    lower than with recomputation alone, and the plan there uses them, trains bitwise like
    store-all, and stays within its limit (measured)."""
    torch.manual_seed(0)
    base, x, loss_fn = models.small_cnn(kernel=1)  # no convolution's scratch sets the least
    without = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1,
                                 variants=False)
    with_ = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1)
    assert with_.plan.min_feasible_bytes < without.plan.min_feasible_bytes
    limit = with_.plan.min_feasible_bytes
    tight = monet_opt.optimize(copy.deepcopy(base), x, limit, profile_repeats=1,
                               time_limit_s=10)
    assert tight.plan.variants, "the least-peak plan uses no variant"
    assert "variants in use" in tight.plan.explain()
    ref_run = run_steps(with_, with_.model, x, loss_fn)
    assert_same(run_steps(tight, tight.model, x, loss_fn), ref_run, exact=True,
                what="least-peak plan with variants vs store-all")
    _check_memory(tight, x, loss_fn, limit, "least peak with variants")


def test_one_bit_masks_measure_their_prediction(monkeypatch):
    """NOTE [Workspace]: unpacking a 1-bit mask views it; the workspace counter took that view
    for a new 1,024-byte tensor, and the plan predicted the mask twice at the peak. (Backward
    ops writing into their dying inputs are turned off: with them this model's least peak is
    no longer at a masked ReLU's backward; where CPU scratch is counted, a BatchNorm
    backward's 32 KiB sets it, and the test says only that the plan with masks measures its
    prediction.)"""
    monkeypatch.setattr(grad_in_place, "may_write", lambda node: ())
    torch.manual_seed(0)
    base, x, loss_fn = models.small_cnn(kernel=1)  # no convolution's scratch sets the least
    offered = ("relu.bit_mask", "dropout.bit_mask", "maxpool.shape_only")
    full = monet_opt.optimize(copy.deepcopy(base), x, HUGE, profile_repeats=1, variants=offered,
                              profile_dir=None)
    tight = monet_opt.optimize(copy.deepcopy(base), x, full.plan.min_feasible_bytes,
                               profile_repeats=1, variants=offered, profile_dir=None)
    assert "relu.bit_mask:" in " ".join(tight.plan.variants)
    if not alloc_events.enabled():  # counted, a BatchNorm backward's scratch sets the peak
        assert "threshold_backward" in tight.plan.peak_op
    resident = monet_opt.resident_tensors(tight.model, x)
    measured = monet_opt.measure_peak(lambda: loss_fn(tight(x)).backward(), resident)
    assert measured == tight.plan.predicted_peak_bytes


class _Activations(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        return (torch.sigmoid(h) + torch.tanh(h) + h.softmax(-1)
                + torch.nn.functional.gelu(h) + torch.nn.functional.silu(h))


def test_backward_reads_the_output_where_that_is_exact():
    """NOTE [Backward from the output]: sigmoid's, tanh's and softmax's backward read their
    own output; GELU's and SiLU's read the input, and rightly: each maps two inputs to one
    output."""
    p = monet_opt.lower_problem(_Activations(), torch.randn(4, 8), profile_repeats=1)
    producer_of = {op.name: k for k, op in enumerate(p.ops)}
    for fwd in ("sigmoid", "tanh", "_softmax", "gelu", "silu"):
        bwd = next(op for op in p.ops if op.is_backward and op.name.startswith(fwd + "_b"))
        read = {p.tensors[x].producer for x in bwd.inputs}
        reads_output = producer_of[fwd] in read
        assert reads_output == (fwd in ("sigmoid", "tanh", "_softmax")), (fwd, bwd.name)
    for f in (torch.nn.functional.gelu, torch.nn.functional.silu):
        x = torch.linspace(-6.0, 0.0, 200001, dtype=torch.float64)
        y = f(x)
        low = int(y.argmin())
        assert 0 < low < len(x) - 1  # falls, then rises again: not one-to-one
        assert y[0] > y[low] < y[-1]


def test_a_lossy_encoding_is_priced_no_faster_than_its_op(monkeypatch):
    """NOTE [Lossy encodings priced no faster]: a bfloat16 copy's op measured faster than the
    op by noise made store-all with it "faster" (allow_lossy): a lossy plan at a limit
    store-all met. Every run measured 1 ms faster here: the lossy encodings' cost at least
    their op's time; exact ones (a ReLU's bool mask) keep what they measured."""
    profile = measured.profile

    def faster(*args, **kwargs):
        result = profile(*args, **kwargs)
        costs = [(enc_s, enc_ws, -1e-3, run_ws)
                 for enc_s, enc_ws, _, run_ws in result.variant_costs]
        return dataclasses.replace(result, variant_costs=costs)

    monkeypatch.setattr(measured, "profile", faster)
    model, x, _ = models.small_cnn()
    problem = monet_opt.lower_problem(model, x, profile_repeats=1, allow_lossy=True)
    lossy = [v for v in problem.variants
             if v.encode_ops and not variants.family(v.name.split(":")[0]).exact]
    assert lossy and all(v.extra_time_s == 0.0 for v in lossy)
    assert all(v.extra_time_s == -1e-3 for v in problem.variants if v not in lossy)
