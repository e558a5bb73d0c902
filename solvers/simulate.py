"""The one simulator: replays any Schedule and returns its exact peak bytes and time.

NOTE [Lifetimes]
  1. Fixed memory (parameters, buffers, inputs) is resident throughout.
  2. Running an op allocates all its outputs; during the op, its inputs, its outputs and its
     workspace are all resident.
  3. Each computation of a tensor makes a new copy; a read uses the most recent copy. A copy is
     freed right after its last read, or right after it is made if nothing reads it.
  4. Forward copies survive into the backward only if the tensor is `kept`; forward outputs live
     until the end of the forward phase; output gradients (tangents) exist from the start of the
     backward; backward outputs (gradients) live to the end.
  The executor frees at exactly these points (FX frees each value after its last use), so the
  simulated peak is a prediction that can be held against a measurement.

NOTE [Writing into a dying input]
  Eager ResNet runs `relu_` and `out += identity`; the joint graph is functional, so its ReLU
  and residual add allocate a new output and read the old one (ResNet-50, b32 160², per step:
  ReLU 40 ms out of place against 13 ms in place, measured with torch.profiler). Where an
  op's input dies at it, the op may write into it instead: `Op.overwrites` lists the forward
  tensors an op can take over (same size as its one output, not a view), the first whose copy
  is read last by this step, was made in the same phase (a kept copy the backward reads is a
  saved tensor, not the backward graph's own: a backward op takes over recomputed copies
  only) and is not a forward output. That copy's storage
  then holds the output, so the step allocates the output's bytes less. Whether it happens
  depends on the schedule, so it is decided here, per step (`Simulation.overwrites`), and the
  executor runs exactly those steps in place (monet_opt/rewrite.py, which checks that FX
  frees the input there too). Solvers that count memory themselves do not know of it: they
  count the output anew, which only over-counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from operator import add, sub

from solvers.errors import InvalidScheduleError, SolverError
from solvers.problem import Problem, last_readers
from solvers.schedule import Schedule


@dataclass(frozen=True)
class Simulation:
    """peak_bytes: fixed memory plus the largest live total. time_s: sum of every op run.
    steps: op ids in execution order (forward phase, then backward phase). live_bytes[k]: bytes
    resident while step k runs (fixed included). recompute_counts[i]: how often forward op i
    runs in the backward phase. step_time_s[k]: the time of step k (a recomputation's rerun_s).
    overwrites: (step, tensor) where the step writes its output into that input (NOTE [Writing
    into a dying input]). fixed_bytes: the problem's, less the generator states the schedule
    keeps none of (`Op.state_bytes`)."""

    peak_bytes: int
    time_s: float
    peak_step: int
    steps: tuple[int, ...]
    live_bytes: tuple[int, ...]
    recompute_counts: tuple[int, ...]
    step_time_s: tuple[float, ...] = ()
    overwrites: tuple[tuple[int, int], ...] = ()
    fixed_bytes: int = 0


def simulate(problem: Problem, schedule: Schedule) -> Simulation:
    """Replay `schedule` on `problem` (with the schedule's variants in use). Raises
    InvalidScheduleError if it cannot run."""
    unrun = _unrun_encodes(problem, schedule)
    kept_states = captured(problem, schedule)
    fixed = problem.fixed_bytes - sum(b for i, b in _per_op(problem).states
                                      if i not in kept_states)
    problem = problem.with_variants(schedule.variants)
    _check_backward_order(problem, schedule)
    steps = problem.forward_ops + schedule.backward
    if not steps:
        return Simulation(peak_bytes=fixed, time_s=0.0, peak_step=0, steps=(),
                          live_bytes=(), recompute_counts=(), fixed_bytes=fixed)
    per_op = _per_op(problem)
    born, last, tensor_of, candidates = _copy_lifetimes(problem, schedule, steps, unrun)
    sizes = list(map(per_op.tensor_bytes.__getitem__, tensor_of))
    overwrites = _overwrites(problem, born, last, tensor_of, candidates)
    reused = {k: sizes[c] for k, c in overwrites}
    live_bytes, peak, peak_step = _memory_timeline(problem, steps, born, last, sizes, reused,
                                                   unrun, kept_states, fixed)
    counts = [0] * len(problem.ops)
    for i in schedule.backward:
        if not problem.ops[i].is_backward:
            counts[i] += 1
    n_fwd = len(problem.forward_ops)  # the backward's forward ops are recomputations
    step_time_s = tuple(map(per_op.time_s.__getitem__, steps[:n_fwd])) + \
        tuple(map(per_op.backward_time_s.__getitem__, steps[n_fwd:]))
    return Simulation(peak_bytes=peak, time_s=sum(step_time_s), peak_step=peak_step,
                      steps=steps, live_bytes=tuple(live_bytes),
                      recompute_counts=tuple(counts), step_time_s=step_time_s,
                      overwrites=tuple((k, tensor_of[c]) for k, c in overwrites),
                      fixed_bytes=fixed)


@dataclass(frozen=True)
class _PerOp:
    """What the simulator reads of each op and tensor, by id, read once per problem: each
    simulation read them through the ops' attributes and properties at every step, and a
    solver simulates thousands of schedules (a 3,325-op problem: ~15 % of each)."""

    tensor_bytes: list[int]
    time_s: list[float]           # a forward step's
    backward_time_s: list[float]  # a backward-phase step's: a forward op's is its rerun_s
    extra: list[int]              # extra_bytes: a backward-phase step's
    first_extra: list[int]        # a forward step's, its state not captured ...
    captured_extra: list[int]     # ... and captured (NOTE [A first run's workspace])
    states: tuple[tuple[int, int], ...]  # (op, state_bytes) where it has any
    is_backward: list[bool]
    forward_tensors: frozenset[int]


def _per_op(problem: Problem) -> _PerOp:
    found = problem.memo.get("simulate")
    if found is None:
        ops = problem.ops
        found = problem.memo["simulate"] = _PerOp(
            tensor_bytes=[t.bytes for t in problem.tensors],
            time_s=[op.time_s for op in ops],
            backward_time_s=[op.time_s if op.is_backward else op.rerun_s for op in ops],
            extra=[op.extra_bytes for op in ops],
            first_extra=[op.run_workspace_bytes(True) - op.inplace_bytes for op in ops],
            captured_extra=[op.run_workspace_bytes(True, True) - op.inplace_bytes
                            for op in ops],
            states=tuple((i, op.state_bytes) for i, op in enumerate(ops) if op.state_bytes),
            is_backward=[op.is_backward for op in ops],
            forward_tensors=frozenset(problem.forward_tensors))
    return found


def alive_at(problem: Problem, schedule: Schedule, step: int) -> tuple[tuple[int, int], ...]:
    """What the simulation of `schedule` holds while step `step` runs (an index into its
    `steps`): (tensor, step that made this copy of it) per copy, fixed memory and the op's
    workspace aside. An input the step writes its output into is held as that output (NOTE
    [Writing into a dying input]). With them the step's `live_bytes` is fixed memory plus
    these copies' bytes plus the op's `extra_bytes` (in the forward, its first run's: NOTE [A
    first run's workspace])."""
    unrun = _unrun_encodes(problem, schedule)
    problem = problem.with_variants(schedule.variants)
    _check_backward_order(problem, schedule)
    steps = problem.forward_ops + schedule.backward
    if not 0 <= step < len(steps):
        raise IndexError(f"alive_at: step {step} of a schedule of {len(steps)} steps")
    born, last, tensor_of, candidates = _copy_lifetimes(problem, schedule, steps, unrun)
    written = {c for k, c in _overwrites(problem, born, last, tensor_of, candidates)
               if k == step}
    return tuple((tensor_of[c], born[c]) for c in range(len(born))
                 if born[c] <= step <= last[c] and c not in written)


def captured(problem: Problem, schedule: Schedule, made: frozenset[int] = frozenset()
             ) -> frozenset[int]:
    """The random forward ops whose generator state `schedule`'s step keeps (NOTE [The
    capture's copy] in monet_opt/recompute.py): those it recomputes and those a chosen
    variant replays. A recomputed op whose outputs are all in `made` (tensors the step holds
    anyway: NOTE [Held tensors made again] in monet_opt/held_outputs.py) is read, not run
    again, and keeps none."""
    ops = problem.ops
    kept = {i for i in schedule.backward if 0 <= i < len(ops) and ops[i].is_random and
            not ops[i].is_backward and not (ops[i].outputs and set(ops[i].outputs) <= made)}
    return frozenset(kept | {problem.tensors[problem.variants[v].replaces].producer
                             for v in schedule.variants
                             if 0 <= v < len(problem.variants) and problem.variants[v].replays})


def _check_backward_order(problem: Problem, schedule: Schedule) -> None:
    n, is_backward = len(problem.ops), _per_op(problem).is_backward
    if not all(0 <= i < n for i in schedule.backward):
        raise InvalidScheduleError("the backward phase names an op id that does not exist")
    ran = list(filter(is_backward.__getitem__, schedule.backward))
    if sorted(ran) != list(problem.backward_ops):
        missing = set(problem.backward_ops) - set(ran)
        repeated = {i for i in ran if ran.count(i) > 1}
        names = [problem.ops[i].name for i in sorted(missing | repeated)][:5]
        raise InvalidScheduleError(
            f"every backward op must run exactly once; missing or repeated: {names}")
    if tuple(ran) != problem.backward_ops:
        _check_in_place(problem, ran)
    fwd = _per_op(problem).forward_tensors
    bad = [t for t in schedule.kept if t not in fwd]
    if bad:
        raise InvalidScheduleError(f"kept tensors must be forward tensors; not: {bad[:5]}")


def _check_in_place(problem: Problem, ran: list[int]) -> None:
    """NOTE [Backward ops reordered]
      A backward op that writes in place (NOTE [In-place accumulation] in solvers/problem.py)
      writes into one of its inputs that no later op reads in the problem's order (which one,
      the problem does not say). A schedule that runs the backward ops in another order could
      read that input after it was written over, so it is refused unless every such input
      still dies there."""
    static = last_readers(problem.ops)
    last = {t: i for i in ran for t in problem.ops[i].inputs}
    for i in ran:
        op = problem.ops[i]
        if op.inplace_bytes and any(static[t] == i != last[t] for t in op.inputs):
            raise InvalidScheduleError(
                f"backward op {op.name!r} writes into an input that a backward op run after it "
                "reads (NOTE [Backward ops reordered]): run them in the problem's order")


def _unrun_encodes(problem: Problem, schedule: Schedule) -> frozenset[int]:
    """NOTE [Encodes the forward does not run]
      A chosen variant's encode op makes what only that variant's backward op reads. Where the
      schedule does not keep it, the backward makes it again, and nothing reads the forward's
      copy: the executor's forward graph drops it (FX dead code), so the forward phase does not
      run it here either: it makes and holds nothing there. Run here, a small CNN's plans
      (random schedules, docs/benchmarks/random_schedules.md) predicted a max-pool's
      compact-indices encoder's output and workspace at their peak and measured up to 55,576 B
      under it. Its time is still counted there (an encode's, microseconds): the programs'
      bounds count it, and a bound must stay at or under every schedule's simulated time."""
    return frozenset(i for v in schedule.variants if 0 <= v < len(problem.variants)
                     for i in problem.variants[v].encode_ops
                     if not set(problem.ops[i].outputs) & schedule.kept)


def _copy_lifetimes(problem: Problem, schedule: Schedule, steps: tuple[int, ...],
                    unrun: frozenset[int] = frozenset()):
    """Per copy of a tensor: the step that made it, the step after which it is freed, and the
    tensor; and per step, the copies of the inputs it may overwrite. `current` maps a tensor to
    its readable copy. Forward steps of `unrun` ops make and read nothing (NOTE [Encodes the
    forward does not run]). Its loop is written out (no helper calls per read): the solvers
    simulate thousands of schedules, and on a 3,325-op problem this was most of each."""
    n_fwd = len(problem.forward_ops)
    end = len(steps) - 1
    born: list[int] = []
    last: list[int] = []
    tensor_of: list[int] = []
    current: dict[int, int] = {}
    candidates: list[tuple[int, tuple[int, ...]]] = []
    ops = problem.ops

    def new_copies(ts, k: int) -> None:
        for t in ts:
            current[t] = len(born)
            born.append(k)
            last.append(k)
            tensor_of.append(t)

    def read(t: int, k: int, reader: str) -> None:
        c = current.get(t)
        if c is None:
            raise InvalidScheduleError(
                f"step {k} ({reader}) reads {problem.tensors[t].name!r}, which does not exist "
                "then: it was never computed, or was freed at the end of the forward phase "
                "without being kept")
        if last[c] < k:
            last[c] = k

    get, n = current.get, 0
    for k, i in enumerate(steps):
        if k == n_fwd:
            _enter_backward(problem, schedule, current, last, n_fwd)
            new_copies(problem.tangents, k)
            n = len(born)
        op = ops[i]
        if k < n_fwd and i in unrun:
            continue
        for t in op.inputs:
            c = get(t)
            if c is None:
                read(t, k, op.name)
            last[c] = k  # steps run in order: k is the latest read so far
        if op.overwrites:
            candidates.append((k, tuple(current[t] for t in op.overwrites)))
        outs = op.outputs
        if outs:
            made = [k] * len(outs)
            born += made
            last += made
            tensor_of += outs
            for t in outs:
                current[t] = n
                n += 1
    if len(steps) == n_fwd:  # a problem with no backward ops
        _enter_backward(problem, schedule, current, last, n_fwd)
        new_copies(problem.tangents, n_fwd - 1 if n_fwd else 0)
    for t in problem.backward_outputs:
        read(t, end, "the backward's outputs")
        last[current[t]] = end
    return born, last, tensor_of, candidates


def _overwrites(problem: Problem, born, last, tensor_of, candidates) -> list[tuple[int, int]]:
    """(step, copy) pairs: the steps that write into a dying input's copy (NOTE [Writing into
    a dying input])."""
    n_fwd = len(problem.forward_ops)
    outputs = set(problem.forward_outputs)
    found = []
    for k, copies in candidates:
        for c in copies:
            if last[c] == k and (born[c] < n_fwd) == (k < n_fwd) and tensor_of[c] not in outputs:
                found.append((k, c))
                break
    return found


def _enter_backward(problem, schedule, current, last, n_fwd):
    for t in problem.forward_outputs:
        last[current[t]] = max(last[current[t]], n_fwd - 1)
    for t in list(current):
        if t not in schedule.kept:
            del current[t]


# NOTE [A first run's workspace]
#   A random op the executor recomputes on the CPU holds the generator state it puts back while
#   it runs (NOTE [The replay's state held] in monet_opt/recompute.py); its forward run does
#   not. An op's `workspace_bytes` is its recomputation's, and what every solver prices each of
#   its runs at: an upper bound for the first. The simulator, which says what a schedule peaks
#   at, prices the forward run at `first_workspace_bytes` where that is set (at most
#   workspace_bytes), so a plan whose peak is at such an op's forward run predicts what the
#   step holds (a small RNN's dropout: 5,056 B over before); and where the schedule keeps the
#   op's state (`captured`), at `captured_workspace_bytes`, with the state's copy (NOTE [The
#   capture's copy] in monet_opt/recompute.py). The solvers take the larger of the two
#   (`Op.first_extra_bytes`). The least-peak bound (solvers/peak_bound.py) takes the first
#   run's uncaptured: every op runs at least once.
def _memory_timeline(problem: Problem, steps, born, last, sizes, reused: dict[int, int],
                     unrun: frozenset[int], kept_states: frozenset[int], fixed: int):
    n = len(steps)
    n_fwd = len(problem.forward_ops)
    per_op = _per_op(problem)
    alloc = [0] * (n + 1)
    free_after = [0] * (n + 1)
    for b, e, size in zip(born, last, sizes):
        alloc[b] += size
        free_after[e] += size
    first, captured_, extra = per_op.first_extra, per_op.captured_extra, per_op.extra
    extras = [0 if i in unrun else captured_[i] if i in kept_states else first[i]
              for i in steps[:n_fwd]]  # NOTE [A first run's workspace]
    extras += map(extra.__getitem__, steps[n_fwd:])
    before = accumulate(map(sub, alloc[:n - 1], free_after[:n - 1]), initial=fixed)
    timeline = list(map(add, map(add, before, alloc), extras))
    for k, size in reused.items():
        timeline[k] -= size
    top = max(timeline)
    if top > fixed:
        return timeline, top, timeline.index(top)
    return timeline, fixed, 0


def fastest_within(problem: Problem, budget_bytes: int, candidates, program: str):
    """(schedule, simulation, origin) of the fastest (then lowest) of `candidates`, pairs of
    (schedule or None, origin), that runs within the budget; None if none does. A candidate of
    origin "milp" comes from a program whose memory rows promise the budget: over it, that
    program (`program`, for the message) is wrong, and this raises SolverError."""
    best = None
    for schedule, origin in candidates:
        if schedule is None:
            continue
        sim = simulate(problem, schedule)
        if sim.peak_bytes > budget_bytes:
            if origin == "milp":
                raise SolverError(f"internal: {program}'s schedule peaks at {sim.peak_bytes} B "
                                  f"over its budget {budget_bytes} B; its memory rows are wrong")
            continue
        if best is None or (sim.time_s, sim.peak_bytes) < (best[1].time_s, best[1].peak_bytes):
            best = (schedule, sim, origin)
    return best
