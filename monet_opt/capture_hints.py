"""What a CaptureError says: where tracing failed, and what to do about it."""
from __future__ import annotations

import contextlib
import logging
import warnings
import traceback

import torch

from monet_opt.eager_check import eager_failure


# FX's generated code (a notebook's "<ipython-input-...>" cells are the user's)
_GENERATED = ("<string>", "<eval_with_key>")


def users(frame: traceback.FrameSummary) -> bool:
    """Whether `frame` is the user's code: not torch's, ours or FX's generated code."""
    return "/torch/" not in frame.filename and "/monet_opt/" not in frame.filename \
        and not frame.filename.startswith(_GENERATED)


def where(exc: BaseException) -> str:
    """The exception's first line plus the last frame of user code that raised it."""
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    every = traceback.extract_tb(exc.__traceback__)
    mine = [k for k, f in enumerate(every) if users(f)]
    if not mine:
        return f"{type(exc).__name__}: {message}"
    last = every[mine[-1]]
    after = every[mine[-1] + 1:]  # the torch function it called, at its deepest (re-entered
    called = [f for f in after if after[0].filename.endswith(_TORCH_FUNCTIONS)  # under export)
              and f.filename == after[0].filename and f.name == after[0].name][-1:]
    inside = "".join(f"; in torch's {f.name}, at `{f.line}`{IN_TORCH}" for f in called)
    return f"{type(exc).__name__}: {message} (at {last.filename}:{last.lineno}: {last.line}" \
        f"{inside})"


# NOTE [Failing inside torch's functions]
#   A function of torch.nn.functional that checks its input's values (gaussian_nll_loss's
#   `torch.any(var < 0)`) cannot be traced, and the CaptureError named only the user's line
#   that called it (a WithLoss lambda), with advice about .item() there and HF's use_cache.
#   Now it names the function and its line, marked IN_TORCH, for the hint to say what to do.
_TORCH_FUNCTIONS = ("/torch/nn/functional.py", "/torch/functional.py")
IN_TORCH = " [torch's own check]"
TORCH_CHECK = ("\nWhere it failed inside torch's own function (marked \"torch's own check\"), that "
               "function reads its input's values: call it outside the optimized module (a "
               "loss: optimize the model, not WithLoss, and compute the loss on its output), or "
               "write it without the check.")


