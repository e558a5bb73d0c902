"""NOTE [Reentrant checkpoints]: a model that checkpoints its blocks with use_reentrant=True (HF's
gradient_checkpointing_enable) trains as eager trains it; before, the traced step gave the
checkpointed blocks no gradient."""
from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                     create_selective_checkpoint_contexts)

import monet_opt
from tests.models import gpt2_tiny
from tests.records import assert_same_grads, at_least_peak
from tests.test_executor import assert_plans_train_like_eager

HUGE = 1 << 40


def _checkpointed(frozen_embeddings: bool):
    torch.manual_seed(0)
    model, x, loss_fn = gpt2_tiny()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    if frozen_embeddings:  # the embeddings' output then needs no gradient, nor the blocks'
        model.transformer.wte.requires_grad_(False)
        model.transformer.wpe.requires_grad_(False)
    return model, x, loss_fn


def _grads(module, owner, x, loss_fn) -> dict[str, torch.Tensor | None]:
    owner.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    loss_fn(module(**x)).backward()
    return {n: None if p.grad is None else p.grad.clone() for n, p in owner.named_parameters()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (u is None and v is None) or (u is not None and v is not None and torch.equal(u, v))
        for u, v in zip(a.values(), b.values()))


@pytest.mark.parametrize("share", [None, 3])
def test_reentrant_checkpoints_train_as_eager(share):
    """Every parameter gets eager's gradient, bitwise, with dropout, at the store-all plan and at
    a third of its activations (the checkpoints' own recomputation left to the plan)."""
    model, x, loss_fn = _checkpointed(frozen_embeddings=False)
    with warnings.catch_warnings():  # HF's hook on the embeddings computes on tensors only
        warnings.simplefilter("error", monet_opt.HookWarning)
        opt = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_dir=None,
                                 profile_repeats=1)
    if share is not None:
        p = opt.plan
        opt = monet_opt.optimize(copy.deepcopy(model), x, p.fixed_bytes + p.gradient_bytes
                                 + p.store_all_activation_bytes // share, profile_dir=None,
                                 profile_repeats=1, time_limit_s=10)
        assert opt.plan.recomputed_ops > 0
    eager = copy.deepcopy(model)
    want = _grads(eager, eager, x, loss_fn)
    assert all(g is not None for g in want.values())
    assert _same(_grads(opt, opt.model, x, loss_fn), want)


class _Checkpointed(nn.Module):
    """A frozen input layer, two reentrant-checkpointed blocks with dropout, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 32).requires_grad_(False)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Dropout(0.2))
                                    for _ in range(2))
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=True)
        return self.head(h)


def test_checkpoints_whose_inputs_need_no_gradient():
    """Nothing a checkpoint is handed needs a gradient: eager's backward never runs it, so the
    blocks get no gradient and the head does; the same here."""
    torch.manual_seed(0)
    model, x = _Checkpointed(), {"x": torch.randn(16, 8)}
    loss_fn = lambda out: out.square().sum()  # noqa: E731
    opt = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_dir=None, profile_repeats=1)
    eager = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch: none of the inputs have requires_grad
        want = _grads(eager, eager, x, loss_fn)
    assert want["blocks.0.0.weight"] is None and want["head.weight"] is not None
    assert _same(_grads(opt, opt.model, x, loss_fn), want)


def _prefer_recompute_but_matmuls(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else \
        CheckpointPolicy.PREFER_RECOMPUTE


class _SelectiveBlocks(nn.Module):
    """Residual MLP blocks with dropout, each checkpointed with a selective policy."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1),
                                                  nn.Linear(64, 32)) for _ in range(4))

    def forward(self, x):
        context = functools.partial(create_selective_checkpoint_contexts,
                                    _prefer_recompute_but_matmuls)
        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=False, context_fn=context)
        return x.square().mean()


def test_selective_checkpoints_are_planned_as_plain_calls():
    """The policy's tags sent our rebuilt graph to torch's min-cut partitioner, which failed on
    it (NOTE [Selective checkpointing's tags]); the plan now chooses, and dropout's masks, the
    gradients and the predicted peak are eager's and the measured."""
    torch.manual_seed(0)
    model, x = _SelectiveBlocks(), torch.randn(64, 32)
    eager = copy.deepcopy(model)
    opt, _ = at_least_peak(model, x)
    assert opt.plan.recomputed_ops > 0
    assert_same_grads(opt, model, eager, x, steps=2, seeded=True)
    measured = monet_opt.measure_peak(lambda: opt(x).backward(),
                                      monet_opt.resident_tensors(model, x))
    assert measured <= opt.plan.predicted_peak_bytes


class _NormedBlock(nn.Module):
    """A conv stem, then a checkpointed conv-BatchNorm-ReLU-dropout block, then a head; with
    `saved`, a selective checkpoint whose policy saves those ops."""

    def __init__(self, reentrant: bool, saved: tuple = (), norm=nn.BatchNorm2d) -> None:
        super().__init__()
        self.reentrant, self.saved = reentrant, saved
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), norm(8), nn.ReLU(),
                                   nn.Dropout(0.2))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        context = {"context_fn": functools.partial(create_selective_checkpoint_contexts,
                                                   list(self.saved))} if self.saved else {}
        h = checkpoint(self.block, self.stem(x), use_reentrant=self.reentrant, **context)
        return self.head(h.mean((2, 3)))


