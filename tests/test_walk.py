"""monet_opt.walk: what a step's call finds of the model is what torch finds, after any change
(NOTE [Names kept between walks])."""
import torch
from torch import nn

from monet_opt.walk import Walk, walk


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.shared = nn.Linear(4, 4, bias=False)
        self.norm = nn.BatchNorm1d(4)
        self.blocks = nn.Sequential(self.shared, nn.ReLU(), nn.Linear(4, 4))
        self.head = nn.Linear(4, 10)


def _as_torch_finds(found, model):
    modules, params, buffers = found
    assert modules == list(model.modules())
    assert list(params.items()) == list(model.named_parameters())
    assert list(buffers.items()) == list(model.named_buffers())


def test_one_walk_finds_what_torch_finds():
    """walk(): a module used twice, a tied weight, a missing bias, a buffer both modules hold."""
    shared = nn.Linear(4, 4, bias=False)
    model = nn.Sequential(nn.Embedding(10, 4), shared, nn.BatchNorm1d(4), shared,
                          nn.Linear(4, 10))
    model[4].weight = model[0].weight
    model[2].register_buffer("twice", model[2].running_mean)
    _as_torch_finds(walk(model), model)


def _rename(module: nn.Module, kind: str, old: str, new: str) -> None:
    """`old` renamed `new` in place: every object where it was."""
    setattr(module, kind, {new if k == old else k: v for k, v in getattr(module, kind).items()})


def test_a_kept_walk_sees_every_change():
    """One Walk over a model changed between calls, as a training script may change it: each
    call finds what torch finds, whether the names were kept or found again."""
    model = Net()
    changes = [
        lambda: None,
        lambda: setattr(model.head, "weight", model.embed.weight),  # tied
        lambda: setattr(model, "head", nn.Linear(4, 10)),  # replaced, same class
        lambda: model.register_module("extra", nn.Linear(2, 2)),  # added
        lambda: delattr(model, "extra"),  # removed
        lambda: model._modules.update(renamed=model._modules.pop("norm")),  # renamed
        lambda: _rename(model, "_modules", "renamed", "norm2"),  # renamed, same place
        lambda: _rename(model.head, "_parameters", "weight", "w"),
        lambda: model.blocks[2].register_parameter("bias", None),  # a parameter set to None
        lambda: setattr(model.blocks[2], "bias", nn.Parameter(torch.zeros(4))),  # and back
        lambda: setattr(model.norm2, "running_mean", torch.ones(4)),  # a buffer assigned
        lambda: model.blocks[1].register_buffer("twice", model.norm2.running_var),  # shared
        lambda: model.embed.weight.requires_grad_(False),  # not the walk's: the same
        lambda: model._modules.update(embed=model._modules.pop("embed")),  # reordered
        lambda: model.blocks.__delitem__(0),  # Sequential rebuilds its children
        lambda: setattr(model, "blocks", model.head),  # one module under two names
    ]
    kept = Walk()
    for change in changes:
        change()
        _as_torch_finds(kept(model), model)
        _as_torch_finds(kept(model), model)  # and again, kept


def _scripted() -> nn.Module:
    torch.manual_seed(0)
    body = torch.jit.script(nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                          nn.ReLU(), nn.Dropout(0.2), nn.Conv2d(8, 8, 3, padding=1),
                                          nn.GELU()))
    return nn.Sequential(body, nn.Flatten(), nn.Linear(8 * 64, 4))


def test_a_scripted_submodule_trains_like_eager():
    """A torch.jit.script'ed submodule keeps its children, parameters and buffers in mappings
    that are not dicts; the kept walk read them with dict's own methods and every call of the
    optimized module raised a TypeError. Both walks find what torch finds, and three steps of a
    plan that recomputes (BatchNorm, dropout, GELU inside the scripted part) are eager's."""
    import monet_opt
    from tests import limits
    from tests.test_executor import assert_same, run_steps

    model, eager = _scripted(), _scripted()  # deepcopy makes a scripted module's weights non-leaf
    _as_torch_finds(walk(model), model)
    _as_torch_finds(Walk()(model), model)
    x = torch.randn(4, 3, 8, 8)
    limit = limits.between(model, x)  # NOTE [Limits between the least peak and store-all]
    opt = monet_opt.optimize(model, x, limit, profile_repeats=1, profile_dir=None,
                             time_limit_s=5)
    assert opt.plan.recomputed_ops > 0
    loss = lambda out: out.sum()  # noqa: E731
    assert_same(run_steps(opt, model, x, loss), run_steps(eager, eager, x, loss), True,
                "a scripted submodule")
