"""NOTE [Attention masks of all ones]
  A tokenizer's `attention_mask` with no padding (every fixed-length or packed batch) is all
  ones. Eager HF models look at its values and, seeing no padded token, drop it: Llama, Mistral
  and Qwen2 call SDPA with is_causal=True and their keys and values unrepeated, exactly as with
  no mask. A trace cannot look at values, so the traced step built the explicit mask from the
  input and ran SDPA with it: the loss was eager's, 13 of Llama's 21 gradients were not (1.1e-8
  in float32, up to 6.9e-4 under bfloat16 autocast), and the step held the repeated keys and
  values eager does not (padded batches were bitwise). So for an HF model whose sample's
  `attention_mask` is all ones, optimize() first checks that the model's forward gives the
  same outputs, bitwise, with the mask as with None (two forwards under no_grad, the random
  stream and buffers as they were); if so, it plans the step with None, and each call with an
  all-ones mask runs that step (one reduction a call, as HF's own check). Other masks are
  passed as they are (a padded batch plans a step of its own, once). The decision is per rank
  and dtype of mask (an all-True 4-d mask is no padding mask: dropped on the 2-d sample's
  word, Llama ran causal attention, 0.24 from eager's), and a mask of a rank or dtype not met
  before is checked at the first call that passes it all ones: a sample with padding decided
  nothing, and its model's all-ones batches ran with the mask, 1.9e-8 from eager's. Such a
  call's step for None is planned then, once; not where the model has module hooks, which the
  check's two forwards would run (those calls keep the mask, as before). Models that treat the
  two alike are eager's bitwise; those that do not are left as they were. The caller still
  holds a mask left out, so the step planned for it counts its bytes as fixed memory (they
  were not: a tiny Llama's plan measured the mask's 2,048 B over its limit).
  A decision holds for the module hooks it was made with: a hook added since (a pre-hook
  editing the mask, as a masking augmentation does) was handed None on every all-ones batch,
  silently (GPT-2: gradients 0.042 from eager's; change probe, 2026-12-06). Under other hooks
  the mask is passed as it is, or checked again where there are none. The hooks are those the
  check's forwards leave: HF's MoE models (Mixtral with output_router_logits) register forward
  hooks recording their router logits at their first forward, and a decision made under none
  planned each module's first call again, with the mask (HF zoo probe, 2026-12-06).
"""
from __future__ import annotations

import threading
import time
import weakref
from typing import Any

import torch
from torch import nn

from monet_opt import progress
from monet_opt.hooks import Hooks, hooks_of
from monet_opt.input_spec import InputSpec
from monet_opt.memory import cuda_devices

NAMES = ("attention_mask",)
# model -> {(name, rank, dtype): (whether the model treats that all-ones mask as None, the
# module hooks that was decided under)}
_DECIDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LAST = threading.local()  # (id of the kwargs made, the masks left out, their bytes)


def split(model: nn.Module, sample_input: Any) -> tuple[tuple, dict]:
    """optimize()'s sample as (args, kwargs), an all-ones mask left out where the model gives
    the same outputs without it (checked again, and noted for the model's later calls)."""
    args, kwargs = InputSpec.split(sample_input)
    return args, _without(model, args, kwargs, hooks_of(list(model.modules())), fresh=True)


def dropped(model: nn.Module, args: tuple, kwargs: dict, hooks: Hooks, check: bool) -> dict:
    """A call's kwargs, each all-ones mask the model treats as None, under the module hooks
    `hooks` (hooks.hooks_of), set to None; with `check` (the module plans new structures), a
    mask of a rank and dtype not met before under these hooks is checked now, where that is
    safe."""
    return _without(model, args, kwargs, hooks, fresh=False, check=check)


def dropped_bytes(kwargs: dict) -> int:
    """What the masks left out of `kwargs` (as this thread's latest call returned them) hold:
    the caller still holds them, so a step planned for that call counts them (NOTE [Attention
    masks of all ones]). 0 for kwargs made otherwise (profile_model's)."""
    made, names, held = getattr(_LAST, "made", (None, (), 0))
    return held if made == id(kwargs) and all(kwargs.get(n, 0) is None for n in names) else 0


def _without(model: nn.Module, args: tuple, kwargs: dict, hooks: Hooks, fresh: bool,
             check: bool = True) -> dict:
    _LAST.made = (None, (), 0)
    if not _hf(model) or torch._C._functorch.maybe_current_level() is not None:
        return kwargs  # under a torch.func transform the step runs the model as it is
    decided = {key: alike for key, (alike, under) in _DECIDED.setdefault(model, {}).items()
               if under == hooks}
    masks = {n: kwargs[n] for n in NAMES if type(kwargs.get(n)) is torch.Tensor}
    keys = {n: (n, mask.dim(), mask.dtype) for n, mask in masks.items()}
    ones = [n for n, mask in masks.items()
            if (fresh or decided.get(keys[n]) is not False) and _all_ones(mask)]
    new = [n for n in ones if fresh or check and keys[n] not in decided]
    # a call's check runs the forward twice: not where module hooks would see it
    if new and (fresh or not hooks):
        start = time.perf_counter()
        alike = _alike(model, args, kwargs, {**kwargs, **dict.fromkeys(new)})
        decided.update({keys[n]: alike for n in new})
        # under the hooks the check's forwards left: HF's MoE models register their output
        # recorders at their first forward, and a decision under none held for no call
        after = hooks_of(list(model.modules()))
        _DECIDED[model].update({keys[n]: (alike, after) for n in new})
        progress.log.info("%s: %s all ones %s in %.1f s (two forwards under no_grad)",
                          type(model).__name__, ", ".join(new),
                          "treated as None: left out" if alike else "not treated as None: kept",
                          time.perf_counter() - start)
    drop = [n for n in ones if decided.get(keys[n])]
    if not drop:
        return kwargs
    out = {**kwargs, **dict.fromkeys(drop)}
    _LAST.made = (id(out), tuple(drop), sum({
        masks[n].untyped_storage().data_ptr(): masks[n].untyped_storage().nbytes()
        for n in drop}.values()))
    return out


def _hf(model: nn.Module) -> bool:
    return type(model).__module__.startswith("transformers.")


def _all_ones(mask: Any) -> bool:
    return type(mask) is torch.Tensor and mask.layout == torch.strided and \
        not mask.requires_grad and mask.numel() > 0 and bool((mask == 1).all())


def _alike(model: nn.Module, args: tuple, with_mask: dict, without: dict) -> bool:
    """Whether the model's forward gives bitwise the same outputs both ways (from the same
    random state, its buffers put back after each)."""
    buffers = [b.clone() for b in model.buffers()]
    outputs = []
    devices = cuda_devices(model.parameters())
    with torch.no_grad(), torch.random.fork_rng(devices=devices):
        state = torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in devices]
        for kwargs in (with_mask, without):
            torch.set_rng_state(state[0])
            for d, cuda_state in zip(devices, state[1]):
                torch.cuda.set_rng_state(cuda_state, d)
            try:
                outputs.append(_tensors(model(*args, **kwargs)))
            except Exception:  # noqa: BLE001 - a model that needs its mask: leave it
                outputs.append([])
            finally:
                for b, saved in zip(model.buffers(), buffers):
                    b.copy_(saved)
    first, second = outputs
    return bool(first) and len(first) == len(second) and all(
        a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
        for a, b in zip(first, second))


def _tensors(out: Any) -> list[torch.Tensor]:
    """The tensors in a model's output (an HF ModelOutput is a dict)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for item in out for t in _tensors(item)]
    return []
