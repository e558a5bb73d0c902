"""What a cached profile or schedule depends on: the keys of the profile directory.

A `ProfileKey` is a fingerprint of the joint graph (every node's op, arguments, shapes, strides,
dtypes and phase), the input shapes and dtypes, the device, the torch version and the profiling
options. A `ScheduleKey` is the profile's content, the limit, the solver, its options and the
monet_opt version. Parameter values are in no key: they change no shape or time.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

import solvers
from monet_opt import alloc_events, kernels, phase
from monet_opt.input_spec import viewed_bytes


@dataclass(frozen=True)
class ProfileKey:
    """What a profile depends on. options: the profiling options, as (name, value) pairs."""

    graph_sha256: str
    inputs: str
    device: str
    torch_version: str
    options: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def of(joint: fx.GraphModule, primals: Sequence[torch.Tensor], inputs: str,
           options: dict[str, Any]) -> ProfileKey:
        if alloc_events.enabled() and not any(t.is_cuda for t in primals):
            # NOTE [Allocation events]: not inside the user's profiler
            options = {**options, "kernel_scratch": "measured" if alloc_events.available()
                       else "not measured"}
        return ProfileKey(graph_fingerprint(joint), inputs, device_name(primals),
                          torch.__version__, tuple(sorted(options.items())))

    def to_dict(self) -> dict[str, Any]:
        return _plain({**asdict(self), "options": dict(self.options)})

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ProfileKey:
        return ProfileKey(**{**d, "options": tuple(sorted(d["options"].items()))})

    @property
    def digest(self) -> str:
        return _digest(self.to_dict())


@dataclass(frozen=True)
class ScheduleKey:
    profile_sha256: str  # Profile.content_sha256
    memory_limit_bytes: int
    solver: str
    options: tuple[tuple[str, Any], ...]
    library_version: str

    def to_dict(self) -> dict[str, Any]:
        return _plain({**asdict(self), "options": dict(self.options)})

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ScheduleKey:
        return ScheduleKey(**{**d, "options": tuple(sorted(d["options"].items()))})

    @property
    def digest(self) -> str:
        return _digest(self.to_dict())


def graph_fingerprint(joint: fx.GraphModule) -> str:
    """sha256 of every node's kind, name, target, arguments, value metadata and phase."""
    h = hashlib.sha256()
    for node in joint.graph.nodes:
        args = fx.node.map_arg((node.args, node.kwargs), lambda a: f"%{a.name}")
        text = (f"{node.op} {node.name} {_target_name(node.target)} {_stable_repr(args)} "
                f"{_val_text(node.meta.get('val'))} {node.meta.get(phase.TAG, '')}\n")
        h.update(text.encode())
    return h.hexdigest()


def describe_inputs(args: tuple, kwargs: dict) -> str:
    """'float32[4x3x16x16]', or 'input_ids=int64[4x256]' for keyword arguments."""
    def one(value: Any) -> str:
        if not isinstance(value, (torch.Tensor, tuple, list, dict)):
            return repr(value)  # NOTE [Constant arguments] in monet_opt/input_spec.py
        texts = [f"{str(t.dtype).removeprefix('torch.')}[{'x'.join(map(str, t.shape))}]"
                 + (f" viewing {viewed_bytes(t)} B" if t.layout == torch.strided and
                    viewed_bytes(t) else "")  # NOTE [Inputs viewing more]
                 for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]
        if not texts:  # a list of ints, say: shown as it is ("()" said nothing)
            shown = repr(value)
            return shown if len(shown) <= 40 else shown[:37] + "..."
        return texts[0] if isinstance(value, torch.Tensor) else f"({', '.join(texts)})"
    return ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])


def device_name(primals: Sequence[torch.Tensor]) -> str:
    """The device and the backend settings that change its kernels, e.g. 'cpu: <model>, 2
    threads, oneDNN off'. NOTE [Backend settings in the key]"""
    cuda = [t.device for t in primals if t.is_cuda]
    name = (f"cuda: {torch.cuda.get_device_name(cuda[0])}" if cuda else
            f"cpu: {_cpu_model()}, {torch.get_num_threads()} threads")
    return ", ".join([name, *backend_settings(bool(cuda))])


# NOTE [Backend settings in the key]
# A switch such as torch.backends.mkldnn.flags(enabled=False) picks other kernels for the same
# graph: a convolution without oneDNN keeps an unfolded copy of its input, so a profile measured
# with oneDNN on, served with it off, planned a step that peaked 2.3x over its limit, silently.
# Each setting that differs from torch's default is named in the device, so such a profile is
# measured again; at the defaults the name reads as before and the profiles stored stay valid.

def backend_settings(cuda: bool) -> list[str]:
    """The settings, among those choosing kernels, that differ from torch's defaults."""
    changed = [] if torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled \
        else ["oneDNN off"]
    if torch.are_deterministic_algorithms_enabled():
        changed.append("deterministic algorithms")
    precision = kernels.legacy(torch.get_float32_matmul_precision)  # NOTE [Two precision APIs]
    if precision is None:
        changed += [f"{path or 'all'} float32 precision {value}"
                    for path, value in kernels.fp32_precisions()]
    elif precision != "highest":
        changed.append(f"float32 matmul precision {precision}")
    if cuda:
        cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
        changed += [text for text, on in (
            ("cuDNN off", not cudnn.enabled), ("cuDNN benchmark", cudnn.benchmark),
            ("cuDNN deterministic", cudnn.deterministic),
            ("cuDNN TF32 off", kernels.legacy(lambda: cudnn.allow_tf32) is False),
            ("matmul TF32", kernels.legacy(lambda: matmul.allow_tf32)),
            ("matmul fp16 reduction off", not matmul.allow_fp16_reduced_precision_reduction),
            ("matmul bf16 reduction off", not matmul.allow_bf16_reduced_precision_reduction))
            if on]
    return changed


@functools.lru_cache(maxsize=1)
def library_version() -> str:
    """The package version plus a digest of the solvers' source code: a schedule that older or
    edited solvers made is not served after the solvers change, even where the package version
    did not (it is solved again)."""
    try:
        version = importlib.metadata.version("monet_opt")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    h = hashlib.sha256()
    for path in sorted(Path(solvers.__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"{version}+solvers.{h.hexdigest()[:12]}"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _target_name(target: Any) -> str:
    if isinstance(target, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)  # e.g. 'aten.convolution.default'
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', repr(target))}"


def _val_text(val: Any) -> str:
    if isinstance(val, torch.Tensor):
        return f"{val.dtype}{list(val.shape)}{list(val.stride())}"
    if isinstance(val, (tuple, list)):
        return "(" + ",".join(_val_text(v) for v in val) + ")"
    return type(val).__name__ if val is not None else "-"


def _stable_repr(value: Any) -> str:
    """repr without memory addresses (an object without a stable repr is named by its type)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    """d as it reads back from JSON (tuples become lists), so stored and asked keys compare."""
    return json.loads(json.dumps(d, sort_keys=True))


def _digest(d: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()
