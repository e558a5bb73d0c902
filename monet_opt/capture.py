"""Capture a model's training step as AOTAutograd's joint forward+backward graph.

The model becomes a pure function of flat tensors (parameters, buffers, inputs) through
`torch.func.functional_call`, so parameters used twice and tied weights are one input each and
frozen parameters simply get no gradient. AOTAutograd traces it on first call and hands the
joint graph to our partition function; its runtime then handles buffer updates, output pytrees
(HF ModelOutput included) and gradient accumulation. Models whose Python does not trace directly
(HF GPT-2's masking reads a mask's values) are traced as torch.compile would be, or exported first
with `torch.export(strict=False)` (NOTE [The capture route]).
"""
from __future__ import annotations

import contextlib
import gc
import io
import sys
import threading
from typing import Any, Callable

import torch
from torch._functorch import config as functorch_config
from torch._functorch._aot_autograd import graph_compile
from torch._functorch.aot_autograd import aot_function
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx._lazy_graph_module import _use_lazy_graph_module

from monet_opt import (alloc_events, attribute_tensors, capture_hints, data_assigned,
                       export_route, forward_state, host_random, input_spec, kernels,
                       module_paths, outputs_fp32, saved_hooks, set_back, tensor_kinds)
from monet_opt.eager_kernels import eager_kernels
from monet_opt.errors import CaptureError, MonetError, internal_assert
from monet_opt.input_spec import InputSpec
from monet_opt.parametrize_cache import own_cache
from monet_opt.reentrant import plain_checkpoints


# NOTE [Autocast is traced]
#   Under torch.autocast, tracing records every cast autocast makes as an op of the joint graph,
#   so the plan (its profile, its peak, its schedule) is of the mixed-precision step, and the
#   step runs those casts whatever autocast says when it runs. The backward is traced with
#   autocast off (AOTAutograd's backward_pass_autocast="off"), as eager runs it when
#   `loss.backward()` is called outside the autocast block, which is how PyTorch's AMP recipe
#   trains; by default AOTAutograd would trace it under the forward's autocast, which casts the
#   backward's matrix products too (the first gradients then differed from eager's in the
#   third significant digit, on a small CNN under bfloat16). The autocast state is part of what
#   tells steps apart: a step under another state than optimize() saw is planned for it
#   (ReplanWarning; NOTE [New input shapes] in monet_opt/module.py), as eager would run it. It
#   was refused (PlanMismatchError), which stopped a model optimized and then prepared by
#   accelerate's Accelerator(mixed_precision="bf16"), whose forward then runs under autocast.
#   Under each state the step trains like the model under it, bitwise (tests/test_autocast.py).
AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_state() -> tuple[tuple[str, Any], ...]:
    """(device type, dtype) of each device type autocast is on for now; and the kernel
    choices made as a step is traced, where not as at import (NOTE [Attention kernels are
    traced] in monet_opt/kernels.py); and whether kernels' scratch goes unmeasured (NOTE [Plans
    made inside a profiler] in monet_opt/alloc_events.py)."""
    return tuple((d, torch.get_autocast_dtype(d)) for d in AUTOCAST_DEVICES
                 if torch.is_autocast_enabled(d)) + kernels.changed() + \
        alloc_events.unmeasured() + outputs_fp32.state()  # NOTE [Outputs accelerate makes float32]


def state_names(model: torch.nn.Module) -> tuple[list[str], list[str], list[str]]:
    """Parameter, buffer and tensor-attribute names (NOTE [Tensors held as attributes] in
    monet_opt/attribute_tensors.py), each tensor once (tied weights appear under one name)."""
    return ([n for n, _ in model.named_parameters()], [n for n, _ in model.named_buffers()],
            attribute_tensors.attribute_names(model))


