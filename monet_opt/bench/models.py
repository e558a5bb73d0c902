"""The benchmark's models: which zoo factory, at which size, and which checkpointing a user would
apply to it.

Sizes, per regime:
- "cpu": each eager step about 0.3-2 s on 2 idle cores, so that `make bench` (every model)
  finishes in about an hour; activations are a large share of the peak where the model allows
  (VGG-16's 528 MiB of parameters and GPT-2's embeddings dominate at CPU sizes). BERT-base runs
  at batch 8: at batch 2-4 its peak is parameters and gradients (the backward's end), so no
  schedule has anything to save.
- "gpu": MONeT's batch sizes (its README table: ResNet-50 184, GoogLeNet 320, U-Net 11 at
  416x608, MobileNetV2 272, VGG-16 176, 224x224 images); our choice for the others.
- "quick": tiny inputs, for checking that the harness runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from monet_opt import zoo
from monet_opt.bench import peers


@dataclass(frozen=True)
class BenchModel:
    name: str
    cpu: dict[str, Any]
    gpu: dict[str, Any]
    quick: dict[str, Any]
    checkpoint: tuple[peers.CheckpointPeer, ...] = field(default=())

    def build(self, regime: str, size: dict[str, Any] | None = None
              ) -> tuple[nn.Module, Any, str]:
        """The model (train mode, random init, seed 0), its input and a one-line description;
        `size`: factory arguments instead of the regime's."""
        kwargs = size if size is not None else getattr(self, regime)
        model, x = zoo.ALL_MODELS[self.name](**kwargs)
        args = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        return model, x, f"monet_opt.zoo.{self.name}({args})"


def _layers_resnet(m: nn.Module) -> list[nn.Module]:
    blocks = [b for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for b in layer]
    return [m.conv1, m.bn1, m.relu, m.maxpool, *blocks, m.avgpool, nn.Flatten(1), m.fc]


def _layers_vgg(m: nn.Module) -> list[nn.Module]:
    return [*m.features, m.avgpool, nn.Flatten(1), *m.classifier]


def _layers_mobilenet(m: nn.Module) -> list[nn.Module]:
    return [*m.features, nn.AdaptiveAvgPool2d(1), nn.Flatten(1), *m.classifier]


def _layers_googlenet(m: nn.Module) -> list[nn.Module]:
    return [m.conv1, m.maxpool1, m.conv2, m.conv3, m.maxpool2, m.inception3a, m.inception3b,
            m.maxpool3, m.inception4a, m.inception4b, m.inception4c, m.inception4d,
            m.inception4e, m.maxpool4, m.inception5a, m.inception5b, m.avgpool, nn.Flatten(1),
            m.dropout, m.fc]


def _specs() -> dict[str, BenchModel]:
    seq = peers.sequential
    specs = [
        BenchModel("resnet50", dict(batch=16, size=128), dict(batch=184, size=224),
                   dict(batch=2, size=64),
                   (peers.per_block("torchvision.models.resnet.Bottleneck",
                                    label="Bottleneck (16)"),
                    seq(_layers_resnet))),
        BenchModel("vgg16", dict(batch=8, size=112), dict(batch=176, size=224),
                   dict(batch=2, size=32), (seq(_layers_vgg),)),
        BenchModel("mobilenet_v2", dict(batch=32, size=128), dict(batch=272, size=224),
                   dict(batch=2, size=64), (seq(_layers_mobilenet),)),
        BenchModel("googlenet", dict(batch=32, size=128), dict(batch=320, size=224),
                   dict(batch=2, size=64),
                   (seq(_layers_googlenet),
                    peers.per_block("torchvision.models.googlenet.Inception",
                                    label="Inception block (9)"))),
        BenchModel("densenet121", dict(batch=16, size=128), dict(batch=128, size=224),
                   dict(batch=2, size=64),
                   (peers.per_block("torchvision.models.densenet._DenseLayer",
                                    label="dense layer (58)"),)),
        BenchModel("unet", dict(batch=4, height=128, width=128, base=32),
                   dict(batch=11, height=416, width=608, base=64),
                   dict(batch=1, height=32, width=32, base=8),
                   (peers.per_block(nn.Sequential, label="double 3x3 convolution (9)"),)),
        BenchModel("gpt2", dict(batch=1, seq=256), dict(batch=8, seq=1024), dict(batch=1, seq=32),
                   (peers.hf_blocks(),)),
        BenchModel("gpt2_narrow", dict(batch=4, seq=256), dict(batch=32, seq=1024),
                   dict(batch=1, seq=32), (peers.hf_blocks(),)),
        BenchModel("bert_base", dict(batch=8, seq=128), dict(batch=32, seq=512),
                   dict(batch=1, seq=32), (peers.hf_blocks(),)),
        BenchModel("tiny_cnn", dict(batch=4, size=16), dict(batch=64, size=32),
                   dict(batch=4, size=16),
                   (seq(lambda m: list(m.children())),
                    peers.per_block(nn.Conv2d, label="convolution"))),
    ]
    return {s.name: s for s in specs}


SPECS = _specs()
# What `monet-opt bench` runs when no --models is given (tiny_cnn is the harness's smoke test).
DEFAULT_MODELS = ("resnet50", "vgg16", "mobilenet_v2", "googlenet", "densenet121", "unet", "gpt2",
                  "gpt2_narrow", "bert_base")
