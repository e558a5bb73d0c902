"""Models a traced step cannot hold are refused before tracing, saying what to do."""
from __future__ import annotations

import contextlib
import copy
import re
import warnings

import pytest
import torch
from torch import nn

import monet_opt

HUGE = 1 << 40


def test_sparse_embedding_says_so():
    """A sparse gradient cannot come out of a traced backward: said before tracing (it failed
    deep inside AOTAutograd), and a frozen sparse embedding, which makes none, trains."""
    model = nn.Sequential(nn.Embedding(50, 8, sparse=True), nn.Linear(8, 2))
    ids = torch.randint(0, 50, (4, 6))
    with pytest.raises(monet_opt.CaptureError, match=r"Embedding '0' has sparse=True"):
        monet_opt.optimize(model, ids, HUGE, profile_dir=None)
    model[0].weight.requires_grad_(False)
    opt = monet_opt.optimize(model, ids, HUGE, profile_dir=None, profile_repeats=1)
    opt(ids).sum().backward()
    assert model[1].weight.grad is not None and model[0].weight.grad is None


def test_cumulative_batch_norm_says_so():
    """BatchNorm with momentum=None reads 1 / num_batches_tracked as a number each step: said
    before tracing, naming the module (it failed with a DataDependentOutputException and no
    line); in eval mode it has nothing to update, and trains."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, momentum=None), nn.ReLU())
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(monet_opt.CaptureError, match=r"BatchNorm2d '1' has momentum=None"):
        monet_opt.optimize(model.train(), x, HUGE, profile_dir=None)
    opt = monet_opt.optimize(model.eval(), x, HUGE, profile_dir=None, profile_repeats=1)
    opt(x).sum().backward()
    assert model[0].weight.grad is not None
    model.train()  # planned in eval mode, now trained: it said to optimize() in eval mode
    with pytest.raises(monet_opt.CaptureError, match="train it in eval mode"):
        opt(x)


def test_parallel_wrappers_say_to_wrap_the_result():
    """DataParallel (and DistributedDataParallel, whose traced step kept each rank's gradients
    its own, silently, on two processes) run their work in Python around the forward: refused,
    saying to optimize the module inside and wrap the result."""
    model = nn.DataParallel(nn.Linear(4, 2))
    with pytest.raises(TypeError, match=r"wrapped in DataParallel.*DistributedDataParallel\("
                                        r"monet_opt.optimize\(model"):
        monet_opt.optimize(model, torch.randn(3, 4), HUGE, profile_dir=None)
    # inside the model (DDP's buffer broadcast was blamed as random numbers drawn in Python)
    with pytest.raises(TypeError, match=r"wrapped in DataParallel \(a module inside it\)"):
        monet_opt.optimize(nn.Sequential(model, nn.ReLU()), torch.randn(3, 4), HUGE,
                           profile_dir=None)


def test_lazy_module_says_to_call_it_first():
    """A lazy module's shapes come from its first call, which a trace cannot make: said before
    tracing, naming the module, with no HookWarning for its initializing hook (it failed on
    every route with "uninitialized parameter"); called once first, it trains like eager."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(monet_opt.CaptureError, match=r"LazyLinear '0' is a lazy module"):
            monet_opt.optimize(model, x, HUGE, profile_dir=None)
    with torch.no_grad():
        model(x)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    opt(x).sum().backward()
    eager(x).sum().backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters()))


class MaskedLoss(nn.Module):
    """A masked-language-model loss over the masked positions only, picked by a boolean mask."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(100, 16), nn.Linear(16, 100)

    def forward(self, ids, labels):
        logits = self.out(torch.tanh(self.emb(ids)))
        keep = labels != -100
        return nn.functional.cross_entropy(logits[keep], labels[keep])


def test_a_boolean_mask_index_says_what_to_do_instead():
    """Indexing by a boolean mask makes a shape that depends on values (nonzero): the error
    names the line, and says to mask instead (it said only to avoid .item() and .tolist())."""
    ids = torch.randint(0, 100, (4, 16))
    labels = torch.where(torch.arange(16) % 4 == 0, ids, -100)
    with pytest.raises(monet_opt.CaptureError, match=r"(?s)logits\[keep\], labels\[keep\].*"
                       r"boolean mask.*ignore_index=-100"):
        monet_opt.optimize(MaskedLoss(), (ids, labels), HUGE, profile_dir=None)


class Speech(nn.Module):
    """A CTC model; `with_loss`: it returns CTC's loss, its lengths passed as tensors."""

    def __init__(self, with_loss: bool) -> None:
        super().__init__()
        self.conv, self.out, self.with_loss = nn.Conv1d(8, 16, 3, padding=1), nn.Linear(16, 6), \
            with_loss

    def forward(self, feats, targets=None, in_len=None, tgt_len=None):
        logp = self.out(torch.relu(self.conv(feats)).transpose(1, 2)).log_softmax(-1)
        logp = logp.transpose(0, 1)
        return nn.functional.ctc_loss(logp, targets, in_len, tgt_len) if self.with_loss else logp