def compile_step(model: torch.nn.Module, spec: InputSpec, partition_fn: Callable,
                 export_example: tuple[tuple, dict] | None = None,
                 leaves: frozenset[int] = frozenset()) -> Callable:
    """A function of (*params, *buffers, *attributes, *inputs) that runs the model under our
    partition.
    With `export_example` = (args, kwargs), the model is exported first (non-strict).
    leaves: the inputs (positions) that are leaves requiring grad (NOTE [Inputs written in
    place] in monet_opt/input_spec.py)."""
    target = model
    if export_example is not None:
        args, kwargs = export_example
        with export_route.TensorHooksRefused():  # NOTE [What the export route leaves out]
            target = forward_state.exported(model, lambda: _no_partial_graph(
                lambda: torch.export.export(model, args, kwargs, strict=False).module()))
    params, buffers, attributes = state_names(model)
    names = params + buffers + attributes
    # NOTE [Attributes that are parameters or buffers]; the exported module holds none
    aliased = attribute_tensors.aliases(model) if export_example is None else {}
    n_state = len(names)
    held = len(params) + len(buffers) if export_example is not None else n_state

    # NOTE [Tensors kept on a module], NOTE [Attributes set before read]
    kept = forward_state.Kept(range(len(params) + len(buffers), n_state))

    def flat_model(*flat):
        state = dict(zip(names[:held], flat[:held]))  # the exported module holds no attributes
        state.update((alias, state[name]) for alias, name in aliased.items() if name in state)
        shapes = [t.shape for t in flat[:n_state]]
        args, kwargs = spec.rebuild(list(flat[n_state:]))
        # NOTE [Parameters assigned through .data] in monet_opt/data_assigned.py
        with data_assigned.as_updates(flat[:n_state], names), \
                input_spec.grad_left_off(flat[n_state:]), \
                input_spec.leaves_written(flat[n_state:], leaves):  # NOTEs [Inputs turned to
            # need grad], [Inputs written in place] in monet_opt/input_spec.py
            outputs = outputs_fp32.convert(kept.call(target, lambda: attribute_tensors.call_with(
                target, state, args, kwargs, attributes)))  # NOTE [Outputs accelerate makes
            #                                                   float32] in outputs_fp32.py
        forward_state.write_back(model, names, len(params), flat[:n_state], shapes, state,
                                 len(params) + len(buffers))
        return kept.outputs(outputs)  # NOTE [The outputs' structure]

    boxed = lambda gm, _inputs: _boxed(gm)  # noqa: E731
    # enable_log: AOTAutograd would print every graph it makes to a string for its logs
    # (0.2 s of a cached optimize() of the demo's GPT-2), whether or not logging is on.
    compiled = aot_function(flat_model, fw_compiler=boxed, bw_compiler=boxed,
                            partition_fn=kept.partitioning(partition_fn), enable_log=False)
    return forward_state.CompiledStep(compiled, target, kept, tuple(attributes))


# NOTE [Export's partial graph]
#   torch.export, failing on a data-dependent expression, prints the graph it had traced so far
#   to stderr before raising: the whole model's ops up to that line, thousands of lines on a
#   large one, ahead of the CaptureError that names the line and what to do (a Faster R-CNN in
#   training, whose transform draws a size with .item(): 44 lines of one model's arguments and
#   ops). The export route is the last one tried, so the error says all there is; what export
#   writes to stderr is held while it runs and written out after it, less that graph.
def _no_partial_graph(export: Callable):
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            return export()
    except BaseException as err:
        graph = getattr(err, "partial_fx_graph", None)
        if graph:  # printed once by each of export's wrappers it passed
            held = io.StringIO(held.getvalue().replace(f"{graph}\n", ""))
        raise
    finally:
        sys.stderr.write(held.getvalue())


class _Compiled(Exception):
    """Raised by a compiled graph on the call that only compiles (NOTE [Compiling, not
    running])."""


class _OnlyCompiling(threading.local):
    """Per thread: another thread's step, run while this one compiles on fakes, raised
    _Compiled out of its forward (two threads stepping a module, one of them planning anew:
    CI, 2026-12-06)."""
    on = False


_only_compiling = _OnlyCompiling()


def _boxed(gm: torch.fx.GraphModule):
    """Our partition emits graphs with the boxed calling convention: they take a list and clear
    it, so the backward can free saved tensors as it goes."""
    def run(args):
        if _only_compiling.on:
            args.clear()
            raise _Compiled
        return gm(args)
    run._boxed_call = True
    return run


