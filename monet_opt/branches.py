"""Control flow a plan cannot count: torch.cond and torch.while_loop in the traced step."""
from __future__ import annotations

import torch

from monet_opt.errors import CaptureError


# NOTE [Branches taken by value]
#   torch.cond (and torch.while_loop) trace as one op holding subgraphs, run by the values of a
#   tensor. The profiler measured the branch the sample took, and a cond's backward recomputes
#   its branch inside the op, memory the plan did not see: a 4-block net whose branches save
#   one tensor or four was predicted at its limit, 721,944 B, and measured 804,108 B on the
#   sample and 918,540 B (+27 %) on a same-shaped batch taking the heavier branches, with no
#   warning; gradients stayed bitwise (data-dependent probe, 2026-12-06). A plan cannot hold a
#   limit over an op whose memory depends on values, so the step is refused, naming the line.
_BY_VALUE = {"cond": "torch.cond", "while_loop": "torch.while_loop"}


def refuse_branches(gm: torch.fx.GraphModule) -> None:
    """CaptureError where `gm` runs torch.cond or torch.while_loop (NOTE [Branches taken by
    value])."""
    for node in gm.graph.nodes:
        name = getattr(node.target, "__name__", None) if node.op == "call_function" else None
        if name not in _BY_VALUE or not isinstance(node.target, torch._ops.HigherOrderOperator):
            continue
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        path, cls = stack[-1] if stack else ("", None)
        where = f" in {getattr(cls, '__name__', cls)} {path or '(the model)'!r}" if stack else ""
        raise CaptureError(
            f"monet_opt.optimize: the forward runs {_BY_VALUE[name]}{where}, which picks the "
            "code it runs by the values of a tensor, so what the step holds depends on each "
            "batch's values; a plan measured on the sample's would pass its limit on a batch "
            "taking other branches, silently. Compute both branches and select with "
            "torch.where(pred, a, b), or optimize the modules around that op and run it as it "
            "is (NOTE [Branches taken by value] in monet_opt/branches.py).")
