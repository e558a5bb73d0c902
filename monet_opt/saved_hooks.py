"""Saved-tensor hooks a model's forward sets while it is traced.

NOTE [Saved-tensor hooks in the forward]
  A forward may set hooks on the tensors autograd saves for the backward:
  `torch.autograd.graph.save_on_cpu()` (activation offloading: each saved tensor is copied to
  host memory and back), or `saved_tensors_hooks(pack, unpack)` of its own (compressing what is
  saved). They act when autograd saves a tensor, inside the context. The traced step runs
  none of the model's Python: its saved tensors are the plan's, kept on the device and counted
  within the limit, so the hooks never run at a training step (a linear layer under
  save_on_cpu, and one under a pack hook that copies what it saves, each measured its plan's
  prediction to the byte: neither hook ran). That is the plan's to decide, and within the
  limit, but where a user relied on the hooks to move memory off the device it happened with
  no word. Entering such a context while the model is traced is noted, and optimize() warns
  (HookWarning) naming the line; torch's own uses (from torch's files: a non-reentrant
  checkpoint's) are not the model's, except save_on_cpu, which torch enters only where offloading
  was asked for (its offload_wrapper, silent until 2026-12-06).
  Hooks set around the optimized module's call do act, on what the step's own backward saves:
  the plan's tensors, not eager's (a bfloat16 pack hook packed 14 where eager's 20), and the
  memory they hold is not the plan's (a pack hook copying what it saves measured 53,788 B on
  a plan predicting 42,112, its limit). The step warns (HookWarning) where it is called so.
"""
from __future__ import annotations

import contextlib
import linecache
import sys
import warnings

import torch

from monet_opt.errors import user_stacklevel
from monet_opt.hooks import HookWarning

_THEIRS = ("/torch/", "/monet_opt/")


@contextlib.contextmanager
def watching(model: torch.nn.Module):
    """While the model is traced, note where its code enters a saved-tensor hooks context;
    warn once the trace is done if it did."""
    hooks = torch.autograd.graph.saved_tensors_hooks
    enter, lines = hooks.__enter__, {}

    def noted(self):
        frame = sys._getframe(1)
        if isinstance(self, torch.autograd.graph.save_on_cpu) or \
                not any(part in frame.f_code.co_filename for part in _THEIRS):
            code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
            lines.setdefault(f"{frame.f_code.co_filename}:{frame.f_lineno}: {code}", None)
        return enter(self)

    hooks.__enter__ = noted
    try:
        yield
    finally:
        hooks.__enter__ = enter
    if lines:
        warnings.warn(HookWarning(
            f"monet_opt: {type(model).__name__}'s forward sets saved-tensor hooks (at "
            f"{'; '.join(list(lines)[:3])}): torch.autograd.graph.save_on_cpu or "
            "saved_tensors_hooks. The optimized step does not run them: what it keeps for the "
            "backward is the plan's, on the device, within memory_limit (NOTE [Saved-tensor "
            "hooks in the forward] in monet_opt/saved_hooks.py)."), stacklevel=user_stacklevel())


def warn_if_around() -> None:
    """HookWarning where saved-tensor hooks are set around the step's call (NOTE [Saved-tensor
    hooks in the forward]); Python's filter shows it once per line."""
    if torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
        warnings.warn(HookWarning(
            "monet_opt: the optimized module was called inside a saved-tensor hooks context "
            "(torch.autograd.graph.save_on_cpu, saved_tensors_hooks): its hooks act on what "
            "the planned step saves for its backward, which the plan counts on the device as "
            "saved, so the step's memory is not its plan's, and a hook that changes what it "
            "saves changes other tensors than eager's. To offload within a plan, lower the "
            "memory limit instead; or call the module outside the context. NOTE [Saved-tensor "
            "hooks in the forward] in monet_opt/saved_hooks.py."), stacklevel=user_stacklevel())
