"""Measure the peak memory of a training step: on CPU the live-tensor-bytes counter, which sees
what ops return, or the allocator's allocation events, which see kernels' scratch too (NOTE
[Allocation events] in monet_opt/alloc_events.py); on CUDA the caching allocator's
max_memory_allocated."""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map_only

from monet_opt import alloc_events
from monet_opt.errors import CaptureError
import solvers


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of live tensor storages, deduplicated by storage, freed when the storage
    dies. Seed it with the tensors alive at the start (parameters, buffers, inputs). The same
    figure to the byte on every run (DESIGN pitfall 5). It sees what ops return, not scratch
    memory allocated and freed inside a kernel: CPU memory is read from the allocator's events
    (NOTE [Allocation events] in monet_opt/alloc_events.py), this where those cannot be taken
    or MONET_OPT_CPU_SCRATCH=0."""

    # Higher-order ops (with_effects, around torch.linalg's error checks in a traced step) come
    # here whole: their outputs are counted as any op's (it refused them: NotImplementedError).
    supports_higher_order_operators = True

    def __init__(self, resident: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}
        for t in resident:
            self._track(t)

    def __enter__(self):
        _counting.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _counting.remove(self)
        return super().__exit__(*exc)

    def _track(self, t: torch.Tensor) -> None:
        if t.device.type != "cpu" or t.is_meta or is_fake(t):  # optimize() traced inside
            return
        for part in dense_parts(t):
            storage = part.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in self._sizes:
                continue
            self._sizes[key] = nbytes
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        if self._sizes.pop(key, None) is not None:
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self._track, out)
        return out


# NOTE [Tensors made outside the dispatcher]
#   A generator's get_state() makes its CPU tensor without an ATen call, so no dispatch mode
#   sees it: the 5056-byte Mersenne-Twister state a plan keeps for a replayed dropout (NOTE
#   [Generator-state replay]) or a recomputed random op was in the plan's peak and not in the
#   counter's. Under load, tests/test_resident_grads.py's plan chose the replay and measured
#   5,052 B under its prediction. Code that makes a tensor so and keeps it hands it to
#   `count_made`, which every counter running sees as if an op had returned it.
_counting: list[LiveBytes] = []


def count_made(t: torch.Tensor) -> torch.Tensor:
    """`t`, counted by the live-bytes counters running now (NOTE [Tensors made outside the
    dispatcher])."""
    for counter in _counting:
        counter._track(t)
    return t


def resident_tensors(model: torch.nn.Module, inputs: Any = ()) -> list[torch.Tensor]:
    """Parameters, buffers, tensors the modules hold as attributes, existing gradients and the
    tensors in `inputs` with theirs."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"monet_opt.resident_tensors: model must be a torch.nn.Module, got "
                        f"{type(model).__name__}; call resident_tensors(model, inputs)")
    out = list(model.parameters()) + list(model.buffers())
    out += [v for m in model.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)]
    out += [p.grad for p in model.parameters() if p.grad is not None]
    given = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    return out + given + [t.grad for t in given if t.is_leaf and t.grad is not None]