# NOTE [The capture route]
#   Three ways to the joint graph, tried in this order until one traces:
#   - "direct": AOTAutograd traces the model's Python as it is;
#   - "as compiling": the same, with torch.compiler.is_compiling() true while it traces. Its
#     documented meaning is "a graph is being traced", and libraries use it to skip checks that
#     read tensor values: HF transformers' masking does (`.all()` on a mask, masking_utils.py),
#     which the direct trace cannot get past. torch.export sets the same flag;
#   - "export": torch.export(strict=False) first, then AOTAutograd on the exported module (two
#     traces, so the slowest).
#   The route that worked is remembered per model class (torch.export's per model), so a second
#   optimize() of the same model (same process) goes straight to it instead of failing the
#   others first. Once AOTAutograd has called our partition function the trace has worked: an
#   error from there on (lowering, profiling, solving, building the step) is ours or the
#   plan's, not the route's, and propagates as raised. It used to send the model down the next
#   route whenever no plan had been made yet, so a failure in our own rewrites or lowering was
#   reported as a failed trace, or worse, hidden by a route that traced the model otherwise
#   (the export route reads no tensor attributes: NOTE [Tensors held as attributes]).
#   NOTE [A route that loses the backward]: where the first routes failed and a later one
#   traced a step with no output requiring grad (torch.export's of a reversible network that
#   replays the random state in a custom Function's backward), optimize() said the model had
#   no backward (NoBackwardError, false: eager trains every parameter) and dropped the first
#   routes' errors (exotic ops probe, 2026-12-07). It is a failed route too: the CaptureError
#   names each.
ROUTES = ("direct", "as compiling", "export")
_ROUTE: dict[type, str] = {}  # but torch.export's (NOTE [What the export route leaves out])
_HOW = {"direct": "AOTAutograd",
        "as compiling": "AOTAutograd with torch.compiler.is_compiling() true",
        "export": "torch.export(strict=False) then AOTAutograd"}


def first_call(model: torch.nn.Module, spec: InputSpec, args: tuple, kwargs: dict,
               primals: list[torch.Tensor], partition_fn: Callable,
               partitioned: Callable[[], bool]) -> Callable:
    """Compile and run once (this traces, plans and builds), by the first route of ROUTES that
    traces (NOTE [The capture route]). Raises CaptureError naming what failed on each. Errors
    once `partition_fn` was called (`partitioned()` is true) are not tracing problems and
    propagate unchanged."""
    errors: list[str] = []
    checked = False  # a torch.distributions argument check failed to trace
    causal = False  # a transformer's check of its mask's values failed to trace
    known = export_route.known(model, _ROUTE)
    routes = ROUTES if known is None else (known, *(r for r in ROUTES if r != known))
    inputs = primals[len(primals) - len(spec.leaves):]
    leaves = frozenset(k for k, t in enumerate(inputs) if t.requires_grad and t.is_leaf)
    for route in routes:
        export_example = (args, kwargs) if route == "export" else None
        try:
            before, grads = forward_state.attributes(model), set_back.grads_of(model)
            if route == "export":  # NOTE [What the export route leaves out]
                export_route.refuse_backward_hooks(model)
            try:
                with _tracing(as_compiling=route == "as compiling"), \
                        host_random.watching(model), saved_hooks.watching(model), \
                        module_paths.noted(model), torch.enable_grad():  # NOTE [Grad mode
                    # left off]; NOTE [Module paths of ops]
                    fn = compile_step(model, spec, partition_fn, export_example, leaves)
                    _compile_on_fakes(fn, primals)
            finally:
                forward_state.put_back_traced(model, before)  # NOTE [Traced tensors left]
                set_back.put_back_grads(grads)  # NOTE [Gradients a trace left]
            if errors and not partitioned():  # NOTE [A route that loses the backward]
                errors.append(f"{_HOW[route]}: traced, but with no output requiring grad")
                continue
            export_route.remember(model, route, _ROUTE)
            return fn
        except MonetError:
            raise
        except Exception as exc:
            if partitioned():
                raise
            errors.append(f"{_HOW[route]}: {capture_hints.where(exc)}")
            checked = checked or capture_hints.from_validation(exc)
            causal = causal or capture_hints.from_causal_check(exc)
    hint = capture_hints.what_to_try(model, args, kwargs)
    failed = f"monet_opt.optimize could not trace {type(model).__name__} into a joint " \
        "forward+backward graph.\n  " + "\n  ".join(errors)
    if hint is not None:  # it fails eagerly too: tracing's hints are beside it
        raise CaptureError(failed + hint)
    adaptive = capture_hints.adaptive_softmax(model)  # its shapes are torch's, not the user's
    named = capture_hints.hf_cache(errors, model) + capture_hints.hf_experts(errors, model) \
        + capture_hints.no_fake(errors) + capture_hints.lost_attribute(errors) \
        + capture_hints.unknown_output(errors) + (adaptive or capture_hints.shapes(errors)) \
        + capture_hints.in_the_backward(errors) + capture_hints.detection(errors) \
        + capture_hints.higher_order(errors) + tensor_kinds.made_in_forward(errors) \
        + (capture_hints.VALIDATING if checked else "") \
        + (capture_hints.CAUSAL_CHECK if causal else "") \
        + (capture_hints.TORCH_CHECK if any(capture_hints.IN_TORCH in e for e in errors) else "") \
        + host_random.drawn_hint() + host_random.layerdrop_hint(model) \
        + capture_hints.fake_quantize(model)
    # NOTE [What to try] in monet_opt/capture_hints.py
    raise CaptureError(failed + ("\nWhat to try:" + named if named else
                                 capture_hints.generic(model)))


