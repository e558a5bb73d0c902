"""What the command line's model arguments name: a factory ('module:function'), an input shape
('32x3x160x160') and a device, each checked with a UsageError that says what to write."""
from __future__ import annotations

import argparse
import importlib
import inspect
import math
import os
import sys
from typing import Any, Callable

import torch

from monet_opt.errors import UsageError


def load_factory(spec: str) -> Callable[[], Any]:
    """The callable named by 'module:attribute' (the attribute may be dotted)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"bad factory {spec!r}: write MODULE:FACTORY, e.g. "
                         "torchvision.models:resnet18 or monet_opt.zoo:tiny_cnn")
    if os.getcwd() not in sys.path:  # as `python -m` would
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except (ImportError, TypeError) as exc:  # TypeError: a relative name ('./models.py')
        raise UsageError(f"bad factory {spec!r}: cannot import {module_name!r} ({exc}); check "
                         "the module name and that its package is installed") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"bad factory {spec!r}: {module_name!r} has no {attr!r}; check the "
                             "name after the colon")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"bad factory {spec!r}: {attr!r} is a {type(obj).__name__}, not a "
                         "callable that returns an nn.Module")
    try:
        inspect.signature(obj).bind()
    except TypeError as exc:
        raise UsageError(f"bad factory {spec!r}: it cannot be called without arguments ({exc}); "
                         "name a function of none that builds the model") from exc
    except ValueError:  # no signature to inspect (some builtins): just try it
        pass
    return obj


def parse_shape(text: str) -> tuple[int, ...]:
    """'32x3x160x160' -> (32, 3, 160, 160)."""
    parts = text.lower().replace(",", "x").split("x")
    if not all(p.strip().isascii() and p.strip().isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"bad input shape {text!r}: write positive sizes joined by 'x', e.g. "
                         "32x3x160x160 (images) or 4x256 (token ids)")
    return tuple(int(p) for p in parts)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return seconds


def device_of(name: str) -> torch.device:
    """--device as a torch.device, or a UsageError saying why not."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UsageError(f"bad --device {name!r}: {str(exc).splitlines()[0]}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name!r}, but torch sees no CUDA device here")
    if device.type not in ("cpu", "cuda"):  # meta, mps, ...: torch's errors deep inside
        raise UsageError(f"--device {name!r}: monet_opt profiles and plans on cpu or cuda")
    return device
