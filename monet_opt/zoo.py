"""Benchmark models built offline with random weights: name -> (model, sample_input).

Sizes are CPU sizes in the regime where activations dominate the peak (as in MONeT's and
Kusumoto et al.'s measurements) that still profile in a minute or two on 2 cores.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn


def resnet50(batch: int = 32, size: int = 160):
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.resnet50().train(), _images(batch, size)


def densenet121(batch: int = 16, size: int = 160):
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.densenet121().train(), _images(batch, size)


def gpt2(batch: int = 4, seq: int = 256):
    """HF GPT-2 small: 12 layers, 768 wide, tied embeddings, dropout on (default config)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_positions=seq, use_cache=False)
    model = GPT2LMHeadModel(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    return _LogitsOnly(model), {"input_ids": ids}


class _LogitsOnly(nn.Module):
    """Returns the logits tensor alone, so the step's output is one tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **kwargs):
        return self.model(**kwargs).logits


def _images(batch: int, size: int) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


MODELS: dict[str, Callable[[], tuple[nn.Module, Any]]] = {
    "resnet50": resnet50, "densenet121": densenet121, "gpt2": gpt2}
