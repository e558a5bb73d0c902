"""What the command line's arguments name: a factory ('module:function'), an input shape
('32x3x160x160'), a device and a profile directory, each checked with a UsageError that says
what to write."""
from __future__ import annotations

import argparse
import importlib
import inspect
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from monet_opt.cache import home_expanded
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


def profile_root(text: str, what: str, writing: bool = False) -> Path:
    """The profile directory `text` names, refused where it cannot serve `what` (said in the
    message): a file, a link to nothing, and if `writing`, a place nothing can be made in."""
    try:
        root = home_expanded(text)
    except ValueError as e:
        raise UsageError(f"--profile-dir: {str(e).removeprefix('monet_opt: ')}") from None
    if root.is_symlink() and not root.exists():  # an unmounted share: it profiled, then failed
        raise UsageError(f"--profile-dir {text} is a link to {os.readlink(root)}, which does "
                         f"not exist (or links in a loop); {what} in a directory: mount or "
                         "make it, or give another")
    if root.exists() and not root.is_dir():  # it warned three times and cached nothing
        raise UsageError(f"--profile-dir {text} is a file, not a directory; {what} in a "
                         "directory")
    if writing:
        writable = next(p for p in (root, *root.parents) if p.exists())  # made where it is not
        if not writable.is_dir():
            raise UsageError(f"--profile-dir {text}: {writable} is a file, not a directory, "
                             "so nothing can be made under it")
        if not os.access(writable, os.W_OK | os.X_OK):  # it printed its table, cached nothing
            why = "its file system is mounted read-only" if os.statvfs(writable).f_flag & \
                os.ST_RDONLY else "permission denied"
            raise UsageError(f"--profile-dir {text}: {writable} cannot be written ({why}); "
                             f"{what} there")
    return root