@pytest.mark.parametrize("reentrant", [False, True])
def test_batch_norm_in_a_checkpoint_updates_its_statistics_as_eager(reentrant):
    """NOTE [BatchNorm in a checkpoint]: eager's backward runs the block again and its
    BatchNorm updates the running statistics a second time; the step updated them once
    (num_batches_tracked 1 against eager's 2, running statistics apart). Now the buffers are
    eager's bitwise over three steps, with the gradients, at store-all and at the least peak,
    memory at the prediction."""
    torch.manual_seed(0)
    base, x = _NormedBlock(reentrant), torch.randn(4, 3, 8, 8)
    loss_fn = lambda out: out.sum()  # noqa: E731
    for opt in assert_plans_train_like_eager(base, x, loss_fn,
                                             "BatchNorm in a checkpoint vs eager"):
        assert opt.model.block[1].num_batches_tracked.item() == 2 * (1 + 3)


class _OwnBatchNorm(nn.BatchNorm2d):
    """A BatchNorm whose forward calls F.batch_norm itself, as timm's BatchNormAct2d does."""

    def forward(self, x):
        self.num_batches_tracked.add_(1)
        return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                        self.bias, self.training, self.momentum, self.eps)


class _SuperBatchNorm(nn.BatchNorm2d):
    def forward(self, x):
        return super().forward(x) * 2.0


_NORMS = {"own forward": _OwnBatchNorm, "super().forward": _SuperBatchNorm,
          "InstanceNorm": functools.partial(nn.InstanceNorm2d, affine=True,
                                            track_running_stats=True)}


@pytest.mark.parametrize("kind", list(_NORMS))
def test_every_norm_with_running_statistics_in_a_checkpoint_updates_them_as_eager(kind):
    """NOTE [BatchNorm in a checkpoint]: only _BatchNorm.forward ran twice, so a subclass with
    a forward of its own (timm's BatchNormAct2d: regnety_002 with set_grad_checkpointing() had
    129 of 132 buffers off eager's) and a tracked InstanceNorm updated their statistics once
    where eager's backward updates them again, silently; a forward calling its base class's
    must update them twice, not three times."""
    torch.manual_seed(0)
    base, x = _NormedBlock(False, norm=_NORMS[kind]), torch.randn(4, 3, 8, 8)
    loss_fn = lambda out: out.sum()  # noqa: E731
    for opt in assert_plans_train_like_eager(base, x, loss_fn, f"a norm with {kind}"):
        if kind != "InstanceNorm":  # it counts no batches
            assert opt.model.block[1].num_batches_tracked.item() == 2 * (1 + 3)


@pytest.mark.parametrize("saved", ["batch_norm", "convolution"])
def test_a_selective_checkpoint_runs_again_what_its_policy_does_not_save(saved):
    """NOTE [Selective checkpoints' BatchNorms]: a policy that saves the BatchNorm's op updates
    its running statistics once a step in eager (its count twice); the step updated them twice,
    0.0088 from eager's in two steps. Now buffers and gradients are eager's bitwise, whether the
    policy saves the BatchNorm or another op."""
    torch.manual_seed(0)
    op = getattr(torch.ops.aten, f"native_{saved}" if saved == "batch_norm" else saved).default
    base, x = _NormedBlock(False, (op,)), torch.randn(4, 3, 8, 8)
    loss_fn = lambda out: out.sum()  # noqa: E731
    for opt in assert_plans_train_like_eager(base, x, loss_fn, f"a policy saving {saved}"):
        assert opt.model.block[1].num_batches_tracked.item() == 2 * (1 + 3)


class _NestedOut(nn.Module):
    """A reentrant checkpoint whose block returns its tensors inside a structure of `kind`."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind, self.a, self.b, self.c = kind, nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2)

    def block(self, h):
        y = torch.tanh(self.b(h))
        return {"dict": {"y": y}, "list": [y, 2 * y], "nested": (y, (2 * y,))}[self.kind]

    def forward(self, x):
        out = checkpoint(self.block, self.a(x), use_reentrant=True)
        z = out["y"] if self.kind == "dict" else out[0] + (out[1] if self.kind == "list"
                                                           else out[1][0])
        return self.c(z)


@pytest.mark.parametrize("kind", ["dict", "list", "nested"])
def test_a_reentrant_checkpoint_tracks_its_top_level_tensors_alone(kind):
    """NOTE [What a reentrant checkpoint tracks]: eager gives the block and what is before it
    no gradient through a tensor in a dict or list, nor through a nested tuple's second
    (the step gave them gradients: where eager's were None, or other values)."""
    torch.manual_seed(0)
    model, x = _NestedOut(kind), {"x": torch.randn(16, 8)}
    loss_fn = lambda out: out.square().sum()  # noqa: E731
    opt = monet_opt.optimize(copy.deepcopy(model), x, HUGE, profile_dir=None, profile_repeats=1)
    eager = copy.deepcopy(model)
    want = _grads(eager, eager, x, loss_fn)
    assert (want["a.weight"] is None) == (kind != "nested") and want["c.weight"] is not None
    assert _same(_grads(opt, opt.model, x, loss_fn), want)
