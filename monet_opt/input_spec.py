"""What a plan holds of its inputs: their structure, each tensor's shape, dtype, device and
requires_grad, and the constants among them (NOTE [Constant arguments]); the optimized module
checks each call against it (NOTE [New input shapes] in monet_opt/module.py)."""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch.utils import _pytree as pytree

from monet_opt.errors import CaptureError, PlanMismatchError


# NOTE [Input layouts]
#   A step is traced for its inputs' strides as well as their shapes: the graph holds views and
#   layouts that follow from them (a flatten traced on a contiguous activation is a view, which
#   a channels-last one cannot take). A sample given contiguous and then a channels-last or
#   permuted image batch raised "view size is not compatible with input tensor's size and
#   stride" from inside the step, where eager ran. The strides (those of dimensions longer than
#   1, the others say nothing) are part of an input's spec, so another layout plans a step for
#   it, as another shape does (NOTE [New input shapes] in monet_opt/module.py), eager's results
#   for that layout.
@dataclass(frozen=True)
class LeafSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool
    strides: tuple[int, ...] = ()  # 0 where the dimension's length is 1
    sparse: tuple[str, int] | None = None  # layout and entries: NOTE [Sparse inputs]
    storage: int = 0  # bytes of a larger storage it views: NOTE [Inputs viewing more]

    @staticmethod
    def of(t: torch.Tensor) -> LeafSpec:
        if t.layout != torch.strided:
            return LeafSpec(tuple(t.shape), t.dtype, t.device, t.requires_grad,
                            sparse=(str(t.layout), t._nnz()))
        return LeafSpec(tuple(t.shape), t.dtype, t.device, t.requires_grad,
                        tuple(st if n > 1 else 0 for n, st in zip(t.shape, t.stride())),
                        storage=viewed_bytes(t))

    @property
    def contiguous(self) -> bool:
        return self.strides == LeafSpec.of(torch.empty(self.shape, device="meta")).strides

    def __str__(self) -> str:
        grad = ", requires_grad" if self.requires_grad else ""
        laid = f", {self.sparse[0]}, {self.sparse[1]} entries" if self.sparse else \
            "" if self.contiguous else f", strides {self.strides}"
        laid += f", viewing {self.storage:,} B" if self.storage else ""
        return f"{self.dtype} {list(self.shape)} on {self.device}{laid}{grad}"


# NOTE [Inputs viewing more]
#   An input that views a larger storage (a batch sliced from a data set held on the device,
#   `X[i:i + 8]`; `ids[:, :-1]`) keeps all of it alive, and the step counts all of it (NOTE
#   [Inputs that share a storage] in monet_opt/memory.py). The storage's size was in neither
#   key: a step planned for a batch of its own ran batches sliced from a data set (measured
#   158,400 B over its prediction and limit, where with gradients in place the same batches
#   planned a step that counted it), and a profile made on a sliced sample was served to a
#   sample of its own (its fixed memory, and so the limit a share names and the least peak,
#   50 % over). It is in both now: such an input plans a step of its own, once per size.
def viewed_bytes(t: torch.Tensor) -> int:
    """The bytes of the storage a dense tensor views where larger than its own, else 0."""
    held = t.untyped_storage().nbytes()
    return held if held > t.numel() * t.element_size() else 0


def with_viewed_note(err: Exception, inputs: list[torch.Tensor]) -> Exception:
    """`err` noting the inputs that view a larger storage, which the step holds whole and its
    figures count: an InfeasibleBudgetError for a slice of a 6-channel batch said only to raise
    the limit or use a smaller batch, where `.contiguous()` fitted (compile probe, 2026-12-06).
    A step planned anew for such inputs says so in its own note (replan_text's "layouts")."""
    beyond = {k: viewed_bytes(t) - t.numel() * t.element_size() for k, t in enumerate(inputs)
              if t.layout == torch.strided and viewed_bytes(t)}
    if beyond:
        err.add_note(f"monet_opt: input(s) {', '.join(map(str, beyond))} (in order, tensors "
                     "only) view a larger storage, which the step holds whole and the figures "
                     f"above count: {sum(beyond.values()):,} B beyond their own elements. Pass "
                     "them as .clone() copies to hold only their own (.contiguous() returns "
                     "a leading slice such as X[:8] as it is; NOTE [Inputs viewing more]).")
    return err


