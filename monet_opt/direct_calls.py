"""The forward's and backward's Python: ATen ops called directly, no detaches.

NOTE [Direct calls]
  Our step runs two FX graphs as Python, one call per op, where eager's backward is C++ (the
  autograd engine) and eager's forward is the modules' Python. So every microsecond that a
  call spends in Python before it reaches ATen is ours alone, and on a GPU, where a small
  kernel takes less time than its call, it is step time: DenseNet-121 (1,575 ops, a third
  under 30 us on an H200) ran 23.6 % slower than eager under a plan that recomputes nothing
  (docs/benchmarks/gpu/README.md, fifth lease).

  FX writes an op as `torch.ops.aten.slice.Tensor(x, 1, 0, 16)`: four attribute lookups, then
  OpOverload.__call__, a Python function that hands its arguments to `OpOverload._op`, the C++
  entry. Measured on the 2-core CPU machine: 5.0 us a call so, 3.0 us calling `_op` itself.
  So the generated code binds each ATen op's `_op` to a global of its own and calls that:
  what runs is what OpOverload.__call__ runs, without its frame. (OpOverload.__call__ takes
  another path only for an op whose Python dispatch is on: those keep their OpOverload. Were
  it turned on later, the bound `_op` is still the C++ dispatcher's handle, the path the op
  took before.) On tiny inputs, where a CPU step is mostly calls, DenseNet-121's step went
  from +12.0 to +6.0 % over eager's (docs/benchmarks/host_time.md). On an H200 (batch 128,
  sixth lease), with the detaches below: 86.2 ms a step against 89.7 ms through OpOverload
  with the detaches kept, eager 85.1 ms (h200/step_gap_densenet121.txt).

  And AOTAutograd's graphs detach every tensor the backward keeps, twice (`detach(detach(
  relu))`: 2 calls per ReLU, 242 a step on DenseNet-121). A detach makes a new tensor on the
  same storage, which only autograd tells apart, and neither graph runs under autograd (the
  forward runs inside an autograd.Function's forward, the backward inside its backward), so
  each is replaced by what it detaches. Storages live exactly as long (an alias kept its base's
  storage alive until its last use, which is now the base's), so the simulator's peaks hold to
  the byte. A detach the graph returns stays, so that no output is another output's tensor.
"""
from __future__ import annotations

import dataclasses
import re

import torch
import torch.fx as fx
from torch.fx.graph import PythonCode, _BoxedCodeGen
from torch.fx.node import _get_qualified_name

_DETACH = torch.ops.aten.detach.default


def direct(op: object) -> bool:
    """Whether calling `op._op` runs what calling `op` runs."""
    return isinstance(op, torch._ops.OpOverload) and \
        getattr(op, "_pyobj_dispatcher", None) is None and hasattr(op, "_op")


class DirectCodeGen(_BoxedCodeGen):
    """The boxed calling convention (the graph takes a list and clears it), each ATen op called
    through its C++ entry (NOTE [Direct calls])."""

    def _gen_python_code(self, nodes, *args, **kwargs) -> PythonCode:
        code = super()._gen_python_code(nodes, *args, **kwargs)
        ops = {n.target for n in nodes if n.op == "call_function" and direct(n.target)}
        src, names = code.src, dict(code.globals)
        for op in sorted(ops, key=str):
            name = "_op_" + re.sub(r"\W", "_", str(op))
            if name in names or re.search(rf"\b{name}\b", src):
                continue  # a name taken (FX names no node so): left as FX wrote it
            called = re.compile(rf"(?<![\w.]){re.escape(_get_qualified_name(op))}\(")
            src, n = called.subn(name + "(", src)
            if n:
                names[name] = op._op
        return dataclasses.replace(code, src=src, globals=names)


def drop_detaches(gm: fx.GraphModule) -> int:
    """Replace each detach that the graph does not return by what it detaches (NOTE [Direct
    calls]); returns how many went."""
    count = 0
    for node in list(gm.graph.find_nodes(op="call_function", target=_DETACH)):
        if any(user.op == "output" for user in node.users):
            continue
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
        count += 1
    return count