def measure_peak(step: Callable[[], Any], resident: Iterable[torch.Tensor] = (),
                 device: torch.device | str | None = None) -> int:
    """Run `step()` once and return its peak memory in bytes, everything counted: the tensors in
    `resident` (pass `resident_tensors(model, inputs)`) plus everything the step allocates.

    CPU: `resident` plus the most the allocator held above what it held before the step, by
    torch.profiler's allocation events, the calling thread's only (a step run in other threads
    is not seen; one profiler session a process: measure in one thread at a time): kernels'
    scratch included (NOTE [Allocation events] in monet_opt/alloc_events.py); the LiveBytes
    counter's, which sees what ops return, inside a profiler the user runs or with
    MONET_OPT_CPU_SCRATCH=0. CUDA: the caching allocator's peak in the step above what was
    allocated before, plus `resident` (the device may hold other tensors, not the step's).
    """
    if not callable(step) or isinstance(step, torch.nn.Module):
        raise TypeError(f"monet_opt.measure_peak: step must be a function of no arguments that "
                        f"runs one training step, such as lambda: loss_fn(opt(x)).backward(); "
                        f"got {type(step).__name__}")
    if isinstance(resident, torch.Tensor):
        resident = [resident]
    try:
        resident = None if isinstance(resident, torch.nn.Module) else list(resident)
    except TypeError:
        resident = None
    if resident is None or not all(isinstance(t, torch.Tensor) for t in resident):
        raise TypeError("monet_opt.measure_peak: resident must be the tensors held before the "
                        "step: pass monet_opt.resident_tensors(model, inputs)")
    device = torch.device(device) if device is not None else _device_of(resident)
    held = resident_bytes(resident)  # their pointers only, through the step: one the step let
    # go of (a state it replaces) was kept alive here, 131,084 B over (audio probe, 2026-12-06)
    if device.type == "cuda":
        del resident
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device)) - before + held
    counted = alloc_events.enabled() and alloc_events.available()  # NOTE [Allocation events]
    window = alloc_events.Allocations(resident) if counted else LiveBytes(resident)
    del resident
    with window:
        step()
    return held + window.peak if counted else window.peak


