"""The tensors the profiling pass runs on in place of the model's buffers and tensor attributes.

NOTE [Buffers the pass reads]
  The first step was traced and profiled on a clone of every buffer and tensor attribute, from
  when that step also ran on them and applied their updates (it runs on fakes now: NOTE
  [Compiling, not running] in monet_opt/capture.py), and the joint graph the pass runs writes
  into none of its inputs (AOTAutograd applies a step's updates after it). Each clone was held
  beside its original while the pass ran, where the step holds one: the pass, held to the
  step's least peak from sizes where the limit was below that less the originals, passed the
  limit by the buffers' bytes (a 256 KiB projection buffer: optimize() measured 1,271,656 B,
  and the first step of every new batch size 1,259,368 B, under a 1,070,000 B limit its plans
  met; recipe probe, 2026-12-06). So the pass reads a buffer as it is wherever that is the
  clone's layout: dense and contiguous, alone on a storage of its own size that no other
  tensor of the step is on. A view of a larger storage, a strided buffer, or one sharing a
  storage is still cloned (NOTE [Buffers viewing a larger storage] in monet_opt/memory.py;
  aliases the trace would see as one). Should a graph write into one of its inputs, the pass
  runs on a copy of that one (`written`), and it checks by version counters that it wrote
  into none of the tensors it was given (`unwritten`). And the compiled step holds its
  planner (AOTAutograd keeps the partition function), which held those clones and the batch
  traced on for the module's life, one set per shape planned: it lets them go once the step
  is built.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from typing import Sequence

import torch
import torch.fx as fx

from monet_opt.errors import internal_assert
from monet_opt.lower import is_view_node
from monet_opt.memory import dense_parts


def pass_copies(state: Sequence[torch.Tensor], others: Sequence[torch.Tensor]
                ) -> list[torch.Tensor]:
    """For each tensor of `state`, the one the pass runs on: itself where it may be read as it
    is (NOTE [Buffers the pass reads]), else a clone. `others`: the step's other inputs."""
    on = Counter(part.untyped_storage().data_ptr() for t in [*state, *others]
                 for part in dense_parts(t))
    return [t if _alone(t, on) else t.clone() for t in state]


def _alone(t: torch.Tensor, on: Counter) -> bool:
    """Plain, dense, contiguous, not requiring grad, alone on a storage of its own size."""
    if type(t) is not torch.Tensor or t.layout != torch.strided or t.requires_grad or \
            t._is_zerotensor() or not t.is_contiguous() or t.storage_offset():
        return False
    storage = t.untyped_storage()
    return storage.nbytes() == t.numel() * t.element_size() and on[storage.data_ptr()] == 1


def written(joint: fx.GraphModule) -> frozenset[str]:
    """The placeholders an op of `joint` writes into, directly or through views: none in the
    functional graphs AOTAutograd traces, which the pass runs on copies of where there are."""
    names = set()
    for node in joint.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        for k, arg in enumerate(target._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = node.args[k] if k < len(node.args) else node.kwargs.get(arg.name)
            while isinstance(value, fx.Node) and is_view_node(value) and value.args and \
                    isinstance(value.args[0], fx.Node):
                value = value.args[0]
            if isinstance(value, fx.Node) and value.op == "placeholder":
                names.add(value.name)
    return frozenset(names)


@contextlib.contextmanager
def unwritten(primals: Sequence[torch.Tensor]):
    """Checks that what runs inside writes into none of `primals` (the model's own buffers
    among them: NOTE [Buffers the pass reads]), by their version counters."""
    versions = [t._version for t in primals]
    yield
    written = [k for k, (t, v) in enumerate(zip(primals, versions)) if t._version != v]
    internal_assert(not written, f"the profiling pass wrote into the step's inputs {written}")
