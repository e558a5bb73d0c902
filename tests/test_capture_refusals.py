"""What optimize() says of models it cannot plan: sharded ones (NOTE [Sharded models] in
monet_opt/refusals.py), and the hint a CaptureError ends with (NOTE [What to try] in
monet_opt/capture_hints.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import monet_opt

HUGE = 1 << 40


def _sharded(module: nn.Module) -> nn.Module:
    """`module` with its class swapped for an FSDPModule subclass, as fully_shard swaps it."""
    from torch.distributed.fsdp import FSDPModule
    module.__class__ = type(f"FSDP{type(module).__name__}", (FSDPModule, type(module)), {})
    return module


class FSDPFriendlyMLP(nn.Sequential):
    """Not sharded: only named so."""


def test_sharded_models_are_refused_by_class_not_name():
    """NOTE [Sharded models]: fully_shard around an optimized module trained past its limit,
    silently, and a model merely named FSDP... was refused as sharded."""
    x = torch.randn(3, 4)
    opt = monet_opt.optimize(FSDPFriendlyMLP(nn.Linear(4, 2)), x, HUGE, profile_dir=None,
                             profile_repeats=1)
    opt(x).sum().backward()
    with pytest.raises(TypeError, match=r"sharded by FSDP \(a module inside it, FSDPLinear\)"):
        monet_opt.optimize(nn.Sequential(_sharded(nn.Linear(4, 2))), x, HUGE, profile_dir=None)
    _sharded(opt)
    with torch.no_grad():
        opt(x)  # nothing planned runs: validation under FSDP is the model's own
    with pytest.raises(TypeError, match=r"monet_opt: the model is sharded by FSDP: .*"
                                        r"DistributedDataParallel\(opt"):
        opt(x)


def test_a_detection_model_is_told_to_optimize_its_backbone():
    """NOTE [What to try]: a torchvision detection model was told to avoid .item() at the
    line named, then at the next, and to pass use_cache=False to HF models."""
    import torchvision
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None).train()
    images = [torch.rand(3, 64, 80), torch.rand(3, 64, 80)]
    targets = [{"boxes": torch.tensor([[4.0, 4.0, 30.0, 40.0]]), "labels": torch.tensor([1])}
               for _ in images]
    with pytest.raises(monet_opt.CaptureError) as info:
        monet_opt.optimize(model, (images, targets), HUGE, profile_dir=None)
    text = str(info.value)
    assert "optimize its backbone alone" in text and "use_cache" not in text
    assert "avoid data-dependent Python" not in text  # the generic line: only without a hint


class _Branching(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) if x.sum() > 0 else -self.lin(x)


def test_the_generic_hint_names_hf_caches_for_hf_models_only():
    with pytest.raises(monet_opt.CaptureError) as info:
        monet_opt.optimize(_Branching(), torch.ones(2, 4), HUGE, profile_dir=None)
    assert "avoid data-dependent Python" in str(info.value)
    assert "use_cache" not in str(info.value)


def test_the_cache_is_named_only_to_models_that_keep_one():
    """The generic line told every HF model to pass use_cache=False, Wav2Vec2 (no cache) too."""
    from transformers import GPT2Config, GPT2LMHeadModel, Wav2Vec2Config, Wav2Vec2ForCTC
    from monet_opt.capture_hints import generic
    speech = Wav2Vec2ForCTC(Wav2Vec2Config(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), vocab_size=10))
    decoder = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50))
    assert "use_cache" not in generic(speech) and "use_cache=False" in generic(decoder)


def test_fake_quantize_modules_say_which_qconfig_traces():
    """torch.ao.quantization.FakeQuantize (the QAT qconfig's version 0) tests its flags' values
    in Python: the error named only the user's line calling the module, advising against
    .item() there; it names the modules and the qconfig whose fake quantization traces."""
    quant = pytest.importorskip("torch.ao.quantization")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 36, 4))
    model.qconfig = quant.get_default_qat_qconfig("fbgemm", version=0)
    model = quant.prepare_qat(model.train())
    x = torch.randn(2, 3, 8, 8)
    model(x)  # sizes the observers
    with pytest.raises(monet_opt.CaptureError, match=r"(?s)What to try:\nIts torch\.ao\."
                       r"quantization\.FakeQuantize modules \(0\.weight_fake_quant.*version 1"):
        monet_opt.optimize(model, x, HUGE, profile_dir=None)


def test_an_adaptive_softmax_says_what_traces():
    """nn.AdaptiveLogSoftmaxWithLoss picks rows by the targets' values: the error advised
    against boolean masks the user's code has none of; it says to gather from log_prob."""
    model = nn.ModuleDict({"lin": nn.Linear(16, 32),
                           "head": nn.AdaptiveLogSoftmaxWithLoss(32, 200, cutoffs=[20, 80])})

    class _Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.parts = model

        def forward(self, x, y):
            return self.parts["head"](self.parts["lin"](x), y).loss

    x, y = torch.randn(12, 16), torch.randint(0, 200, (12,))
    with pytest.raises(monet_opt.CaptureError) as caught:
        monet_opt.optimize(_Net(), (x, y), HUGE, profile_dir=None)
    said = str(caught.value)
    assert "AdaptiveLogSoftmaxWithLoss (parts.head)" in said and ".gather(1, target" in said
    assert "x[mask]" not in said


def _log_norm(grad):
    grad.norm().item()


class _HookReadsValue(nn.Module):
    """A tensor hook, which needs grad mode, that logs the gradient's norm."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        y = self.l(x)
        y.register_hook(_log_norm)
        return y.relu()


def test_a_forward_that_needs_grad_mode_is_not_said_to_fail_eagerly():
    """NOTE [The eager check in grad mode]: the eager check ran under no_grad only, where
    register_hook raises, and told a model that trains eagerly 'tracing is not the cause'."""
    x = torch.randn(4, 8)
    _HookReadsValue()(x).sum().backward()  # eager trains
    with pytest.raises(monet_opt.CaptureError) as err:
        monet_opt.optimize(_HookReadsValue(), x, HUGE, profile_dir=None, profile_repeats=1)
    assert "tracing is not the cause" not in str(err.value)
    assert "What to try: avoid data-dependent Python" in str(err.value)


class _CondOverModules(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: self.a(t), lambda t: self.b(t), (x,))


def test_torch_cond_over_modules_is_told_to_select_with_where():
    """torch.cond whose branches call modules fails to trace before the branch refusal (NOTE
    [Branches taken by value]) sees it: it was told to avoid .item() at a line without one."""
    x = torch.randn(4, 8)
    _CondOverModules()(x).sum().backward()
    with pytest.raises(monet_opt.CaptureError,
                       match=r"(?s)What to try:\nThere, a higher-order op \(torch.cond.*"
                             r"torch.where\(pred, a, b\)") as err:
        monet_opt.optimize(_CondOverModules(), x, HUGE, profile_dir=None, profile_repeats=1)
    assert ".item()" not in str(err.value).split("What to try:")[1]


def test_a_sliced_sample_is_told_to_clone_not_make_contiguous():
    """NOTE [Inputs viewing more]: the note said to pass .contiguous() copies, which a leading
    slice (X[:8]) already is: the same view, the same error again. .clone() is the copy."""
    torch.manual_seed(0)
    model, data = nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.randn(64, 8)
    notes = []
    for sample in (data[:8], data[:8].clone()):
        with pytest.raises(monet_opt.InfeasibleBudgetError) as err:
            monet_opt.optimize(model, sample, 1, profile_dir=None, profile_repeats=1)
        notes.append(" ".join(getattr(err.value, "__notes__", [])))
    assert "Pass them as .clone() copies" in notes[0] and "larger storage" not in notes[1]


class _TiedHead:
    """A helper, not a module, holding the embedding's weight for a tied output head."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def __call__(self, h):
        return h @ self.weight.t()


class _TiedThroughHelper(nn.Module):
    def __init__(self, prior: bool) -> None:
        super().__init__()
        self.embed, self.mu = nn.Embedding(20, 8), nn.Parameter(torch.zeros(8))
        self.head = _TiedHead(self.embed.weight)
        self.prior = torch.distributions.Normal(self.mu, 1.0, validate_args=False) \
            if prior else None

    def forward(self, ids):
        h = self.embed(ids)
        if self.prior is not None:
            h = h + self.prior.loc
        return self.head(h)


@pytest.mark.parametrize("prior", [False, True], ids=["tied head", "distribution"])
def test_a_parameter_read_through_an_object_is_refused(prior):
    """NOTE [Parameters read through objects]: the step held it as a constant and gave it no
    gradient, silently (a tied embedding 4.8e-2 off eager's; a prior's mean never trained)."""
    ids = torch.randint(0, 20, (2, 5))
    _TiedThroughHelper(prior)(ids).sum().backward()  # eager trains it
    with pytest.raises(monet_opt.CaptureError, match=r"reads a tensor that trains .* through "
                       r"an object that is not the model's module"):
        monet_opt.optimize(_TiedThroughHelper(prior), ids, HUGE, profile_dir=None,
                           profile_repeats=1)


class _Reversible(torch.autograd.Function):
    """A recomputation written by hand: the forward keeps only the input, the backward runs
    the submodule it was handed again and backpropagates into its parameters."""

    @staticmethod
    def forward(ctx, x, f):
        ctx.f = f
        ctx.save_for_backward(x)
        with torch.no_grad():
            return x + f(x)

    @staticmethod
    def backward(ctx, dy):
        x = ctx.saved_tensors[0].detach().requires_grad_()
        with torch.enable_grad():
            torch.autograd.backward(x + ctx.f(x), dy)
        return x.grad, None


class _HandRecomputed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f, self.inp, self.out = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        return self.out(_Reversible.apply(self.inp(x), self.f))


def test_a_submodule_run_in_a_functions_backward_is_refused_and_the_model_kept():
    """NOTE [Parameters read through objects] and NOTE [Gradients a trace left]: the advice
    was to register the holder (it is registered), and the trace's gradients were left on
    its parameters, so the model's next eager backward failed."""
    model, x = _HandRecomputed(), torch.randn(4, 8)
    with pytest.raises(monet_opt.CaptureError, match=r"read only by the backward.*custom "
                       r"autograd\.Function.*without the custom Function"):
        monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    assert all(p.grad is None for p in model.parameters())
    model(x).sum().backward()  # eager trains it still
    assert all(p.grad is not None for p in model.parameters())


class _SharedInAList(nn.Module):
    """A trained layer kept out of the model's registry, in a list (or a plain processor)."""

    def __init__(self, shared: nn.Module) -> None:
        super().__init__()
        self.own, self.shared = nn.Linear(8, 8), [shared]

    def forward(self, x):
        return self.shared[0](self.own(x))


def test_a_parameter_outside_the_model_is_refused():
    """It got no gradient, silently (0 of 16 LoRA gradients in a plain processor object)."""
    x = torch.randn(2, 8)
    with pytest.raises(monet_opt.CaptureError, match=r"reads a tensor that trains"):
        monet_opt.optimize(_SharedInAList(nn.Linear(8, 8)), x, HUGE, profile_dir=None,
                           profile_repeats=1)
    frozen = _SharedInAList(nn.Linear(8, 8).requires_grad_(False))  # a teacher: a constant
    monet_opt.optimize(frozen, x, HUGE, profile_dir=None, profile_repeats=1)(x).sum().backward()
    assert frozen.own.weight.grad is not None



class _LeastSquares(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(8, 8)

    def forward(self, x):
        h = self.f(x)
        return torch.linalg.lstsq(h.mT @ h + torch.eye(8), h.mT, driver="gels").solution


def test_lstsq_in_a_model_is_told_what_traces_instead():
    """The hint said to compute it outside the module, as CTC's loss: no advice for a layer
    (exotic ops probe, 2026-12-07)."""
    with pytest.raises(monet_opt.CaptureError, match=r"torch\.linalg\.lstsq sizes its other "
                       r"outputs.*torch\.linalg\.pinv\(A\) @ B") as caught:
        monet_opt.optimize(_LeastSquares(), torch.randn(3, 12, 8), HUGE, profile_dir=None)
    assert "ctc_loss" not in str(caught.value)


class _CarryingParameter(nn.Parameter):
    """A parameter subclass carrying Python state, as bitsandbytes' Int8Params carries .CB."""

    def __new__(cls, data):
        p = super().__new__(cls, data)
        p.CB = None
        return p


class _Carrying(nn.Linear):
    def __init__(self) -> None:
        super().__init__(8, 4)
        self.weight = _CarryingParameter(self.weight.data)

    def forward(self, x):
        return nn.functional.linear(x, self.weight if self.weight.CB is None else self.weight.CB)


class _Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(8, 3)

    def forward(self, x):
        return torch.distributions.Categorical(logits=self.f(x), validate_args=False)


@pytest.mark.parametrize("model, says", [
    (_Carrying, r"reads \.CB from a tensor: an attribute a tensor subclass.*optimize the "
                r"modules around them"),
    (_Policy, r"returns a torch\.distributions\.categorical\.Categorical.*return the "
              r"distribution's parameters instead")])
def test_what_a_trace_cannot_hold_says_what_to_do(model, says):
    """Each was told to avoid .item() or to read out.dtype outside the step (quantization and
    RL probes, 2026-12-07)."""
    with pytest.raises(monet_opt.CaptureError, match=says) as caught:
        monet_opt.optimize(model(), torch.randn(4, 8), HUGE, profile_dir=None)
    assert ".item()" not in str(caught.value) and "out.dtype" not in str(caught.value)


class _FunctionalSparse(nn.Module):
    """A table looked up with F.embedding or F.embedding_bag, sparse=True (DLRM-style)."""

    def __init__(self, bag: bool) -> None:
        super().__init__()
        self.bag, self.table, self.head = bag, nn.Parameter(torch.randn(30, 4)), nn.Linear(4, 1)

    def forward(self, ids):
        rows = nn.functional.embedding_bag(ids, self.table, sparse=True) if self.bag else \
            nn.functional.embedding(ids, self.table, sparse=True).sum(1)
        return self.head(rows)


@pytest.mark.parametrize("bag", [False, True])
def test_a_functional_sparse_lookup_says_so(bag):
    """An nn.Embedding with sparse=True is refused before the trace; a functional lookup
    with sparse=True failed inside the partitioner ("memory format option is only supported
    by strided tensors", naming neither the op nor what to do). Said now, with the optimizer
    that takes the dense gradient."""
    with pytest.raises(monet_opt.CaptureError, match="gradient is a sparse tensor.*"
                       "sparse=False.*SparseAdam takes only sparse ones: use Adam"):
        monet_opt.optimize(_FunctionalSparse(bag), torch.randint(0, 30, (4, 6)), 1 << 30,
                           profile_dir=None, profile_repeats=1)
