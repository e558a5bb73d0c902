"""NOTE [Profiling within the limit] (monet_opt/profile_memory.py): given a limit in bytes below
eager's step, the profiling pass holds no more than the limit, times every op as before, and the
plan made from its profile trains bitwise like eager within the limit."""
from __future__ import annotations

import copy

import pytest
import torch

import monet_opt
from monet_opt import profile_memory, profiler
from monet_opt.memory import LiveBytes
from solvers.peak_bound import least_peak_bound
from tests.models import SmallCNN, TransformerBlock
from tests.records import assert_same_grads, measured_peak_of


@pytest.fixture
def walks(monkeypatch):
    """Each profiling walk's (bounded environment, its live-bytes peak)."""
    seen: list[tuple[profile_memory.BoundedEnv, int]] = []
    envs: list[profile_memory.BoundedEnv] = []
    init, walk = profile_memory.BoundedEnv.__init__, profiler._walk

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        envs.append(self)

    def measured_walk(gm, inputs, visit, *args, **kwargs):
        before = len(envs)
        with LiveBytes(t for t in inputs if isinstance(t, torch.Tensor)) as counter:
            made = walk(gm, inputs, visit, *args, **kwargs)
        seen.append((envs[-1] if len(envs) > before else None, counter.peak))
        return made

    monkeypatch.setattr(profile_memory.BoundedEnv, "__init__", recording_init)
    monkeypatch.setattr(profiler, "_walk", measured_walk)
    monkeypatch.setattr(profiler, "FLUSH_BYTES", 4096)  # the CPU cache flush: not the pass's
    return seen


def _beside(limit: int) -> int:
    """What the pass itself may hold under `limit`, on CPU: less three generator states (NOTE
    [Generator states beside the pass] in monet_opt/profiler.py). The model's buffers, each
    alone on its storage, are the pass's own inputs (NOTE [Buffers the pass reads] in
    monet_opt/pass_inputs.py)."""
    return limit - 3 * torch.get_rng_state().untyped_storage().nbytes()


def _own_peak(model, x, limit: int | None = None) -> tuple[int, int]:
    """optimize()'s own peak, measured as a whole, and its byte limit (None: 90 % of the
    eager step's peak)."""
    resident = monet_opt.resident_tensors(model, x)
    if limit is None:
        limit = int(monet_opt.measure_peak(lambda: model(x).sum().backward(), resident) * 0.9)
        model.zero_grad(set_to_none=True)
    return monet_opt.measure_peak(lambda: monet_opt.optimize(
        model, x, limit, profile_dir=None, time_limit_s=5), resident), limit


def _model_and_batch():
    torch.manual_seed(0)
    return SmallCNN().train(), torch.randn(16, 3, 32, 32)


def test_profiling_holds_no_more_than_the_limit_and_trains_like_eager(walks):
    model, x = _model_and_batch()
    store_all = monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None,
                                   time_limit_s=5).plan
    unbounded = [peak for env, peak in walks]
    assert len(unbounded) == 2 and all(env.made_again == 0 for env, _ in walks)
    walks.clear()
    # halfway from the least peak to store-all's: half the activations (over the fixed memory
    # and gradients) was under the least peak once convolutions' scratch was counted
    # (NOTE [Allocation events])
    limit = (store_all.min_feasible_bytes + store_all.store_all_peak_bytes) // 2
    assert store_all.min_feasible_bytes <= limit < store_all.store_all_peak_bytes
    opt = monet_opt.optimize(model, x, limit, profile_dir=None, time_limit_s=5)
    assert len(walks) == 2
    for (env, peak), eager_like in zip(walks, unbounded):
        assert env is not None and env.limit == _beside(limit)
        # the pass keeps the graph's own order, where making a BatchNorm's input again holds
        # its chain and the gradient in flight: a little over a plan's (NOTE [Profiling within
        # the limit])
        assert env.peak <= limit * 1.05
        assert env.made_again > 0
        assert peak < eager_like  # what the pass held, counted by the live-bytes counter
    assert opt.plan.predicted_peak_bytes <= limit
    eager = copy.deepcopy(model)
    torch.manual_seed(1)
    peak = monet_opt.measure_peak(lambda: opt(x).sum().backward(),
                                  monet_opt.resident_tensors(model, x))
    assert peak <= limit and peak == measured_peak_of(opt.plan)
    model.zero_grad(set_to_none=True)
    assert_same_grads(_Summed(opt), model, _Summed(eager), x, steps=2, seeded=True)