def _not_a_meta_failure(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(("failed while attempting to run meta",
                                           "Unable to find user code corresponding to"))


_LOGS = ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes")


@contextlib.contextmanager
def meta_failures_unlogged():
    """While tracing: torch's fake tensors log each op that fails on them, with its traceback
    (an input of a shape the model rejects: 54 lines on stderr, once per route tried), and then
    raise; the CaptureError says what failed, so the log is dropped. So are the warnings of
    autograd's anomaly mode, which AOTAutograd traces the joint graph under ("Error detected
    in ReluBackward0", with the forward's traceback, once per route), and symbolic shapes'
    "Unable to find user code corresponding to {u0}" where a route meets a value-dependent
    size (twice on a torch.distributions VAE, between a step's other output: model probe,
    2026-12-06)."""
    logs = [logging.getLogger(name) for name in _LOGS]
    for log in logs:
        log.addFilter(_not_a_meta_failure)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Error detected in ", UserWarning)
            yield
    finally:
        for log in logs:
            log.removeFilter(_not_a_meta_failure)


VALIDATING = (
    "\ntorch.distributions checks its arguments' values when it makes a distribution "
    "(validate_args), which a traced step cannot: pass validate_args=False (Categorical(logits="
    "..., validate_args=False)), or call torch.distributions.Distribution."
    "set_default_validate_args(False) before optimize(); where validate_args=False is passed "
    "already, a distribution it builds inside checks still (RelaxedOneHotCategorical's), "
    "and only the second does.")


def from_validation(exc: BaseException) -> bool:
    """Whether `exc` came from torch.distributions' argument checks."""
    return _raised_in(exc, lambda f: f.filename.endswith("torch/distributions/distribution.py")
                      and f.name == "__init__")


def _raised_in(exc: BaseException, frame) -> bool:
    """Whether a frame of `exc`'s traceback passes `frame(summary)`."""
    return any(frame(f) for f in traceback.extract_tb(exc.__traceback__))


CAUSAL_CHECK = (
    "\nThere, torch's nn.Transformer, TransformerEncoder or TransformerDecoder looks at the "
    "mask's values to tell whether it is causal (is_causal left None), which a traced step "
    "cannot: say it in the call: tgt_is_causal=True with generate_square_subsequent_mask's "
    "mask (nn.Transformer, nn.TransformerDecoder; is_causal=True for nn.TransformerEncoder), "
    "or False where the mask is not causal.")


def from_causal_check(exc: BaseException) -> bool:
    """Whether `exc` came from torch's check of a transformer mask's values (CAUSAL_CHECK)."""
    return _raised_in(exc, lambda f: f.name == "_detect_is_causal_mask")


SPARSE_GRADIENT = (
    "\nThere, a sparse tensor's values need a gradient, which a traced step cannot make (the "
    "trace does not know how many entries it has): pass messages with dense ops instead "
    "(out.index_add_(0, dst, weight[:, None] * x[src]), or scatter_reduce), or, where the "
    "values need no gradient, build the sparse tensor outside the module and pass it in.")


MODIFIED_IN_PLACE = (
    "\nThe forward writes in place into a tensor its backward reads (above: which op's output, "
    "at which version), and eager's backward fails the same way: write out of place there "
    "(y = y - d for y.sub_(d), or on a clone), then optimize.")


def in_the_backward(errors: list[str]) -> str:
    """SPARSE_GRADIENT where tracing failed in the backward of a sparse tensor's making;
    MODIFIED_IN_PLACE where autograd's version check failed while tracing the backward."""
    return (SPARSE_GRADIENT if any("SparseCooTensor" in e and "Backward" in e for e in errors)
            else "") + (MODIFIED_IN_PLACE if any("modified by an inplace operation" in e
                                                 for e in errors) else "")


def hf_cache(errors: list[str], model=None) -> str:
    """What to do where the model returns an HF cache object (use_cache=True, a decoder's
    default when built from its config): it cannot be an output of a traced step. With
    use_cache already off, the cache is one it was handed (peft's prefix tuning hands Llama its
    prefix as past_key_values, and Llama returns it): it was told to set use_cache=False,
    which it had (peft probe, 2026-12-06)."""
    found = {e.split("Found <class '")[1].split("'")[0].rsplit(".", 1)[-1] for e in errors
             if "Found <class 'transformers." in e and "Cache'> in output" in e}
    if not found:
        return ""
    on = [name for name, m in (model.named_modules() if model is not None else ())
          if getattr(getattr(m, "config", None), "use_cache", None)]
    off = getattr(getattr(model, "config", None), "use_cache", None) is False
    if off and on:  # T5's decoder keeps a copy of the config: HF zoo probe, 2026-12-07
        return (f"\nThere, the model returns a transformers {', '.join(sorted(found))}: "
                f"model.config.use_cache is off, but {on[0]}.config.use_cache is on (a "
                "submodule keeps a config of its own), and a traced step cannot return the "
                "cache. Pass use_cache=False in the sample input and in every call, or set it "
                f"on {on[0]}.config too.")
    if off:
        return (f"\nThere, the model returns a transformers {', '.join(sorted(found))} with "
                "use_cache off: one it was handed (peft's prefix tuning passes its prefix as "
                "past_key_values), which a traced step cannot return. Optimize a module whose "
                "forward returns the loss alone (`return model(**batch).loss`), or the "
                "logits, not the model's whole output.")
    return (f"\nThere, the model returns a transformers {', '.join(sorted(found))} (the keys "
            "and values kept for generation, use_cache=True: a decoder's default when built "
            "from its config), which a traced step cannot return. Training needs none: set "
            "model.config.use_cache = False before optimize(), or pass use_cache=False in the "
            "sample input and in every call.")


def hf_experts(errors: list[str], model) -> str:
    """What to do where a transformers mixture of experts loops over the experts its tokens
    were routed to (experts_implementation="eager"): how many is a value of the batch. A
    class that takes no experts_implementation (JetMoE, SwitchTransformers) was told to set
    it, which raises (HF zoo probe, 2026-12-06)."""
    if not any("/transformers/models/" in e and "expert" in e.rpartition("(at ")[2]
               for e in errors):
        return ""
    settable = getattr(type(model), "_can_set_experts_implementation", None)
    if settable is not None and not settable():
        return (f"\nThere, a transformers mixture of experts routes its tokens by their "
                "values, which a traced step cannot follow, and "
                f"{type(model).__name__} takes no experts_implementation that would run its "
                "experts as ops of fixed shapes (Mixtral's, Qwen2-MoE's and OLMoE's "
                "\"grouped_mm\" do): this model cannot be optimized as it is.")
    return ("\nThere, a transformers mixture of experts loops over the experts its tokens were "
            "routed to (experts_implementation=\"eager\"), as many as the batch's values say, "
            "which a traced step cannot follow: build the model with "
            "experts_implementation=\"grouped_mm\" (or \"batched_mm\") in its config, which "
            "run the experts as ops of fixed shapes.")


def no_fake(errors: list[str]) -> str:
    """What to do where a custom op has no fake implementation (the error was followed by advice
    about .item(): custom-ops probe, 2026-12-06)."""
    found = sorted({e.split("no fake impl registered for <CustomOpDef(")[1].split(")")[0]
                    for e in errors if "no fake impl registered for <CustomOpDef(" in e})
    if not found:
        return ""
    return (f"\nThere, the custom op {', '.join(found)} has no fake implementation, which "
            "tracing runs to learn its outputs' shapes without running it: register one with "
            "@<op>.register_fake (a function of the same arguments returning empty tensors of "
            "the outputs' shapes and dtypes, as torch.library.custom_op's docs show).")


def unknown_output(errors: list[str]) -> str:
    """What to do where the forward returns an object of a class torch cannot look into for
    tensors (a plain dataclass; an HF cache is hf_cache's)."""
    found = {e.split("Found <class '")[1].split("'")[0] for e in errors
             if "Found <class '" in e and "in output, which is not a known type" in e
             and "Found <class 'transformers." not in e}
    if not found:
        return ""
    names = ", ".join(sorted(found))
    if any(name.startswith("torch.distributions.") for name in found):  # actor-critic (RL probe)
        return (f"\nThere, the forward returns a {names}, which a traced step cannot return "
                "(it returns tensors): return the distribution's parameters instead (its "
                "logits, or loc and scale) and build it outside, on the step's outputs "
                "(Categorical(logits=opt(obs)[0])); its sample and log_prob are then eager's.")
    if all(name.startswith("torch.") or "." not in name for name in found):
        # a dtype, device or slice holds no tensors to register: that advice failed too
        return (f"\nThere, the forward returns a {names}, which a traced step cannot return "
                "(it returns tensors, and numbers, strings and None among them): leave it out "
                "of the forward's outputs and read it outside the step (out.dtype, x.device).")
    short = sorted(name.rsplit(".", 1)[-1] for name in found)[0]
    return (f"\nThere, the forward returns a {names}, a class torch cannot look into for the "
            "tensors it holds, so a traced step cannot return it: register it before "
            f"optimize(), torch.export.register_dataclass({short}) for a dataclass (or "
            "torch.utils._pytree.register_pytree_node for another class), or return a tuple, a "
            "dict or a NamedTuple.")


def shapes(errors: list[str]) -> str:
    """What to do where an op's output shape depends on tensor values (a boolean mask's
    index, nonzero; CTC's loss), which a traced step, whose shapes
    are fixed, cannot hold."""
    ops = {e.split(": DynamicOutputShapeException: ")[1].split()[0] for e in errors
           if ": DynamicOutputShapeException: " in e}
    if not ops:
        return ""
    if ops <= _PACKING:
        return ("\nThere, pack_padded_sequence packs by the values of the lengths, which a "
                "traced step, whose shapes are fixed, cannot hold: run the recurrent layer on "
                "the padded batch instead (padded at the end, a one-directional layer's outputs "
                "at the real steps are the same), leave the padded steps out of the loss with a "
                "mask, and take each sequence's last output with gather at lengths - 1.")
    if ops <= _MASKING and not any(" (at " in e for e in errors):  # in the backward: no line
        return ("\nThere, the backward indexes by a boolean mask (the gradient of an assignment "
                "x[mask] = v, or of index_put with a mask, reads v's entries by the mask's "
                "values), which a traced step, whose shapes are fixed, cannot hold: write it as "
                "torch.where(mask[..., None], v, x) (v broadcast to x's shape), or "
                "x.masked_fill(mask[..., None], value) for a number.")
    if ops <= _MASKING:
        return ("\nThere, an op's output shape depends on the values of a tensor (indexing with "
                "a boolean mask, x[mask], runs nonzero; so do masked_select and unique), which a "
                "traced step, whose shapes are fixed, cannot hold: compute on every element and "
                "mask the result instead (torch.where(mask, x, 0), or a loss's ignore_index: "
                "F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)).")
    if ops <= _LSTSQ:  # a solve inside the model: not a loss to move out (exotic probe)
        return ("\nThere, torch.linalg.lstsq sizes its other outputs (residuals, rank, singular "
                "values) by the values it meets, which a traced step, whose shapes are fixed, "
                "cannot hold, whatever the driver: write the solution as torch.linalg.pinv(A) "
                "@ B, or torch.linalg.solve(A.mT @ A, A.mT @ B) for a tall A of full rank; "
                "both trace.")
    return (f"\nThere, {', '.join(sorted(ops))} makes an output whose shape depends on the "
            "values of a tensor, which a traced step, whose shapes are fixed, cannot hold: "
            "compute it outside the module you optimize, on its outputs (a loss such as "
            "F.ctc_loss, whatever its lengths are given as: have the module return the log-"
            "probabilities), or write it with ops whose output shapes are fixed.")


_MASKING = {"aten.nonzero.default", "aten.masked_select.default", "aten._unique2.default",
            "aten.unique_dim.default", "aten.unique_consecutive.default"}
_PACKING = {"aten._pack_padded_sequence.default"}
_LSTSQ = {"aten.linalg_lstsq.default"}


def higher_order(errors: list[str]) -> str:
    """What to do where a higher-order op (torch.cond, torch.while_loop) could not be traced:
    with branches that call submodules, torch traces it only under torch.compile, and the
    step was told to avoid .item() (docs probe, 2026-12-06; NOTE [Branches taken by value])."""
    if not any("UncapturedHigherOrderOpError" in e for e in errors):
        return ""
    return ("\nThere, a higher-order op (torch.cond, torch.while_loop) could not be traced "
            "(torch traces this one only under torch.compile). A plan could not hold its limit "
            "over it anyway: torch.cond picks the code it runs by the values of a tensor, so "
            "what the step holds depends on each batch. Compute both branches and select "
            "with torch.where(pred, a, b), or optimize the modules around that op and run it "
            "as it is (NOTE [Branches taken by value] in monet_opt/branches.py).")


def lost_attribute(errors: list[str]) -> str:
    """What to do where the forward reads a Python attribute its own tensor subclass carries
    (bitsandbytes' Int8Params' .CB), which the trace's tensors do not (quantization probe,
    2026-12-07: it was told to avoid .item())."""
    found = sorted({e.split("object has no attribute '")[1].split("'")[0] for e in errors
                    if "AttributeError: 'FunctionalTensor' object has no attribute '" in e
                    or "AttributeError: 'FakeTensor' object has no attribute '" in e})
    if not found:
        return ""
    return (f"\nThere, the forward reads .{', .'.join(found)} from a tensor: an attribute a "
            "tensor subclass of the model carries (bitsandbytes' Int8Params and Params4bit "
            "carry their quantization state so), which the trace's own tensors, standing in for "
            "the model's, do not. Such layers cannot be traced: optimize the modules around "
            "them, and run those layers as they are.")


def generic(model) -> str:
    """What to try where no hint says more: the line named, and for an HF model that keeps a
    generation cache, that cache (not for one without: Wav2Vec2 was told so)."""
    cache = type(model).__module__.startswith("transformers.") and \
        bool(getattr(getattr(model, "config", None), "use_cache", False))
    return ("\nWhat to try: avoid data-dependent Python on tensor values at that line (.item(), "
            "if on a tensor, .tolist())" + (", pass use_cache=False" if cache else "") +
            ", or check that the model runs eagerly on sample_input.")


def detection(errors: list[str]) -> str:
    """What to do with a torchvision detection model in training (NOTE [What to try])."""
    if not any("/torchvision/models/detection/" in e for e in errors):
        return ""
    return ("\nThere, a torchvision detection model chooses sizes and boxes by the values of "
            "tensors in Python (its random resizing, degenerate-box checks, proposal sampling, "
            "non-maximum suppression), which a traced step, whose shapes are fixed, cannot "
            "follow: optimize its backbone alone, on the batch the model's transform makes "
            "(model.backbone = monet_opt.optimize(model.backbone, "
            "model.transform(images, targets)[0].tensors, limit)), and train the model as it is "
            "(the heads' gradient into its features is outside its plan: leave room for it).")


def fake_quantize(model) -> str:
    """What to use where the model has torch.ao.quantization.FakeQuantize modules (version 0
    of the QAT qconfig), whose forward tests its flags' values in Python (`if
    self.observer_enabled[0] == 1`): the error named the user's line that called the module
    (module probe, 2026-12-06)."""
    try:
        from torch.ao.quantization import FakeQuantize
    except ImportError:  # a torch without torch.ao
        return ""
    named = [name for name, m in model.named_modules() if type(m) is FakeQuantize]
    if not named:
        return ""
    return (f"\nIts torch.ao.quantization.FakeQuantize modules ({', '.join(named[:3])}"
            f"{', ...' if len(named) > 3 else ''}) test their observer_enabled and "
            "fake_quant_enabled flags' values in Python, which a traced step cannot follow: "
            "prepare the model with the default QAT qconfig "
            "(torch.ao.quantization.get_default_qat_qconfig(backend), version 1), whose "
            "FusedMovingAvgObsFakeQuantize takes them as tensors and trains bitwise.")


def adaptive_softmax(model) -> str:
    """What to use where the model has nn.AdaptiveLogSoftmaxWithLoss, whose forward picks each
    cluster's rows by the targets' values: the error advised against boolean masks the user's
    code has none of (layers probe, 2026-12-06)."""
    named = [name for name, m in model.named_modules()
             if isinstance(m, torch.nn.AdaptiveLogSoftmaxWithLoss)]
    if not named:
        return ""
    return (f"\nIts nn.AdaptiveLogSoftmaxWithLoss ({', '.join(named[:3])}) picks each "
            "cluster's rows by the targets' values in its forward, which a traced step cannot "
            "follow: train on `head.log_prob(hidden)` and take the targets' entries "
            "(`-head.log_prob(hidden).gather(1, target[:, None]).mean()`), which traces.")


# NOTE [What to try]
#   A CaptureError ends with what to try: where a hint names the cause (an HF cache returned, a
#   value-dependent shape, a detection model), that alone; else the generic line. The generic
#   line came before every hint and told every model to pass use_cache=False to HF models, and
#   a torchvision detection model (a value-dependent line in its transform, then another, then
#   more) was told only to avoid .item() at that line (journey probe, 2026-12-06).
def what_to_try(model, args: tuple, kwargs: dict) -> str | None:
    """None where the model runs eagerly on the sample; else, where it fails so too (a wrong
    channel count, an integer input to a convolution), that: nothing about tracing is to be
    changed; where it takes the positional arguments as one list, that (NOTE [A list read as
    arguments])."""
    exc = eager_failure(model, args, kwargs)
    if exc is None:
        return None
    if isinstance(exc, TypeError) and len(args) > 1 and not kwargs and \
            eager_failure(model, (list(args),), {}) is None:
        return (f"\nWhat to try: sample_input is read as {len(args)} positional arguments (a "
                f"list as a tuple is), which the model does not take ({where(exc)}); it runs on "
                "them as one list: pass `([a, b, ...],)`, a tuple holding the list.")
    return (f"\nWhat to try: the model fails on sample_input run eagerly too ({where(exc)}): "
            "fix the sample input (its shapes, dtypes and devices against the parameters') or "
            "the model; tracing is not the cause.")


# NOTE [A list read as arguments]
#   A list given as sample_input is read as positional arguments, as a tuple is (the README
#   says so). A forward that takes one list then failed to trace with "the model fails on
#   sample_input run eagerly too ... fix the sample input (its shapes, dtypes and devices)",
#   though `model([a, b])` runs: now it says to pass `([a, b],)` (lifecycle probe, 2026-12-05).