_CONSTANT = (bool, int, float, str, type(None))  # traced as constants: NOTE [Constant arguments]


# NOTE [Constant arguments]
#   A number, flag, string or None passed to the forward (opt(x, 2.0), act="relu",
#   attention_mask=None: a pytree leaf, refused like the others) is read by the
#   forward's Python while traced and is a constant of the step, as a module attribute is (NOTE
#   [Attributes read as constants] in monet_opt/attributes.py). They were refused (TypeError:
#   bind them with functools.partial). They are now part of the input spec, by position among
#   the leaves, and of a step's key: the step takes only the tensors, and another value plans a
#   step for it (ReplanWarning), once per value met.
@dataclass(frozen=True)
class InputSpec:
    """The structure and tensor metadata of the sample input a plan was made for, and its
    constant (non-tensor) leaves as (position among the leaves, type, value)."""

    treedef: pytree.TreeSpec
    leaves: tuple[LeafSpec, ...]
    constants: tuple[tuple[int, type, Any], ...] = ()

    @staticmethod
    def split(sample_input: Any) -> tuple[tuple, dict]:
        if isinstance(sample_input, torch.Tensor):
            return (sample_input,), {}
        if isinstance(sample_input, (tuple, list)):
            return tuple(sample_input), {}
        if isinstance(sample_input, dict):
            return (), dict(sample_input)
        raise TypeError("monet_opt.optimize: sample_input must be a tensor, a tuple of them or a "
                        f"dict of keyword arguments; got {type(sample_input).__name__}")

    @staticmethod
    def of(args: tuple, kwargs: dict, what: str = "monet_opt.optimize: every leaf of "
           "sample_input") -> tuple[InputSpec, list[torch.Tensor]]:
        leaves, treedef = pytree.tree_flatten((args, kwargs))
        tensors = InputSpec.tensors_of(leaves, what)
        return InputSpec(treedef, tuple(LeafSpec.of(x) for x in tensors),
                         constants_of(leaves)), tensors

    @staticmethod
    def tensors_of(leaves: list, what: str) -> list[torch.Tensor]:
        """The tensors among a call's flattened (args, kwargs); TypeError for a leaf that is
        neither a tensor nor a constant."""
        bad = [type(x).__name__ for x in leaves
               if not isinstance(x, torch.Tensor) and type(x) not in _CONSTANT]
        if bad:
            raise TypeError(f"{what} must be a tensor, or a bool, int, float, str or None (NOTE "
                            f"[Constant arguments]); found {bad}. Bind other arguments with "
                            "functools.partial or a wrapper.")
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        for x in tensors:
            _check_kind(x, what)
        return tensors

    def rebuild(self, tensors: list) -> tuple[tuple, dict]:
        """(args, kwargs) from the flat input tensors and the constants."""
        leaves, given = [], iter(tensors)
        constants = {k: x for k, _, x in self.constants}
        for k in range(len(self.leaves) + len(self.constants)):
            leaves.append(constants[k] if k in constants else next(given))
        return pytree.tree_unflatten(leaves, self.treedef)

    def check(self, leaves: list, structure: tuple, any_shape: bool = False
              ) -> list[torch.Tensor]:
        """The input tensors among `leaves` (a call's flattened (args, kwargs), whose treedef
        and constants are `structure`), checked against the plan's structure, shapes, strides,
        dtypes, devices and requires_grad (any_shape: all but the shapes, strides, dtypes,
        requires_grad and a sparse tensor's number of entries, which plan steps of their own;
        NOTE [New input shapes] in monet_opt/module.py, NOTE [Inputs of other dtypes])."""
        if structure != (self.treedef, self.constants):
            planned = self.rebuild([_Shown.of(leaf) for leaf in self.leaves])
            called = pytree.tree_unflatten([_Shown.of(x) if isinstance(x, torch.Tensor) else x
                                            for x in leaves], structure[0])
            raise PlanMismatchError(
                "monet_opt: the optimized module was planned for inputs structured as "
                f"({_call_text(*planned)}) but was called with ({_call_text(*called)}): other "
                "arguments, or constants of other values. Call it like the sample_input given "
                "to optimize(), or optimize again for this input.")
        leaves = [x for x in leaves if isinstance(x, torch.Tensor)]
        for k, (x, spec) in enumerate(zip(leaves, self.leaves)):
            _check_kind(x, f"monet_opt: input {k} of a training step")
            got = LeafSpec.of(x)
            entries = spec.sparse if got.sparse and spec.sparse and \
                got.sparse[0] == spec.sparse[0] else got.sparse  # NOTE [Sparse inputs]
            if (dataclasses.replace(got, shape=spec.shape, requires_grad=spec.requires_grad,
                                    strides=spec.strides, sparse=entries, storage=spec.storage,
                                    dtype=spec.dtype)
                    if any_shape else got) != spec:
                held = "shapes, dtypes, layouts and requires_grad" if not any_shape else \
                    "devices" if got.device != spec.device else "dense or sparse layouts"
                raise PlanMismatchError(
                    f"monet_opt: input {k} does not match the plan: expected {spec}, received "
                    f"{got}. The plan (and its memory limit) holds only for the sample_input's "
                    f"{held}; run optimize() again with a sample like the new input.")
        return leaves