def test_a_loss_whose_shape_depends_on_values_says_to_compute_it_outside():
    """CTC's loss with tensor lengths sizes its work by their values: the error names the op
    and says to compute the loss outside (its hint spoke of .item() and boolean masks); the
    model returning the log-probabilities, with the loss outside, trains like eager."""
    torch.manual_seed(0)
    feats, targets = torch.randn(2, 8, 20), torch.randint(1, 6, (2, 5))
    lengths = (torch.full((2,), 20), torch.tensor([5, 4]))
    with pytest.raises(monet_opt.CaptureError, match=r"(?s)aten._ctc_loss.Tensor makes an output "
                       r"whose shape depends.*return the log-probabilities"):
        monet_opt.optimize(Speech(True), (feats, targets, *lengths), HUGE, profile_dir=None)
    model = Speech(False)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, feats, HUGE, profile_dir=None, profile_repeats=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", monet_opt.OutputGradientWarning)
        for module in (opt, eager):
            nn.functional.ctc_loss(module(feats), targets, *lengths).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters()))


class Packed(nn.Module):
    """A GRU over sequences of several lengths, packed."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.out = nn.GRU(8, 32, batch_first=True), nn.Linear(32, 1)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                   enforce_sorted=False)
        out, _ = nn.utils.rnn.pad_packed_sequence(self.rnn(packed)[0], batch_first=True)
        return self.out(out).square().mean()


def test_packed_sequences_say_to_run_on_the_padded_batch():
    """pack_padded_sequence packs by the lengths' values: the hint spoke of losses and CTC;
    it says to run the layer on the padded batch and mask (which gives a packed GRU's
    gradients to 4e-7, by hand)."""
    x, lengths = torch.randn(4, 20, 8), torch.tensor([20, 15, 9, 3])
    with pytest.raises(monet_opt.CaptureError, match=r"(?s)pack_padded_sequence packs by the "
                       r"values of the lengths.*padded batch.*gather at lengths - 1"):
        monet_opt.optimize(Packed(), (x, lengths), HUGE, profile_dir=None)


class Policy(nn.Module):
    """REINFORCE's loss: actions sampled from a Categorical, their log-probabilities weighted."""

    def __init__(self, validate: bool) -> None:
        super().__init__()
        self.body, self.validate = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4)), \
            validate

    def forward(self, obs, returns):
        dist = torch.distributions.Categorical(logits=self.body(obs),
                                               validate_args=self.validate)
        return -(dist.log_prob(dist.sample()) * returns).mean()


def test_distribution_argument_checks_say_to_turn_them_off(capfd):
    """torch.distributions checks its arguments' values (a data-dependent .all()): the error
    says to pass validate_args=False, and torch's log of the value-dependent size ("Unable to
    find user code corresponding to {u0}") is not printed beside it; so built, the policy's
    step samples and trains as eager does, the same seed drawing the same actions."""
    obs, returns = torch.randn(16, 8), torch.randn(16)
    with pytest.raises(monet_opt.CaptureError, match=r"validate_args=False"):
        monet_opt.optimize(Policy(True), (obs, returns), HUGE, profile_dir=None)
    assert "Unable to find user code" not in capfd.readouterr().err
    torch.manual_seed(0)
    model = Policy(False)
    eager = copy.deepcopy(model)
    opt = monet_opt.optimize(model, (obs, returns), HUGE, profile_dir=None, profile_repeats=1)
    for module in (opt, eager):
        torch.manual_seed(1)
        module(obs, returns).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters()))


def test_an_input_the_model_cannot_take_says_to_check_eager():
    """An integer batch for a float model traces (fake tensors check no dtypes) and fails in
    the profiler's real run: a CaptureError (was a RuntimeError) with the op's message, what
    to check and the question to ask."""
    with pytest.raises(monet_opt.CaptureError, match=r"(?s)fails on sample_input at aten\.addmm"
                       r".*same dtype.*Check sample_input's dtypes.*runs eagerly on sample_input"):
        monet_opt.optimize(nn.Linear(8, 2), torch.randint(0, 3, (4, 8)), HUGE, profile_dir=None)