def test_a_limit_no_plan_can_meet_holds_the_pass_at_the_size_bound(walks):
    """A limit below the traced sizes' bound (NOTE [A least peak from sizes]) is raised to that
    bound for the pass: held to 1 byte it made almost every value again before each op."""
    model, x = _model_and_batch()
    bound = least_peak_bound(monet_opt.lower_problem(copy.deepcopy(model), x, timed=False))
    with pytest.raises(monet_opt.InfeasibleBudgetError) as caught:
        monet_opt.optimize(copy.deepcopy(model), x, 1, profile_dir=None, time_limit_s=2)
    assert caught.value.min_feasible_bytes >= bound.bytes
    # the bound of the step as traced, before the fixed memory the planner adds (the dropout's
    # generator state) is counted
    limits = [env.limit for env, _ in walks]
    assert len(limits) == 2 and all(_beside(bound.bytes - 8192) < n <= _beside(bound.bytes)
                                    for n in limits)
    problem = monet_opt.lower_problem(model, x, timed=False)
    assert profile_memory.pass_limit(None, problem) is None
    assert profile_memory.pass_limit(bound.bytes + 1, problem) == bound.bytes + 1


def test_values_only_the_output_reads_are_dropped_and_inputs_kept():
    """A parameter's gradient, read by nothing but the graph's output, is not held to the
    pass's end; a graph input is never dropped, whatever the limit."""
    gm = torch.fx.symbolic_trace(_Tiny())
    env = profile_memory.BoundedEnv(gm, 1, {})
    nodes = {n.name: n for n in gm.graph.nodes}
    env["x"] = torch.ones(4)
    env.pop("x")
    assert "x" in env  # a placeholder stays: what is made again reads it
    env.at(nodes["mul"])
    env["mul"] = env["x"] * 2
    env.made(nodes["mul"])
    assert "mul" in env  # read by the add to come
    env.at(nodes["add"])
    env["add"] = env["mul"] + 1
    env.made(nodes["add"])
    assert "add" not in env  # only the output reads it
    env.pop("mul")
    assert torch.equal(env["mul"], torch.full((4,), 2.0)) and env.made_again == 1


def test_boundaries_are_the_residual_stream_between_blocks():
    """A value that later ops alone read of what came before it is a boundary; a constant read
    throughout (a mask) does not stop it being one."""
    gm = torch.fx.symbolic_trace(_Residual())
    env = profile_memory.BoundedEnv(gm, 1, {})
    # inside a block the block's input is read again by its add; only the output reads the
    # last add
    assert list(env.boundaries) == ["relu", "add", "add_1"]


def test_a_transformer_pass_makes_again_from_the_nearest_boundary(walks, monkeypatch):
    """Held near its least peak, a stack of transformer blocks drops its residual stream last
    (NOTE [Profiling within the limit]): what is made again is made from the nearest boundary
    held, not from the start, and less than half as much is made again as where every value is
    dropped by its next read alone; the pass holds the limit either way."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[TransformerBlock(d=32, p=0.0) for _ in range(8)]).train()
    x = torch.randn(4, 64, 32)
    limit = least_peak_bound(monet_opt.lower_problem(copy.deepcopy(model), x,
                                                     timed=False)).bytes * 5 // 4

    def made_again() -> list[int]:
        walks.clear()
        try:
            monet_opt.optimize(copy.deepcopy(model), x, limit, profile_dir=None, time_limit_s=1)
        except monet_opt.InfeasibleBudgetError:
            pass  # the pass is what is measured here
        assert len(walks) == 2 and all(env.peak <= env.limit == _beside(limit)
                                       for env, _ in walks)
        return [env.made_again for env, _ in walks]

    spread = made_again()
    monkeypatch.setattr(profile_memory, "_boundaries", lambda *args: {})
    alone = made_again()
    assert all(0 < a * 2 < b for a, b in zip(spread, alone)), (spread, alone)


class _Residual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.arange(4.0))

    def forward(self, x):
        mask = self.scale > 0  # made from no input: a constant
        x = torch.relu(x)
        for _ in range(3):
            x = x + (x * 2) * mask
        return x


class _Summed(torch.nn.Module):
    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x).sum()


class _Tiny(torch.nn.Module):
    def forward(self, x):
        return (x * 2) + 1


def test_ops_past_the_time_limit_have_their_workspace():
    """NOTE [The profiling time limit]: the ops the profiler did not reach in time got no
    workspace, so a CNN's plan (its convolutions' scratch counted on CPU) predicted too little
    and measured over its limit. Past the limit their workspaces are measured still: the same
    as a full profile's (the store-all peak, which no time changes), and the plan measures
    within its limit."""
    torch.manual_seed(0)
    convs = [layer for _ in range(6) for layer in (torch.nn.Conv2d(16, 16, 3, padding=1),
                                                   torch.nn.ReLU())]
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), *convs,
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(16, 10))
    x = torch.randn(8, 3, 32, 32)
    full = monet_opt.optimize(copy.deepcopy(model), x, 1 << 40, profile_dir=None,
                              profile_repeats=1, variants=False).plan
    limit = (full.min_feasible_bytes + full.store_all_peak_bytes) // 2
    with pytest.warns(profiler.ProfileTimeLimitWarning):
        cut = monet_opt.optimize(model, x, limit, profile_dir=None, profile_repeats=1,
                                 variants=False, profile_time_limit_s=1e-9)
    assert cut.plan.store_all_peak_bytes == full.store_all_peak_bytes
    measured = monet_opt.measure_peak(lambda: cut(x).sum().backward(),
                                      monet_opt.resident_tensors(model, x))
    assert measured <= cut.plan.memory_limit_bytes


def test_optimize_as_a_whole_holds_a_byte_limit_with_kernels_scratch():
    """NOTE [An op's scratch in the bounded pass]: oneDNN's convolutions take scratch the size
    of their input beside their output, and a timed call's outputs were held beside the op's
    value: optimize() of this CNN peaked 176,935 B over the limit its plan kept within."""
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU()]
    for _ in range(6):
        layers += [torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 16 * 16, 10))
    x = torch.randn(32, 3, 32, 32)
    resident = monet_opt.resident_tensors(model, x)
    eager = monet_opt.measure_peak(lambda: model(x).sum().backward(), resident)
    model.zero_grad(set_to_none=True)
    limit = int(eager * 0.6)
    made = []
    peak = monet_opt.measure_peak(lambda: made.append(monet_opt.optimize(
        model, x, limit, profile_dir=None, time_limit_s=5)), resident)
    assert made[0].plan.predicted_peak_bytes <= limit
    assert peak <= limit


def test_optimize_with_dropout_holds_a_byte_limit():
    """NOTE [Generator states beside the pass] (monet_opt/profiler.py): three CPU generator
    states held beside the pass, and a dropout variant's draw of its op's forward beside the
    op's and the variant's results: optimize() of this MLP peaked 7,583 B over its limit."""
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128),
                   torch.nn.LayerNorm(128), torch.nn.Dropout(0.1)]
    model, x = torch.nn.Sequential(*layers), torch.randn(128, 128)
    peak, limit = _own_peak(model, x)
    assert peak <= limit


class _Positions(torch.nn.Module):
    """A table of 64 KiB held as a buffer, sliced in the forward (BERT's position_ids)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(128, 128))
        self.a, self.b = torch.nn.Linear(128, 512), torch.nn.Linear(512, 128)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x + self.table[: x.shape[0]])))