# NOTE [Inputs of other dtypes]
#   An input of another dtype than the sample's was refused (PlanMismatchError), while
#   parameters of another dtype plan a step of their own: so after model.double() (or .half(),
#   .to(torch.bfloat16)) the one input eager then takes was refused, with nothing said of the
#   model. Now a dtype plans a step as a shape does (ReplanWarning), and where the model cannot
#   take it (a float64 batch for a float32 model) tracing says so, as eager would
#   (CaptureError: the model fails on these inputs run eagerly too). new_shapes="error"
#   refuses them still.
def constants_of(leaves: list) -> tuple[tuple[int, type, Any], ...]:
    """The non-tensor leaves, by position, with their types (1 and True are equal, but trace
    apart) (NOTE [Constant arguments]), each NaN as one object of its sign."""
    return tuple((k, type(x), _NANS[math.copysign(1.0, x) < 0] if x != x else x)
                 for k, x in enumerate(leaves) if not isinstance(x, torch.Tensor))


# NOTE [NaN as a constant]
#   A float NaN equals nothing, itself included, so a step keyed by a NaN passed as a
#   constant was found again only for that very object: a fresh float("nan") at each call
#   planned a step at each call (ReplanWarning, 0.4 s each, `plans` growing: inputs probe,
#   2026-12-07). Every NaN is keyed as one object of its sign, which a tuple compares by
#   identity and hashes by it; the step runs with that object, a NaN as the one given.
_NANS = (float("nan"), -float("nan"))


# NOTE [Inputs turned to need grad]
#   A forward that calls `x.requires_grad_()` on its own input (a saliency map, an input
#   gradient for an adversarial step) gives that input a gradient in eager. The traced step
#   takes its inputs as they are passed, and an input passed without requires_grad gets no
#   gradient: `x.grad` stayed None and `x.requires_grad` False, with nothing said, while the
#   parameters' gradients were eager's. The trace now watches its inputs and refuses a forward
#   that turns one to need a gradient, saying to set it before the call, where the step plans
#   that gradient (an input passed requiring grad gets eager's, bitwise:
#   tests/test_capture_errors.py).
@contextlib.contextmanager
def grad_left_off(inputs: Sequence[Any]):
    """Raise CaptureError where the code run inside turns one of `inputs` to require grad."""
    off = [t for t in inputs if isinstance(t, torch.Tensor) and not t.requires_grad]
    yield
    if any(t.requires_grad and t.grad_fn is None for t in off):  # not made by an in-place op
        raise CaptureError(
            "monet_opt.optimize: the model's forward turns an input to require a gradient "
            "(x.requires_grad_() on what it was passed); the optimized step takes its inputs "
            "as they are passed, so that input would get no gradient. Set it before the call "
            "instead: x.requires_grad_() outside the module, for the sample_input and for every "
            "batch, and the step plans x's gradient as eager computes it (NOTE [Inputs turned "
            "to need grad] in monet_opt/input_spec.py).")


