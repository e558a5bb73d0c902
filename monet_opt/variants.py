"""The operator-variant library (MONeT's idea in stock PyTorch; DESIGN "Operator variants").

Each family is data: a backward ATen op, the argument of it that the family does without, how
the forward encodes that argument right after it is made (`encode`, or None when the op needs
only its shape), and how the backward does without it: either `run`, called instead of the op
with the encoded tensor in the argument's place, or `decode`, which rebuilds a stand-in for the
argument from the encoded tensor, after which the op itself runs. Lowering turns each match into
a `solvers.Variant`; the profiler measures its time and workspace and checks its result; the
executor emits `encode`/`run` where the schedule chooses it.

Families flagged `exact` give the backward's result bitwise; the others (`exact=False`, lossy)
are offered only under `optimize(..., allow_lossy=True)` and their docstrings state the error.

NOTE [Layouts a stand-in cannot show]
  Pooling's backward allocates its result in its input's layout (channels-last in, channels-last
  out). A shape-only variant gives the op a stand-in that holds one element, expanded, which
  reads as contiguous: the result came out contiguous where the graph expects channels-last,
  and the profiler refused the variant. Such families (`lays_out`) take the result's strides
  as their params, and the op writes into a result allocated with them (its out= overload),
  bitwise what it returns otherwise (tests/test_variants_layout.py). Only where the strides are
  not contiguous: the stand-in's result is contiguous by itself, and an out= overload may write
  through a temporary (_adaptive_avg_pool2d_backward's on CPU: the result's bytes again, seen
  as the variant's workspace once kernels' scratch is counted, NOTE [Allocation events]).

NOTE [Combining variants]
  The solver lets variants of one op that replace different arguments combine (solvers.Variant
  groups are (op, replaced tensor)); max-pool's backward may drop its input (shape only) and
  compact its indices at once. A `run` replaces the whole op, so two of them cannot compose:
  every family replacing an argument of an op that another family replaces a different argument
  of must be `decode`-style (checked when the library loads). The executor then decodes each
  chosen argument and calls the op once (`run` below).

NOTE [Backward from the output]
  MONeT lets an activation's backward read its output instead of its input where that is
  exact. The joint graph already does so wherever it can: `sigmoid_backward`,
  `tanh_backward` and `_softmax_backward_data` read the forward's output, `threshold_backward`
  reads ReLU's (lowering), `hardtanh_backward` is made to (NOTE [Saved clones]). For the
  others no exact form exists: GELU and SiLU are not one-to-one (both dip below zero and come
  back: two inputs give the same output, so the derivative cannot be read off the output),
  and LayerNorm rebuilt from its output ((y - bias) / weight) rounds differently from the
  normalized input its backward recomputes, and fails at a zero weight. So no family here
  offers it; tests/test_variants.py checks both halves.
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from monet_opt import recompute, variants_bits, variants_bn, variants_impl, variants_pool
from monet_opt.errors import InternalError, internal_assert

aten = torch.ops.aten


@dataclass(frozen=True)
class Family:
    """name: unique, used in plans. op/arg: the backward op and the argument it replaces.
    encode(x, *params) -> the smaller tensor the forward keeps (None: keep nothing, the op
    needs x's (shape, dtype) only). params(node): constants encode/decode take, from the
    backward node. accepts(node): whether the family applies to this node at all.
    Exactly one of: run(*args) -> the op's result, args as the op's with the replaced one
    swapped for the encoded tensor (or, without encode, for a (shape, dtype) pair); or
    decode(encoded, *params) -> a tensor the op can read in the argument's place.
    exact: the result is bitwise the op's. max_rel_error (lossy families only): the largest
    relative error (max-abs, per output) of the op's result the profiler accepts.
    params_to_run: run gets the family's params (a tuple) before the op's arguments.
    run_into (run families only): as run, with the result written into the op's first
    argument, where the lowering lets the op write there (NOTE [A ReLU's mask and its gradient
    in place] in monet_opt/variants_bits.py).
    lays_out (decode families only): params[0] are the strides of the op's result, which the
    decoded stand-in cannot convey (NOTE [Layouts a stand-in cannot show]).
    draw(*params) (replaying families only, NOTE [Generator-state replay]): draws the argument
    afresh from the generator, as its producer does; such a family's encoded form is the
    generator state from just before the producer ran, and `decode` draws the argument again
    from it. reads(node) (families without encode): the forward node whose value the op gets
    in the argument's place, one the forward makes anyway: the argument itself for another
    implementation of the op (NOTE [Other implementations]), a BatchNorm's output for its
    input (NOTE [BatchNorm from its output])."""

    name: str
    op: torch._ops.OpOverload
    arg: int
    encode: Callable[..., torch.Tensor] | None
    run: Callable[..., torch.Tensor] | None = None
    decode: Callable[..., torch.Tensor] | None = None
    params: Callable[[fx.Node], tuple] = lambda node: ()
    accepts: Callable[[fx.Node], bool] = lambda node: True
    exact: bool = True
    max_rel_error: float = 0.0
    params_to_run: bool = False
    lays_out: bool = False
    draw: Callable[..., torch.Tensor] | None = None
    reads: Callable[[fx.Node], fx.Node | None] | None = None
    run_into: Callable[..., torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if (self.run is None) == (self.decode is None):
            raise ValueError(f"variant family {self.name!r}: give exactly one of run, decode")
        if self.reads is not None and self.encode is not None:
            raise ValueError(f"variant family {self.name!r}: one that reads a forward node "
                             f"keeps nothing of its own to encode")
        if self.exact != (self.max_rel_error == 0.0):
            raise ValueError(f"variant family {self.name!r}: an exact family tolerates no "
                             f"error, a lossy one must state its bound")


# NOTE [Generator-state replay]
#   Dropout's mask is a function of the generator state before `native_dropout` ran and of the
#   layout of its input, never of the input's values. The replay family keeps that state
#   (rewrite.py captures it just before the forward op into the op's slot, which the step holds
#   anyway: NOTE [A replay's state] in monet_opt/recompute.py; on CPU the 5056-byte Mersenne-
#   Twister state, on CUDA 16 bytes of Philox seed and offset, host memory), and the backward
#   draws the mask again with the generator set to the state and put back afterwards
#   (recompute.rng_replay). On CPU `native_dropout` draws its mask as `bernoulli_(1 - p)` into a
#   tensor laid out like its input, whatever that tensor's dtype (measured: float16/32/64,
#   bfloat16 and bool draw alike, transposed and channels-last included), so the replay draws
#   straight into a bool tensor laid out like the mask: its only workspace is the mask.
#   Elsewhere (CUDA's fused kernel) it runs `native_dropout` itself on an uninitialised input of
#   the same layout: the same kernel on the same draws, at the cost of that input and output for
#   a moment. Either way the profiler checks it: it captures a state, draws a mask as the
#   forward does, and withdraws the variant unless the backward from the replayed mask is
#   bitwise the backward from that one. CUDA's kernel is vectorised by the input's address
#   (16-byte aligned or not), and its two forms hand the draws to other elements: an input
#   viewing its storage at an offset misaligned so is replayed at that same misalignment (the
#   profiler's own check draws both masks alike, so it would not have seen it).


def _is_dropout_mask(node: fx.Node) -> bool:
    mask = node.args[1]
    return isinstance(mask, fx.Node) and mask.target is operator.getitem and \
        isinstance(mask.args[0], fx.Node) and mask.args[0].target is aten.native_dropout.default


def _dropout_layout(node: fx.Node) -> tuple:
    """(p, shape, the mask's stride, the input's stride, the input's dtype, its bytes past a
    16-byte boundary, device) of the native_dropout whose mask `node` reads."""
    mask = node.args[1]
    drop = mask.args[0]
    x = drop.args[0].meta["val"]
    return (float(drop.args[1]), tuple(x.shape), tuple(mask.meta["val"].stride()),
            tuple(x.stride()), x.dtype, x.storage_offset() * x.element_size() % 16,
            str(x.device))


def _generator_state(mask: torch.Tensor, *layout) -> torch.Tensor:
    """What the replay family keeps, as the profiler and the memory model see it (the executor
    captures it before the producer instead)."""
    with unset_fake_temporarily():
        return recompute.rng_state(layout[-1])


def _dropout_draw(p, shape, mask_stride, stride, dtype, misaligned, device) -> torch.Tensor:
    """A dropout mask drawn from the generator as native_dropout draws it."""
    if torch.device(device).type == "cpu":
        return torch.empty_strided(shape, mask_stride, dtype=torch.bool).bernoulli_(1 - p)
    offset = misaligned // torch.empty((), dtype=dtype).element_size()
    span = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 0
    x = torch.empty(offset + span, dtype=dtype, device=device).as_strided(shape, stride, offset)
    return aten.native_dropout(x, p, True)[1]


def _dropout_replay(state: torch.Tensor, *layout) -> torch.Tensor:
    return recompute.with_generator_state(state, layout[-1], _dropout_draw, *layout)


# ---- reduced precision (lossy): keep a float32 tensor as bfloat16, upcast in the backward ----

def _to_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16)


def _from_bf16(y: torch.Tensor) -> torch.Tensor:
    return y.to(torch.float32)


def _float32_arg(k: int) -> Callable[[fx.Node], bool]:
    return lambda node: isinstance(node.args[k], fx.Node) and \
        node.args[k].meta["val"].dtype == torch.float32


def _conv_weight_grad_wanted(node: fx.Node) -> bool:
    return bool(node.args[10][1]) and _float32_arg(1)(node)


# NOTE [Lossy bound]: bfloat16 keeps 8 significand bits, so each stored element is off by at
# most 2**-9 relative; the backward upcasts it to a float32 temporary (the variant's workspace:
# it saves memory between the forward and that backward op, never at the op itself). The
# profiler accepts a lossy result of the op only within LOSSY_OP_BOUND (max-abs relative per
# output; measured on CPU on the test models: at most 2.8e-3). Training with them chosen
# (tests/test_variants_lossy.py): the first step's parameter gradients within 1e-2 of eager's
# (measured at most 1.8e-3 on a small CNN, 3.3e-4 on an MLP), the loss over 3 SGD steps within
# 5e-3 (measured 8.9e-4).
LOSSY_OP_BOUND = 2.0 ** -6

pool, bits = variants_pool, variants_bits
FAMILIES: tuple[Family, ...] = (
    Family("relu.bool_mask", aten.threshold_backward.default, 1, bits.relu_bool_encode,
           run=bits.relu_bool_run, params=lambda node: (node.args[2],),
           run_into=bits.relu_bool_run_into),
    Family("relu.bit_mask", aten.threshold_backward.default, 1, bits.relu_bit_encode,
           run=bits.relu_bit_run, params=bits.relu_bit_params, params_to_run=True,
           run_into=bits.relu_bit_run_into),
    Family("dropout.bit_mask", aten.native_dropout_backward.default, 1, bits.pack_bits,
           run=bits.dropout_bit_run, run_into=bits.dropout_bit_run_into),
    Family("dropout.replay", aten.native_dropout_backward.default, 1, _generator_state,
           decode=_dropout_replay, draw=_dropout_draw, params=_dropout_layout,
           accepts=_is_dropout_mask),
    # Pooling (monet_opt/variants_pool.py): the backward reads the input for its shape only;
    # max-pool's int64 indices are kept as in-window offsets (1 byte each up to 16x16 windows).
    Family("maxpool.shape_only", aten.max_pool2d_with_indices_backward.default, 1, None,
           decode=pool.shape_only, params=pool.result_strides, lays_out=True),
    Family("maxpool.compact_indices", aten.max_pool2d_with_indices_backward.default, 7,
           pool.compact_indices, decode=pool.full_indices, params=pool.maxpool_geometry,
           accepts=pool.compactable),
    Family("avgpool.shape_only", aten.avg_pool2d_backward.default, 1, None,
           decode=pool.shape_only, params=pool.result_strides, lays_out=True),
    Family("adaptive_avgpool.shape_only", aten._adaptive_avg_pool2d_backward.default, 1, None,
           decode=pool.shape_only, params=pool.result_strides, lays_out=True),
    # A convolution whose weight gradient is not wanted (frozen weights) reads its input only
    # for the shape, where that input is contiguous (a channels-last one picks another kernel,
    # whose grad_input differs in its last bits from the one the stand-in gets).
    Family("conv.shape_only", aten.convolution_backward.default, 1, None,
           decode=pool.shape_only, accepts=lambda node: not node.args[10][1]
           and node.args[1].meta["val"].is_contiguous()),
    # Lossy, opt-in (NOTE [Lossy bound]): the kept input of a convolution whose weight
    # gradient is wanted, and the operands of the matrix products linear layers lower to.
    Family("conv.input_bf16", aten.convolution_backward.default, 1, _to_bf16,
           decode=_from_bf16, accepts=_conv_weight_grad_wanted, exact=False,
           max_rel_error=LOSSY_OP_BOUND),
    *(Family(f"{op}.arg{k}_bf16", getattr(aten, op).default, k, _to_bf16, decode=_from_bf16,
             accepts=_float32_arg(k), exact=False, max_rel_error=LOSSY_OP_BOUND)
      for op in ("mm", "bmm") for k in (0, 1)),
    # Lossy, opt-in: a BatchNorm's backward from its output (monet_opt/variants_bn.py);
    # convolution's and attention's backward done otherwise (monet_opt/variants_impl.py).
    Family(variants_bn.NAME, aten.native_batch_norm_backward.default, 1, None,
           run=variants_bn.from_output, reads=variants_bn.output_node,
           accepts=variants_bn.accepts, exact=False, max_rel_error=LOSSY_OP_BOUND),
    Family("conv.other_backend", aten.convolution_backward.default, 1, None,
           run=variants_impl.conv_backward, reads=variants_impl.the_argument(1),
           accepts=variants_impl.accepts_conv, exact=False,
           max_rel_error=variants_impl.IMPL_BOUND),
    Family("attention.math_backward",
           aten._scaled_dot_product_flash_attention_for_cpu_backward.default, 1, None,
           run=variants_impl.attention_backward, reads=variants_impl.the_argument(1),
           accepts=variants_impl.accepts_attention, exact=False,
           max_rel_error=variants_impl.IMPL_BOUND),
    Family("attention.efficient_math_backward",
           aten._scaled_dot_product_efficient_attention_backward.default, 1, None,
           run=variants_impl.efficient_attention_backward, reads=variants_impl.the_argument(1),
           accepts=variants_impl.accepts_efficient_attention, exact=False,
           max_rel_error=variants_impl.IMPL_BOUND),
)
_BY_NAME = {f.name: f for f in FAMILIES}


def _check_library(families: tuple[Family, ...]) -> None:
    """NOTE [Combining variants]: families of one op replacing different arguments decode."""
    args: dict[object, set[int]] = {}
    for f in families:
        args.setdefault(f.op, set()).add(f.arg)
    for f in families:
        internal_assert(len(args[f.op]) == 1 or f.decode is not None,
                        f"variant family {f.name!r} has a run, but other families replace "
                        f"other arguments of {f.op}: it must decode instead")
    internal_assert(len(_BY_NAME) == len(families), "variant family names repeat")


_check_library(FAMILIES)


def families_for(node: fx.Node, allow_lossy: bool = False) -> list[Family]:
    return [f for f in FAMILIES if node.target is f.op and (f.exact or allow_lossy)
            and f.accepts(node)]


def family(name: str) -> Family:
    return _BY_NAME[name]


# ---- what executed graphs call (module-level, so FX code can name them) ----

def encode(name: str, x: torch.Tensor, *params) -> torch.Tensor:
    return _BY_NAME[name].encode(x, *params)


def run(names: tuple[str, ...], params: tuple[tuple, ...], *args, **kwargs):
    """The backward op, with the chosen variants (`names`, their `params`) doing without the
    arguments they replace; args are the op's, each replaced one swapped for its encoded form
    (NOTE [Combining variants])."""
    fams = [_BY_NAME[n] for n in names]
    if len(fams) == 1 and fams[0].run is not None:
        return _run(fams[0], fams[0].run, params, args, kwargs)
    args_ = list(args)
    layout = None
    for fam, p in zip(fams, params):
        internal_assert(fam.decode is not None and fam.op is fams[0].op,
                        f"variants {names} cannot combine (NOTE [Combining variants])")
        if fam.lays_out:  # NOTE [Layouts a stand-in cannot show]
            layout = (*args_[fam.arg], p[0])
        args_[fam.arg] = fam.decode(args_[fam.arg], *p)
    if layout is None:
        return fams[0].op(*args_, **kwargs)
    # allocated once every argument is decoded, as the op allocates its own result: made
    # before, it was held beside the decoding's temporaries, 8 MiB over the profiled workspaces
    # of the two max-pool variants on GoogLeNet's 32x256x16x16 pool
    shape, dtype, device, strides = layout
    if tuple(strides) == torch.empty(shape, device="meta").stride():
        return fams[0].op(*args_, **kwargs)  # what the op lays out anyway (NOTE [Layouts a ...])
    result = torch.empty_strided(shape, strides, dtype=dtype, device=device)
    name, overload = _out_overload(fams[0].op)
    return overload(*args_, **kwargs, **{name: result})


def _run(fam: Family, fn: Callable[..., torch.Tensor], params: tuple[tuple, ...], args: tuple,
         kwargs: dict) -> torch.Tensor:
    return fn(params[0], *args, **kwargs) if fam.params_to_run else fn(*args, **kwargs)


def writes_into(names: tuple[str, ...]) -> bool:
    """Whether the variants `names` can write the op's result into its first argument."""
    return len(names) == 1 and _BY_NAME[names[0]].run_into is not None


def run_into(names: tuple[str, ...], params: tuple[tuple, ...], *args, **kwargs):
    """`run`, the result written into the op's first argument (`writes_into(names)`)."""
    fam = _BY_NAME[names[0]]
    return _run(fam, fam.run_into, params, args, kwargs)


@functools.cache  # looked up on every backward run of a layout-keeping variant
def _out_overload(op: torch._ops.OpOverload) -> tuple[str, torch._ops.OpOverload]:
    """The out= overload of `op` and the name of its one out argument."""
    packet = op.overloadpacket
    for name in packet.overloads():
        overload = getattr(packet, name)
        outs = [a.name for a in overload._schema.arguments if a.is_out]
        if len(outs) == 1:
            return outs[0], overload
    raise InternalError(f"{op} has no out= overload with one result")
