"""Benchmark models built offline with random weights: name -> (model, sample_input).

Sizes are CPU sizes in the regime where activations dominate the peak (as in MONeT's and
Kusumoto et al.'s measurements) that still profile in a minute or two on 2 cores.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch import nn

from monet_opt.errors import UsageError


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


def gpt2_narrow(batch: int = 4, seq: int = 256):
    """The demo's GPT-2 (monet_opt.demo.build_gpt2): 12 layers 256 wide, 4 heads, a 2048-token
    vocabulary, tied embeddings, dropout on. With GPT-2's own 50257-token vocabulary the
    embedding and its gradient dominate a CPU-sized step's peak; here activations do."""
    from monet_opt.demo import build_gpt2
    model, x = build_gpt2(batch, seq)
    return _LogitsOnly(model), x


class _LogitsOnly(nn.Module):
    """Returns the logits tensor alone, so the step's output is one tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **kwargs):
        return self.model(**kwargs).logits


def vgg16(batch: int = 8, size: int = 96):
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.vgg16().train(), _images(batch, size)


def mobilenet_v2(batch: int = 16, size: int = 128):
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.mobilenet_v2().train(), _images(batch, size)


def googlenet(batch: int = 16, size: int = 128):
    """torchvision GoogLeNet without the auxiliary classifiers (one output tensor)."""
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.googlenet(aux_logits=False, init_weights=True)
    return model.train(), _images(batch, size)


def unet(batch: int = 2, height: int = 128, width: int = 128, base: int = 16):
    """The U-Net of Ronneberger et al. (2015), `base` channels at the top (64 in the paper)."""
    torch.manual_seed(0)
    return UNet(base=base).train(), _images(batch, height, width)


def bert_base(batch: int = 2, seq: int = 128):
    """HF BERT-base (12 layers, 768 wide, dropout on), random init from its default config."""
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig()
    model = BertModel(cfg, add_pooling_layer=False).train()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    return _HiddenOnly(model), {"input_ids": ids}


class _HiddenOnly(nn.Module):
    """Returns the last hidden state alone, so the step's output is one tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **kwargs):
        return self.model(**kwargs).last_hidden_state


class UNet(nn.Module):
    """Ronneberger et al. (2015): a contracting path of four (two 3x3 conv + ReLU, 2x2 max-pool)
    steps doubling the channels, dropout at its end, an expanding path of four (2x2 up-convolution
    halving the channels, concatenation with the cropped contracting feature map, two 3x3 conv +
    ReLU) steps, and a 1x1 convolution to the classes. The convolutions here are padded (so no
    cropping is needed and any size divisible by 16 works); the paper's are unpadded."""

    def __init__(self, in_channels: int = 3, classes: int = 2, base: int = 64) -> None:
        super().__init__()
        widths = [base * 2 ** k for k in range(5)]
        self.down = nn.ModuleList()
        c = in_channels
        for w in widths:
            self.down.append(_double_conv(c, w))
            c = w
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.5)
        self.up = nn.ModuleList(nn.ConvTranspose2d(w, w // 2, 2, stride=2)
                                for w in reversed(widths[1:]))
        self.merge = nn.ModuleList(_double_conv(w, w // 2) for w in reversed(widths[1:]))
        self.head = nn.Conv2d(base, classes, 1)

    def forward(self, x):
        skips = []
        for k, block in enumerate(self.down):
            x = block(x if k == 0 else self.pool(x))
            skips.append(x)
        x = self.drop(skips.pop())
        for up, merge in zip(self.up, self.merge):
            x = merge(torch.cat([skips.pop(), up(x)], dim=1))
        return self.head(x)


def tiny_cnn(batch: int = 4, size: int = 16):
    """A small sequential CNN (BatchNorm, dropout): the benchmark harness's smoke-test model."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Dropout(0.2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    return model.train(), _images(batch, size)


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(inplace=True))


def _images(batch: int, size: int, width: int | None = None) -> torch.Tensor:
    return torch.randn(batch, 3, size, width or size, generator=torch.Generator().manual_seed(1))


MODELS: dict[str, Callable[[], tuple[nn.Module, Any]]] = {
    "resnet50": resnet50, "densenet121": densenet121, "gpt2": gpt2}
# Every model the side-by-side benchmark (monet_opt.bench) knows; MODELS stays the solver
# benchmark's list.
ALL_MODELS: dict[str, Callable[..., tuple[nn.Module, Any]]] = {
    **MODELS, "vgg16": vgg16, "mobilenet_v2": mobilenet_v2, "googlenet": googlenet,
    "unet": unet, "bert_base": bert_base, "tiny_cnn": tiny_cnn, "gpt2_narrow": gpt2_narrow}


def size_argument(parser, text: str, models: tuple[str, ...]) -> dict[str, int] | None:
    """parse_size for a script's --size: a bad one is its parser's usage error (status 2)."""
    try:
        return parse_size(text, models)
    except UsageError as exc:
        parser.error(str(exc))


def parse_size(text: str, models: tuple[str, ...] = ()) -> dict[str, int] | None:
    """A factory's arguments from the command line ("batch=32,size=160"); None for "". Each
    value is a whole number of at least 1, each name an argument of every one of `models`."""
    if not text:
        return None
    try:
        size = {k.strip(): int(v) for k, v in (item.split("=") for item in text.split(","))}
    except ValueError:
        size = {}
    if not size or any(v < 1 for v in size.values()) or "" in size:  # "=3" names nothing
        raise UsageError(f"--size takes name=integer pairs (integers of at least 1) separated by "
                         f"commas, such as batch=64,size=160; got {text!r}")
    for name in (m for m in models if m in ALL_MODELS):
        takes = list(inspect.signature(ALL_MODELS[name]).parameters)
        unknown = [k for k in size if k not in takes]
        if unknown:
            raise UsageError(f"--size: {name} takes {', '.join(takes)}, not {', '.join(unknown)}"
                             f"; give only those (or bench one model at a time)")
    return size