def test_optimize_holds_a_byte_limit_beside_the_models_buffers():
    """NOTE [Originals beside the pass] (monet_opt/memory.py): the pass runs on clones of the
    model's buffers while the model holds them: optimize() peaked the table's bytes over."""
    torch.manual_seed(0)
    model, x = _Positions(), torch.randn(96, 128)
    peak, limit = _own_peak(model, x)
    assert peak <= limit


class _Tanhs(torch.nn.Module):
    """An embedding, then Linear-tanh layers: a 512 KiB output trained on out.sum()."""

    def __init__(self) -> None:
        super().__init__()
        self.e = torch.nn.Embedding(4000, 64)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(6))

    def forward(self, ids):
        h = self.e(ids)
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return h


def test_optimize_near_the_least_peak_frees_the_output_gradient():
    """NOTE [Output gradients to their last use] (monet_opt/profile_walk.py): the profiler held
    its output gradient through both passes, and optimize() at 3 % over the least peak peaked
    ~11 % over its limit, where nothing else could be dropped."""
    torch.manual_seed(0)
    model, ids = _Tanhs(), torch.randint(0, 4000, (16, 128))
    with pytest.raises(monet_opt.InfeasibleBudgetError) as caught:
        monet_opt.optimize(model, ids, 1 << 20, profile_dir=None, time_limit_s=5)
    peak, limit = _own_peak(model, ids, caught.value.min_feasible_bytes * 103 // 100)
    assert peak <= limit



def test_a_step_planned_with_gradients_in_place_holds_a_byte_limit(monkeypatch):
    """The pass of a step planned with gradients in place (the second micro-batch of an
    accumulation) kept within the whole limit beside them: 26,992 B over this one's."""
    monkeypatch.setattr(profiler, "FLUSH_BYTES", 4096)  # the CPU cache flush: not the pass's
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Dropout(0.3), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(8 * 16 * 16, 10))
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    with_loss = monet_opt.WithLoss(model, torch.nn.functional.cross_entropy)
    opt = monet_opt.optimize(with_loss, (x, y), 1_200_000, profile_dir=None, time_limit_s=5)
    opt(x, y).backward()
    peak = monet_opt.measure_peak(lambda: opt(x, y).backward(),
                                  monet_opt.resident_tensors(with_loss, (x, y)))
    assert len(opt.plans) == 2, opt.plans.keys()
    assert peak <= 1_200_000