# NOTE [Grad mode left off]
#   A route that failed inside torch.export (a write under no_grad into a tensor a helper object
#   held: "mutating a non-functional tensor") left grad mode off for the whole process, so a
#   loop that fell back to eager training failed at its backward (falsepos probe, 2026-12-07).
#   Each route runs under torch.enable_grad(), which puts the mode back as it found it, raised
#   or not; a training step's trace needs grad mode anyway.
# NOTE [Tracing without the collector]
#   torch.export, the joint trace and the partition make hundreds of thousands of short-lived
#   objects, and Python's cyclic collector walks the whole heap again and again while they are
#   made; FX also generates and compiles Python code for every GraphModule it makes on the way
#   (22 of them for GPT-2), though only the final forward and backward ever run. Tracing with the
#   collector paused and lazy GraphModules (code made on first call) cut a cached optimize() of the
#   demo's GPT-2 from 4.7-5.7 s to 3.5-4.0 s. Profiling and solving, which run inside the trace
#   (AOTAutograd calls our partition), run with the collector as it was outside (`collecting`):
#   they are long and make garbage of their own. Nothing else does: reading a cached profile and
#   schedule with the collector on cost a cached call 0.18-0.5 s (the first collections then
#   walk everything the trace has made so far, up to the whole heap, 0.37 s once, while the JSON
#   is parsed), so `planning` leaves it paused.
_outside = {"collector": True, "compiling": False}


# NOTE [One trace at a time]
#   What a trace sets is the process's, not the thread's: the collector, torch.compiler's
#   compiling flag, the functions it patches for the trace's length (donated buffers, eager
#   kernels, checkpoints) and the values they put back. Two threads tracing at once each saved
#   the other's settings as "outside" and put those back: two optimize() calls in two threads
#   left the collector off for good (2 of 2 runs; cycles then never freed in a long training
#   run), and a patch could stay in place. So a trace holds one lock from start to end (a
#   second thread's trace waits for it: they share the GIL and the cores anyway, and its
#   profiling's timings are the truer for it), and a trace inside a trace (a model calling an
#   optimized module that plans anew) keeps what the outermost one saved. Meanwhile every
#   thread runs without the collector and sees is_compiling() as the trace sets it, as with
#   torch.export; steps already planned do not trace.
_one_trace = threading.RLock()
_depth = [0]  # traces entered and not left, under _one_trace


