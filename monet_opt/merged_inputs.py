"""NOTE [Inputs AOTAutograd merges]
  Where the step's inputs share a storage (one tensor passed twice, views of one tensor) and
  its forward writes into one of them in place, AOTAutograd traces them as one input (a
  synthetic base, or the duplicate dropped), so the joint graph takes fewer inputs than the
  step hands it. The profiler fills the graph's inputs by position: a Linear weight stood in
  for the merged base ("out of bounds for storage of size 512 ... please report the model"),
  an embedding read a float input; with the merged inputs last, nothing failed and the step
  measured the input's bytes over its prediction and its limit. Such a step is refused,
  naming the inputs and saying what to pass instead.
  Views that do not overlap (`base[:16]` and `base[16:]`) are not merged, but they share one
  version counter, which the write, made after the forward (AOTAutograd copies the new value
  in), moves past the version at which the step saved the other view: every backward failed
  with autograd's "modified by an inplace operation", naming neither input nor what to do,
  where eager, writing first, trains (dtype probe, 2026-12-06). Refused alike."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from monet_opt.errors import CaptureError
from monet_opt.placeholders import primal_placeholders
from monet_opt.memory import storage_groups
from monet_opt.updated_buffers import updated_inputs


def refuse_merged(joint: fx.GraphModule, primals: Sequence[torch.Tensor], state: int) -> None:
    """CaptureError where `joint` takes fewer primals than the step's `primals` (the first
    `state` of them the model's parameters, buffers and attributes; the rest its inputs)."""
    placeholders = primal_placeholders(joint)
    groups = storage_groups(primals)
    if len(placeholders) == len(primals):
        written = {k for k, node in enumerate(placeholders) if node in updated_inputs(joint)}
        groups = [g for g in groups if written & set(g) and any(k >= state for k in g)]
        if not groups:
            return
    shared = [[k - state for k in group if k >= state] for group in groups]
    named = "; ".join(" and ".join(f"#{k}" for k in group) for group in shared if len(group) > 1)
    raise CaptureError(
        "monet_opt.optimize: the step's input tensors "
        + (f"{named} (counted among its tensor arguments) " if named else "")
        + "share a storage (one tensor passed twice, or views of one tensor) and the forward "
        "writes into one of them in place, which a planned step cannot follow (AOTAutograd "
        "merges them into one input, or writes after the forward into a storage the step "
        "saved). Pass tensors of their own (y.clone()), or write out of "
        "place (y = y + 1 for y.add_(1)).")