def test_a_call_with_a_shape_the_model_rejects_says_it_was_the_call(capfd):
    """An optimized module called with larger images than its Linear takes: the error says it
    was this call, with both shapes (it said optimize() could not trace, located the failure
    in FX's generated code, "<string>:1", and torch logged 54 lines of tracebacks on stderr);
    a batch of the planned shape still trains."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 8 * 8, 2))
    x = torch.randn(2, 3, 8, 8)
    opt = monet_opt.optimize(model, x, HUGE, profile_dir=None, profile_repeats=1)
    capfd.readouterr()
    with pytest.raises(monet_opt.CaptureError) as err:
        opt(torch.randn(2, 3, 10, 10))
    assert str(err.value).startswith("monet_opt could not trace Sequential")
    assert re.search(r"a call of the optimized module, planning a step for inputs of new shapes "
                     r"\(float32\[2x3x10x10\]\); the first plan was for float32\[2x3x8x8\]",
                     str(err.value))
    assert "<string>" not in str(err.value)
    # the model, run eagerly on this call's inputs, fails too: said of them, not sample_input
    assert re.search(r"What to try: the model fails on these inputs run eagerly too "
                     r"\(RuntimeError: mat1 and mat2.*\): fix these inputs", str(err.value))
    assert "sample_input" not in str(err.value) and "Else:" not in str(err.value)
    assert "failed while attempting to run meta" not in capfd.readouterr().err
    opt(x).sum().backward()
    assert model[2].weight.grad is not None


class Pick(nn.Module):
    """Picks a head by a number it draws: data-dependent on every route."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        k = int(torch.empty(1).uniform_(0.0, 3.0).item())
        return self.heads[k](x).sum()


def test_export_failing_prints_no_partial_graph(capsys):
    """torch.export printed the graph it had traced to stderr before failing (NOTE [Export's
    partial graph]): only the error, naming the line, is left."""
    with pytest.raises(monet_opt.CaptureError, match=r"k = int\(torch.empty"):
        monet_opt.optimize(Pick(), torch.randn(4, 8), HUGE, profile_dir=None)
    assert "def forward" not in capsys.readouterr().err


class _InputGrad(nn.Module):
    """A forward that turns its input to need a gradient unless told not to."""

    def __init__(self, turn: bool) -> None:
        super().__init__()
        self.turn, self.lin, self.bias = turn, nn.Linear(5, 5), nn.Parameter(torch.randn(5))

    def forward(self, x):
        if self.turn:
            x.requires_grad_()
        else:  # an in-place op with a parameter makes the input need one too: eager allows it
            x.add_(self.bias)
        return self.lin(x).tanh() * x


def test_an_input_turned_to_need_grad_says_to_set_it_before():
    """NOTE [Inputs turned to need grad] (monet_opt/input_spec.py): the step gave such an input
    no gradient, silently; now optimize() says to set requires_grad before the call, and an
    input so passed gets eager's gradient. An input the forward changes in place with a
    parameter is not refused and trains like eager."""
    torch.manual_seed(0)
    x = torch.randn(3, 5)
    with pytest.raises(monet_opt.CaptureError, match="requires_grad_\\(\\) outside the module"):
        monet_opt.optimize(_InputGrad(True), x.clone(), HUGE, profile_repeats=1,
                           profile_dir=None)
    for model, given in ((_InputGrad(False), lambda: x.clone()),
                         (nn.Sequential(nn.Linear(5, 5), nn.Tanh()),
                          lambda: x.clone().requires_grad_())):
        eager = copy.deepcopy(model)
        opt = monet_opt.optimize(model, given(), HUGE, profile_repeats=1, profile_dir=None)
        ours, theirs = given(), given()
        opt(ours).sum().backward()
        eager(theirs).sum().backward()
        assert torch.equal(ours, theirs)
        assert (ours.grad is None) == (theirs.grad is None)
        assert ours.grad is None or torch.equal(ours.grad, theirs.grad)
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                               eager.parameters()))