@contextlib.contextmanager
def _tracing(as_compiling: bool = False):
    with _one_trace:
        if not _depth[0]:
            _outside.update(collector=gc.isenabled(),
                            compiling=torch.compiler._is_compiling_flag)
        _depth[0] += 1
        before = torch.compiler._is_compiling_flag
        gc.disable()
        torch.compiler._is_compiling_flag = as_compiling or _outside["compiling"]
        try:
            # NOTE [Autocast is traced]: the backward is traced without autocast
            with _use_lazy_graph_module(True), eager_kernels(), _no_donated_buffers(), \
                    plain_checkpoints(), capture_hints.meta_failures_unlogged(), own_cache(), \
                    functorch_config.patch(backward_pass_autocast="off"):
                yield
        finally:
            torch.compiler._is_compiling_flag = before
            _depth[0] -= 1
            if not _depth[0] and _outside["collector"]:
                gc.enable()


# NOTE [Retained graphs]
#   AOTAutograd marks the saved tensors that only its backward reads as "donated" (an inductor
#   backward may write into them), and a backward compiled with donated buffers refuses
#   `backward(retain_graph=True)` with an error that points at torch internals. Our backward
#   graphs run eager's kernels and write into nothing they are handed (NOTE [Writing into a
#   dying input] overwrites only values made in the same graph), so none is donated. With
#   retain_graph=True autograd keeps the saved tensors in the graph's context, as eager does,
#   and a second backward reads them again: it trains bitwise like eager's
#   (tests/test_api.py), but those tensors are then held through the backward, past what the
#   plan freed, so such a step can pass its memory limit: tests/models.py's MLP at its least
#   peak measured 1,553,496 B (its limit and prediction) and 2,339,928 B with retain_graph.
@contextlib.contextmanager
def _no_donated_buffers():
    saved = getattr(graph_compile, "collect_bw_donated_buffer_idxs", None)
    if saved is None:  # a torch without donated buffers
        yield
        return
    graph_compile.collect_bw_donated_buffer_idxs = lambda *args, **kwargs: []
    try:
        yield
    finally:
        graph_compile.collect_bw_donated_buffer_idxs = saved


@contextlib.contextmanager
def planning():
    """Inside a trace, the world as outside it but for the collector, which stays paused:
    torch.compiler.is_compiling() false and compiled graphs running (NOTE [Tracing without the
    collector], NOTE [Compiling, not running])."""
    compiling = torch.compiler._is_compiling_flag
    only_compiling = _only_compiling.on
    torch.compiler._is_compiling_flag = _outside["compiling"]
    _only_compiling.on = False
    try:
        yield
    finally:
        _only_compiling.on = only_compiling
        torch.compiler._is_compiling_flag = compiling


def collecting(fn: Callable) -> Callable:
    """`fn`, run with the cyclic collector as it was outside the trace: for profiling and
    solving, the long work inside it (NOTE [Tracing without the collector])."""
    def run(*args, **kwargs):
        collector = gc.isenabled()
        if _outside["collector"]:
            gc.enable()
        try:
            return fn(*args, **kwargs)
        finally:
            if not collector:
                gc.disable()
    return run


def _compile_on_fakes(fn: Callable, primals: list[torch.Tensor]) -> None:
    """NOTE [Compiling, not running]
      aot_function traces, plans and compiles on its first call, then runs the compiled
      forward on that call's arguments. That call is only for compiling, so it gets fake
      tensors of the primals' shapes, dtypes, devices and requires_grad (nothing real is read
      or written: the plan's profiler measures on the real tensors it was given), and the
      compiled forward raises _Compiled instead of running (running it on the fakes took 0.2 s
      of a cached optimize() of the demo's GPT-2). AOTAutograd keeps what it compiled before
      it calls the forward, so the next call runs it."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(t) for t in primals]
    _only_compiling.on = True
    try:
        with mode:
            fn(*fakes)
    except _Compiled:
        return
    finally:
        _only_compiling.on = False
    internal_assert(False, "the compiled step ran no forward graph of ours; the capture no "
                    "longer matches this torch's AOTAutograd")
