"""The profiler's pass over the joint graph: each op run on real tensors, in order, each value
freed after its last use (or kept within a byte limit: NOTE [Profiling within the limit] in
monet_opt/profile_memory.py), each op's real output layout checked against the trace's (NOTE
[Layouts the tracer misreads] in monet_opt/misread_layouts.py)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx

from monet_opt.errors import CaptureError, MonetError
from monet_opt.misread_layouts import Layouts
from monet_opt.profile_memory import BoundedEnv, Scratch

# NOTE [Output gradients to their last use]
#   The profiler makes the step's output gradients (random, of the outputs' shapes) and held
#   them in its list of the graph's inputs through both passes, where the step frees its
#   gradient after its last read: a model returning a 512 KiB output, trained on out.sum(),
#   made its profile hold 512 KiB more than any plan through the backward, and optimize() as
#   a whole peaked 376,832 B (11 %) over a byte limit where nothing else could be dropped. An
#   output gradient is now made as its pass reaches it, held by the pass alone, and freed
#   after its last read (a bounded pass drops it too: nothing made again reads one).

# NOTE [Checks the tracer leaves out]
#   Fake tensors check shapes but not every op's dtypes: an integer batch for a float model
#   traces, and its first matmul fails here, on real tensors. That was a RuntimeError; it is
#   the model's input that is wrong, as where the trace fails, so it is a CaptureError too
#   (a MonetError: `monet-opt` says it in one line). The trace keeps no source lines (recording
#   them costs every traced op a stack walk), so the message names the op and torch's words.
#   The device running out of memory, and our own errors, pass as raised.


def walk(gm: fx.GraphModule, inputs: list[torch.Tensor | Callable[[], torch.Tensor]], visit,
         keep_until: dict[str, str] | None = None, memory_limit: int | None = None,
         copies=lambda node: 1, scratch: Scratch | None = None,
         layouts: Layouts | None = None) -> int:
    """Run `gm` node by node on `inputs` (a tensor, or a function making one, per placeholder):
    visit(node, args, kwargs, env) computes each call's value into env; values are freed after
    their last use (or, for a name in keep_until, after the node named there if that comes
    later), and with a memory limit, dropped and made again to keep within it (NOTE [Profiling
    within the limit]); `layouts`, where given, notes each op whose real output is laid out
    otherwise than traced. Returns how many values were made again."""
    last_use: dict[str, fx.Node] = {}
    for node in gm.graph.nodes:
        fx.node.map_arg((node.args, node.kwargs), lambda a: last_use.__setitem__(a.name, node))
    order = {node: k for k, node in enumerate(gm.graph.nodes)}
    by_name = {node.name: node for node in gm.graph.nodes}
    for name, until in (keep_until or {}).items():
        if name in last_use and order[by_name[until]] > order[last_use[name]]:
            last_use[name] = by_name[until]
    free_after: dict[fx.Node, list[str]] = {}
    for name, node in last_use.items():
        free_after.setdefault(node, []).append(name)
    env = {} if memory_limit is None else BoundedEnv(gm, memory_limit, keep_until or {},
                                                     copies, scratch)
    it, layouts = iter(inputs), layouts or Layouts()  # NOTE [Layouts the tracer misreads]
    for node in gm.graph.nodes:
        if node.op == "placeholder":  # NOTE [Output gradients to their last use]
            given = next(it)
            env[node.name] = given() if callable(given) else given
            del given
        elif node.op == "get_attr":
            env[node.name] = getattr(gm, node.target)
        elif node.op == "call_function":
            if memory_limit is not None:
                env.at(node)
            try:
                args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: env[a.name])
                visit(node, args, kwargs, env)
                del args, kwargs  # what it read may be freed or dropped below
                layouts.check(node, env)
            except (torch.OutOfMemoryError, MonetError):  # the device's or ours: as raised
                raise
            except Exception as exc:
                layouts.refuse(node, env, exc)
                raise CaptureError(  # NOTE [Checks the tracer leaves out]
                    f"monet_opt.optimize: the step fails on sample_input at {node.target}: "
                    f"{exc}. Check sample_input's dtypes and devices against the parameters' "
                    "(an integer batch for a float model, a CPU batch for a CUDA model): "
                    "torch's tracer does not check them for every op. If the model runs "
                    "eagerly on sample_input, please report it.") from exc
        elif node.op == "output":
            break
        for name in free_after.get(node, ()):
            env.pop(name, None)
        if memory_limit is not None:
            env.made(node)
    return getattr(env, "made_again", 0)