class _AddsIntoY(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.a = nn.Embedding(10, 8), nn.Linear(8, 8)

    def forward(self, x, y, ids):
        y.add_(1.0)
        return self.a(x) * torch.tanh(self.a(y)) + self.emb(ids).sum(1, keepdim=True)


@pytest.mark.parametrize("pair", ["twice", "overlapping", "disjoint"])
def test_inputs_sharing_a_storage_written_in_place_are_refused(pair):
    """NOTE [Inputs AOTAutograd merges]: one tensor passed twice, or views of one tensor, the
    forward adding into one: the profiler read an embedding's ids from a float input (or a
    weight as the merged base) and failed with an internal error; with the merged inputs
    last, the step measured the input's bytes over its limit. Views that do not overlap are
    not merged, but the write moved their shared version counter past the step's saved view:
    every backward failed with autograd's "modified by an inplace operation". Passed apart,
    it trains."""
    torch.manual_seed(0)
    base = torch.randn(4, 16)
    x, y = {"twice": (base[:, :8], base[:, :8]), "overlapping": (base[:, :8], base[:, 4:12]),
            "disjoint": (base[:, :8], base[:, 8:])}[pair]
    ids = torch.randint(0, 10, (4, 3))
    with pytest.raises(monet_opt.CaptureError, match="#0 and #1 .* share a storage .*clone"):
        monet_opt.optimize(_AddsIntoY(), (x, y, ids), HUGE, profile_dir=None)
    opt = monet_opt.optimize(_AddsIntoY(), (x, y.clone(), ids), HUGE, profile_dir=None)
    opt(x, y.clone(), ids).sum().backward()


class _WritesIntoX(nn.Module):
    def __init__(self, hidden: bool) -> None:
        super().__init__()
        self.a, self.hidden = nn.Linear(16, 8), hidden

    def forward(self, x):
        with torch.no_grad() if self.hidden else contextlib.nullcontext():
            x.clamp_(-1.0, 1.0)
        return self.a(x) * x.mean()


def test_a_leaf_input_written_in_place_is_refused_as_eager_refuses():
    """NOTE [Inputs written in place]: eager refuses `x.clamp_()` on a leaf input requiring grad;
    the step wrote into it and gave it the gradient of its value before the write, silently.
    Under no_grad (eager runs it) and on a non-leaf input the step trains as eager does."""
    torch.manual_seed(0)
    x = torch.randn(4, 16, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        _WritesIntoX(hidden=False)(x.clone().detach().requires_grad_())
    with pytest.raises(monet_opt.CaptureError, match="#0 .*a leaf that requires grad"):
        monet_opt.optimize(_WritesIntoX(hidden=False), x, HUGE, profile_dir=None)
    assert torch.equal(x, x.detach())  # untouched
    for hidden, make in ((True, lambda: x.detach().clone().requires_grad_()),
                         (False, lambda: x.detach().clone().requires_grad_() * 3.0)):
        model = _WritesIntoX(hidden)
        eager = copy.deepcopy(model)
        opt = monet_opt.optimize(model, make(), HUGE, profile_dir=None)
        grads = []
        for module in (opt, eager):
            given = make()
            module(given).sum().backward()
            grads.append([given.grad if given.is_leaf else None, model.a.weight.grad
                          if module is opt else eager.a.weight.grad])
        assert all(a is None and b is None or torch.equal(a, b) for a, b in zip(*grads))



class Branching(nn.Module):
    """torch.cond between a branch that saves one tensor and one that saves four."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        h = self.lin(x)
        return torch.cond(h.sum() > 0, lambda t: t * 2.0,
                          lambda t: t.sin().exp().tanh().sigmoid(), (h,))


def test_torch_cond_is_refused_naming_the_module():
    """NOTE [Branches taken by value]: a plan measured on the sample's branches passed its
    limit by 27 % on a batch taking the others, silently; the step is refused, naming the
    module and saying to select with torch.where."""
    model = nn.Sequential(nn.Linear(16, 16), Branching())
    with pytest.raises(monet_opt.CaptureError,
                       match=r"(?s)torch.cond in Branching '1'.*torch.where"):
        monet_opt.optimize(model, torch.randn(8, 16), HUGE, profile_dir=None)


class MaskedFill(nn.Module):
    """SpecAugment's form (HF Wav2Vec2): a learned vector written where a mask is true."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.emb = nn.Linear(8, 8), nn.Parameter(torch.randn(8))

    def forward(self, x, mask):
        h = self.lin(x)
        h[mask] = self.emb
        return h.sum()


def test_a_mask_assignment_says_what_to_write_instead():
    """Its gradient for the vector indexes by the mask in the backward, where no line of the
    forward is on the stack: the error named no line and said only to avoid .item()."""
    x, mask = torch.randn(2, 5, 8), torch.rand(2, 5) < 0.5
    with pytest.raises(monet_opt.CaptureError,
                       match=r"(?s)backward indexes by a boolean mask.*x\[mask\] = v.*"
                             r"torch.where\(mask\[\.\.\., None\], v, x\)"):
        monet_opt.optimize(MaskedFill(), (x, mask), HUGE, profile_dir=None)