def _check_kind(x: torch.Tensor, what: str) -> None:
    """TypeError where `x` is a kind of tensor a step cannot take (each failed inside torch, or
    was blamed on something else), at optimize() and at every call (NOTE [Tensor subclasses as
    inputs])."""
    if x.is_nested:
        raise TypeError(f"{what} must be a dense or sparse COO tensor; found a nested tensor "
                        "(torch.nested). Pad it (torch.nested.to_padded_tensor) and pass a mask.")
    if x.layout not in (torch.strided, torch.sparse_coo):
        raise TypeError(f"{what} must be a dense or sparse COO tensor; found one of layout "
                        f"{x.layout}. Convert it: .to_sparse_coo() or .to_dense().")
    if x.layout == torch.sparse_coo and x.requires_grad:
        raise TypeError(f"{what}: a sparse input that requires grad cannot be planned (its "
                        "gradient is sparse). Pass it detached, or dense.")
    for cls in type(x).__mro__:
        if cls in (torch.Tensor, torch.nn.Parameter):
            return
        if "__torch_function__" in vars(cls) or "__torch_dispatch__" in vars(cls):
            raise TypeError(
                f"{what} must be a plain tensor; found a {type(x).__name__}, a torch.Tensor "
                "subclass that changes how torch's functions run on it, which a traced step "
                "cannot take. Pass a plain tensor" + (
                    ": for a CausalBias, is_causal=True to scaled_dot_product_attention "
                    "(causal_upper_left), or the boolean mask torch.ones(L, S, dtype=torch.bool)"
                    ".tril(S - L) (causal_lower_right)." if cls.__name__ == "CausalBias"
                    else " (NOTE [Tensor subclasses as inputs] in monet_opt/input_spec.py)."))


# NOTE [Tensor subclasses as inputs]
#   A subclass that runs torch's functions its own way (__torch_function__ or
#   __torch_dispatch__: torch.nn.attention.bias's CausalBias, DTensor) is traced as the plain
#   tensor it wraps, or not at all: a CausalBias mask passed in failed in the trace with
#   "Attempting to broadcast a dimension of length 2" for an 8x8 mask, then advice about
#   .item() (inputs probe, 2026-12-07). It is refused, with what to pass instead. A subclass
#   that only adds Python methods (`x.as_subclass(MyTensor)`) trains as eager does. The kinds
#   are checked at every call, not only at optimize(): a nested tensor passed at a later call
#   raised a bare NotImplementedError (aten._nnz) from the input's spec.


class _Shown(str):
    """An input tensor as a call's text shows it: float32[4x8]."""

    @staticmethod
    def of(t: torch.Tensor | LeafSpec) -> _Shown:
        return _Shown(f"{str(t.dtype).removeprefix('torch.')}[{'x'.join(map(str, t.shape))}]")

    def __repr__(self) -> str:
        return str(self)


def _call_text(args: tuple, kwargs: dict) -> str:
    """'float32[4x8], 2.0, mask=None': a call's arguments, their tensors as _Shown."""
    return ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])



# NOTE [Inputs written in place]
#   Eager refuses a forward that writes in place into its input where that input is a leaf that
#   requires a gradient (`x.relu_()` on an adversarial batch: "a leaf Variable that requires
#   grad is being used in an in-place operation"). The traced step wrote into the caller's
#   tensor and handed back the gradient of the value before the write, with nothing said
#   (dtype probe, 2026-12-06). The trace now refuses it the same way, naming the input and what
#   to do; a write autograd does not see (under no_grad) or into an input that is not a leaf
#   is traced as eager runs it.
@contextlib.contextmanager
def leaves_written(inputs: Sequence[Any], leaves: frozenset[int]):
    """Raise CaptureError where the code run inside writes, where autograd sees it, into one of
    `inputs` at the positions `leaves` (the step's inputs that are leaves requiring grad)."""
    yield
    for k in sorted(leaves):
        t = inputs[k]
        if type(t).__name__ == "FunctionalTensor" and \
                torch._functionalize_has_data_mutation(t.elem) and \
                not torch._functionalize_are_all_mutations_hidden_from_autograd(t.elem) and \
                not torch._functionalize_are_all_mutations_under_no_grad_or_inference_mode(t.elem):
            raise CaptureError(
                f"monet_opt.optimize: the model's forward writes in place into its input tensor "
                f"#{k} (counted among its tensor arguments), a leaf that requires grad; eager "
                "raises \"a leaf Variable that requires grad is being used in an in-place "
                "operation\", and the step would write into your tensor and give it the "
                "gradient of its value before the write. Write out of place (x = x.relu() for "
                "x.relu_()), or write under torch.no_grad() if autograd must not see it (NOTE "
                "[Inputs written in place] in monet_opt/input_spec.py).")
