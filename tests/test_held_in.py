"""NOTE [Tensors held in containers] (monet_opt/held_in.py): tensors a module holds in a list,
tuple or dict that the forward reads are constants of the traced step. One assigned anew,
replaced or added was silently not read (outputs 3.6 to 10.8 from eager's); now the call
raises PlanMismatchError saying what to do, while a container left as traced, or whose tensors
are updated in place, trains bitwise like eager, its deep copy too."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import monet_opt


class _Memory(nn.Module):
    """A layer reading a memory kept as a tuple, list or dict of tensors."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.enc = nn.Linear(8, 4)
        k, v = torch.randn(3, 4), torch.randn(3, 4)
        self.mems = {"tuple": (k, v), "list": [k, v], "dict": {"k": k, "v": v},
                     "nested": [(k, v)]}[kind]

    def forward(self, x):
        mems = [self.mems["k"], self.mems["v"]] if isinstance(self.mems, dict) else \
            list(self.mems[0]) if isinstance(self.mems[0], tuple) else self.mems
        return self.enc(x) @ torch.cat(mems).T


def _optimized(kind: str):
    torch.manual_seed(0)
    model, x = _Memory(kind), torch.randn(5, 8)
    eager = copy.deepcopy(model)
    return model, eager, monet_opt.optimize(model, x, 1 << 30, profile_dir=None,
                                            profile_repeats=1), x


def _train_alike(opt, model, eager, x, steps: int = 2) -> None:
    for _ in range(steps):
        for m in (model, eager):
            m.zero_grad(set_to_none=True)
        out, expected = opt(x), eager(x)
        out.square().sum().backward()
        expected.square().sum().backward()
        assert torch.equal(out, expected)
        assert torch.equal(model.enc.weight.grad, eager.enc.weight.grad)


CHANGES = {"assigned anew": lambda m: setattr(m, "mems", type(m.mems)(
    {k: v + 1 for k, v in m.mems.items()} if isinstance(m.mems, dict) else
    [v + 1 for v in m.mems])),
           "an element replaced": lambda m: m.mems.__setitem__(
               "k" if isinstance(m.mems, dict) else 0, torch.ones(3, 4)),
           "an element added": lambda m: m.mems.append(torch.ones(3, 4)),
           "a pair replaced": lambda m: m.mems.__setitem__(0, (torch.ones(3, 4), m.mems[0][1]))}


@pytest.mark.parametrize("kind, change", [("tuple", "assigned anew"), ("list", "assigned anew"),
                                          ("dict", "assigned anew"),
                                          ("list", "an element replaced"),
                                          ("dict", "an element replaced"),
                                          ("list", "an element added"),
                                          ("nested", "a pair replaced")])
def test_a_container_holding_other_tensors_is_refused_not_read_as_traced(kind, change):
    model, eager, opt, x = _optimized(kind)
    _train_alike(opt, model, eager, x)
    CHANGES[change](model)
    model.zero_grad(set_to_none=True)  # the step met before (resident gradients plan anew)
    with pytest.raises(monet_opt.PlanMismatchError, match=f"in the {type(model.mems).__name__}"
                       " 'mems' as constants.*attribute of its own"):
        opt(x)


@pytest.mark.parametrize("kind", ["tuple", "list", "dict", "nested"])
def test_a_container_as_traced_or_updated_in_place_trains_like_eager(kind):
    """A dict's keys the step does not read may come and go (a cache filled by length, a
    validation pass adding one: it was refused, probe 2026-12-07)."""
    model, eager, opt, x = _optimized(kind)
    _train_alike(opt, model, eager, x)
    for m in (model, eager):
        held = m.mems.values() if isinstance(m.mems, dict) else \
            m.mems[0] if kind == "nested" else m.mems
        for t in held:
            t.mul_(2)
        if kind == "dict":
            m.mems[5] = torch.zeros(1)
    _train_alike(opt, model, eager, x)
    twin = copy.deepcopy(opt)  # the copy holds its model's own container
    _train_alike(twin, twin.model, eager, x)