def resident_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the storages under `tensors`, each counted once, as their device's
    allocator counts them (`allocated_bytes`)."""
    seen: dict[int, int] = {}
    for t in tensors:
        for part in dense_parts(t):
            storage = part.untyped_storage()
            seen[storage.data_ptr()] = allocated_bytes(storage.nbytes(), t.device)
    return sum(seen.values())


# NOTE [Buffers viewing a larger storage]
#   optimize() traces the first step on clones of the model's buffers and tensor attributes
#   not alone on a storage of their own size (NOTE [Buffers the pass reads]), so the fixed
#   memory counted from the trace's inputs held each one's own elements. A buffer viewing
#   part of a larger storage keeps all of it on the
#   device: `register_buffer("pe", table[:4])` of a 1,000 x 10 table measured 39,840 B over
#   its store-all prediction (41,328 B for 1,488: a plan at its limit passed it by that much),
#   torch's periodic hann_window (64 of 65 values) 4 B. The plan now adds what each such
#   storage holds beyond its clones, counted once (two buffers slicing one table: the table)
#   and never below them: spectral_norm's `weight` attribute is `weight_orig.data` at the first
#   call, the parameter's storage, and a tensor of its own at every later step, so a storage
#   already counted (a parameter's, an input's) adds nothing and the clone stays counted.
#   tests/test_buffer_storage.py.
# NOTE [Originals beside the pass]
#   The profiling pass runs the joint graph on those clones (NOTE [Buffers the pass reads] in
#   monet_opt/pass_inputs.py), while the model holds the originals, and an all-ones
#   attention mask left out of the step (NOTE [Attention masks of all ones]) is held by the
#   caller: none is among the pass's values, so a pass held to a byte limit kept its values
#   within it and the process passed it by these bytes (a small BERT: its position_ids and
#   token_type_ids buffers, 4,096 B each, and a 1,536 B mask, 3,682 B over the limit while
#   profiling). The pass keeps within the limit less them.
def held_beyond(originals: Sequence[torch.Tensor], clones: Sequence[torch.Tensor],
                counted: Iterable[torch.Tensor] = ()) -> tuple[int, int]:
    """The bytes the storages under `originals` hold beyond their `clones` (NOTE [Buffers
    viewing a larger storage]), and all they hold: beside the profiling pass, which runs on
    the clones (NOTE [Originals beside the pass]). Storages under `counted` add nothing."""
    skip = {part.untyped_storage().data_ptr() for t in counted for part in dense_parts(t)}
    groups: dict[int, list[int]] = {}
    for t, clone in zip(originals, clones, strict=True):
        for part, copy in zip(dense_parts(t), dense_parts(clone)):
            storage = part.untyped_storage()
            if storage.data_ptr() in skip:
                continue
            group = groups.setdefault(storage.data_ptr(),
                                      [allocated_bytes(storage.nbytes(), t.device), 0])
            group[1] += allocated_bytes(copy.untyped_storage().nbytes(), t.device)
    return (sum(max(0, held - cloned) for held, cloned in groups.values()),
            sum(held for held, _ in groups.values()))


# NOTE [Sparse inputs]
#   A sparse input (a graph network's adjacency matrix for torch.sparse.mm) failed every
#   optimize() (NotImplementedError: "Cannot access storage of SparseTensorImpl", where the
#   planner counted the inputs' storages). Its memory is its indices' and values' (dense_parts),
#   counted so here and by the live-bytes counter. The traced graph's fake sparse tensors have
#   no entries (their count is data), so the lowering counts a sparse input as nothing and the
#   planner adds its real bytes (`sparse_bytes`) to the plan's fixed memory, as it takes off
#   the bytes of inputs that share storages; the number of entries is part of a step's key
#   (input_spec.LeafSpec), so a matrix with other entries gets its own plan.
#   A sparse tensor the step makes itself (torch.sparse_coo_tensor from an edge list input,
#   .to_sparse(), coalesce, arithmetic on a sparse input) has as many entries as the data
#   says, which the trace does not know, and its parts may be its arguments' own storages: a
#   GCN that built its adjacency in the forward (5,000 edges) measured 13,600 B over its least
#   plan's prediction (the limit), and its store-all plan was 9,824 B over what it measured.
#   `refuse_sparse_made` stops such a step with a CaptureError saying to build the tensor
#   outside and pass it in; views of a sparse input (the transpose sparse.mm's backward reads)
#   pass, but a COO transpose clones its indices and values: read from the allocation events,
#   a GCN's step at its least plan held one such copy (19,740 B) over it, in each layer's
#   backward. The op reading such a copy counts its bytes as its workspace (`sparse_copies`):
#   the view is made right before its one reader, and dies with it.
def sparse_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """What the sparse tensors among `tensors` hold (NOTE [Sparse inputs]); their parts read
    outside a fake mode the caller may be in (inside one, a real sparse tensor's indices come
    out as the fake's: none)."""
    with unset_fake_temporarily():
        return resident_bytes([t for t in tensors if t.layout != torch.strided])


def sparse_copies(read: Iterable[object], inputs: Iterable[torch.Tensor]) -> int:
    """The bytes of the sparse tensors in `read` held in storages none of `inputs` holds: the
    copies a view of a sparse input made (NOTE [Sparse inputs])."""
    sparse = [t for t in read if isinstance(t, torch.Tensor) and t.layout != torch.strided]
    if not sparse:
        return 0
    held = {p.untyped_storage().data_ptr() for t in inputs for p in dense_parts(t)}
    return resident_bytes(p for t in sparse for p in dense_parts(t)
                          if p.untyped_storage().data_ptr() not in held)


def refuse_sparse_made(joint: fx.GraphModule, is_view: Callable[[fx.Node], bool]) -> None:
    """CaptureError where the step makes a sparse tensor other than as a view of another
    (`is_view(node)`), naming the ops (NOTE [Sparse inputs])."""
    made = sorted({str(n.target) for n in joint.graph.nodes
                   if n.op == "call_function" and not is_view(n) and any(
                       t.layout != torch.strided for t in tree_leaves(n.meta.get("val"))
                       if isinstance(t, torch.Tensor))})
    if made:
        raise CaptureError(
            f"monet_opt.optimize: the step makes a sparse tensor ({', '.join(made)}: "
            "torch.sparse_coo_tensor, .to_sparse(), coalesce or arithmetic on a sparse tensor); "
            "the trace knows neither how many entries it holds nor which storages it shares "
            "with its arguments, so its memory cannot be planned. Build it outside the module "
            "and pass it in as an input (a sparse input is counted: NOTE [Sparse inputs] in "
            "monet_opt/memory.py), or pass messages with dense ops (index_add_, "
            "scatter_reduce).")


def dense_parts(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The strided tensors that hold `t`'s memory: `t` itself, or a sparse tensor's indices
    and values (a graph network's adjacency matrix, `torch.sparse.mm`'s first argument; its
    storage cannot be read, and its shape's numel counts every absent entry); none for an
    efficient zero tensor, which holds no memory (torch.func's jacrev and hessian put
    `_efficientzerotensor` in the step: counting its storage raised "invalid python storage")."""
    if t._is_zerotensor():
        return ()
    if t.layout == torch.sparse_coo:
        return t._indices(), t._values()
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return t.crow_indices(), t.col_indices(), t.values()
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return t.ccol_indices(), t.row_indices(), t.values()
    return (t,)


# NOTE [Inputs that share a storage]
#   The lowering counts each placeholder of the traced step as its own storage (it sees fake
#   tensors, not what they share), so a tensor passed twice, or with a view of itself (HF's
#   `labels=input_ids`), was counted twice in the plan's fixed bytes: the prediction came out
#   over the measured peak by the second copy's bytes (2,048 B of a 313,608 B step for int64
#   ids of 8 x 32). The planner takes `shared_bytes` of the step's real tensors off the fixed
#   bytes after the profile is found or made (the profile, keyed by graph and shapes, stays the
#   same either way; a schedule is keyed by its problem, so it follows). The plan then holds
#   only while the inputs share as the sample's did: the optimized module plans a step apart
#   for inputs that share storages otherwise (`storage_groups` is part of a step's key, NOTE
#   [New input shapes] in monet_opt/module.py).
def shared_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """What counting each tensor's storage once per tensor counts more than once."""
    tensors = list(tensors)
    each = sum(allocated_bytes(p.untyped_storage().nbytes(), t.device)
               for t in tensors for p in dense_parts(t))
    return each - resident_bytes(tensors)


def storage_groups(tensors: Iterable[torch.Tensor]) -> tuple[tuple[int, ...], ...]:
    """The positions of tensors that share a storage, grouped (groups of one left out)."""
    groups: dict[tuple, list[int]] = {}
    for k, t in enumerate(tensors):
        for part in dense_parts(t):
            storage = part.untyped_storage()
            if storage.nbytes():  # empty storages all sit at address 0
                groups.setdefault((t.device, storage.data_ptr()), []).append(k)
    return tuple(tuple(g) for g in groups.values() if len(g) > 1)


CUDA_BLOCK = 512  # NOTE [CUDA blocks]
CUDA_LARGE = 1 << 20  # the allocator's large blocks: over this, cut from segments


def cuda_slack(store_all_peak_bytes: int, largest_tensor_bytes: int) -> int:
    """What a CUDA plan reserves for the allocator's whole blocks (NOTE [CUDA blocks])."""
    whole = CUDA_LARGE if largest_tensor_bytes > CUDA_LARGE else 0
    return whole + store_all_peak_bytes // 500


def with_cuda_slack(problem: solvers.Problem, primals: Sequence[torch.Tensor]) -> solvers.Problem:
    """`problem` with `cuda_slack` in its fixed memory where the step runs on CUDA."""
    if not primals or primals[0].device.type != "cuda":
        return problem
    store_all = solvers.simulate(problem, solvers.schedule_from_kept(
        problem, problem.saved_for_backward))
    largest = max((t.bytes for t in problem.tensors), default=0)
    return dataclasses.replace(problem, fixed_bytes=problem.fixed_bytes
                               + cuda_slack(store_all.peak_bytes, largest))


def allocated_bytes(nbytes: int, device: torch.device) -> int:
    """NOTE [CUDA blocks]
      CUDA's caching allocator hands out blocks of a multiple of 512 bytes (512 at least), and
      max_memory_allocated counts blocks: a 4-byte loss scalar takes 512. So on CUDA a tensor's
      bytes are its block's (measured on an H100: a small CNN's step peaked 5.2 KB over the
      plan's exact bytes, a dozen small tensors). A large block cut from a cached segment with
      at most 1 MiB left over is handed out whole; that depends on the cache's history and is
      not predicted, so a CUDA plan counts `cuda_slack` into its fixed memory: 0.2 % of the
      store-all peak, and 1 MiB where some tensor is that large (smaller ones come from the
      small blocks' pool, whose blocks are always cut to size). Measured on an H100 with the blocks
      counted, steps peaked over their plans by 0.4 and 0.9 MiB (ResNet-18, batch 2, 64x64:
      90 MiB steps) and by 2.5 and 6.6 MiB (ResNet-50, batch 184, 224x224, 5.1 and 4.3 GiB
      steps: 0.15 % at most), and not at all on five models whose tensors are all under 1 MiB;
      with the slack, the ResNet-18 steps were within their limits."""
    if device.type != "cuda" or nbytes == 0:
        return nbytes
    return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK


def cuda_devices(tensors: Iterable[torch.Tensor]) -> list[torch.device]:
    """The CUDA devices these tensors are on, in order: those whose random streams a forked
    random state (torch.random.fork_rng) keeps."""
    return sorted({t.device for t in tensors if t.device.type == "cuda"}, key=str)


def _device_of(tensors: Iterable[torch.Tensor]) -> torch.device:
    for t in tensors:
        return t.device
    return torch.device("cpu")


def counted(fn: Callable[[], Any], cuda: bool, inputs: Any = ()) -> tuple[Any, int]:
    """(fn()'s result, its workspace): what `fn()` allocates at its peak beyond its result;
    `inputs`: the tensors (any nesting) it reads, alive before it runs.

    NOTE [Workspace]
      What an op allocates while it runs beyond its outputs (cuDNN's and cuBLAS's scratch, a
      kernel's temporaries). On CUDA: the caching allocator's peak during the call, less its
      outputs' blocks. The profiler takes every op signature's in one more call after its
      timed ones (the first call of a convolution under cudnn.benchmark tries every
      algorithm, with their workspaces). Measured on an H100 (ResNet-50, batch 64, 224x224,
      torch 2.11): without it, steps peaked over their plans by up to 120 MiB, inside
      convolution backwards. On CPU: the live-bytes counter's, which sees what ops return and
      not their scratch, so ops' workspace is 0 (variants' counts the tensors they make on the
      way) and plans passed their limits by the process's allocations (by up to 48 MiB on a
      CNN); so by default the allocation events' peak during the call, less its outputs (NOTE
      [Allocation events] in monet_opt/alloc_events.py). The counter starts with the
      inputs: it counts a storage the first time an op returns it, so a view of an input
      taken inside (a 1-bit mask's `packed.unsqueeze(1)` as it is unpacked) counted the input
      as made there: a small CNN's plan with a ReLU's 1-bit mask predicted 1,024 B (the mask)
      over what its step measured (tests/test_resident_grads.py, under load). Outputs that are
      inputs' storages are not made either."""
    given = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    old = {p.untyped_storage().data_ptr() for t in given for p in dense_parts(t)}
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    elif alloc_events.enabled() and alloc_events.available():
        with alloc_events.Allocations(given) as events:
            out = fn()
        peak = events.peak
    else:  # what ops return only (NOTE [Allocation events]; inside the user's profiler:
        # profiler.profile warns, NOTE [Plans made inside a profiler])
        with LiveBytes(given) as counter:
            base = counter.live
            out = fn()
        peak = counter.peak - base
    made = {storage.data_ptr(): allocated_bytes(storage.nbytes(), o.device)
            for o in tree_leaves(out) if isinstance(o, torch.Tensor)
            for storage in (p.untyped_storage() for p in dense_parts(o))
            if storage.data_ptr() not in old}
    return out, max(0, peak - sum(made.values()))
