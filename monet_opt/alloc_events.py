"""CPU memory as the allocator hands it out: torch.profiler's allocation events.

NOTE [Allocation events]
  The live-bytes counter (memory.LiveBytes) sees the tensors ops return, not the memory a
  kernel takes and gives back inside one call: oneDNN's convolutions reorder their inputs and
  weights into scratch buffers, a matmul packs its operands, an out= form may make its result
  and copy it (NOTE [Gradients written in place] in monet_opt/grad_in_place.py). With plans
  made and checked by the counter alone, a CNN's step passed its limit by up to 48 MiB by
  the process's allocations (MobileNetV2 b32 at 160², docs/benchmarks/channels_last), and a
  convolution of 8x64x32x32 took 2.1 MiB of scratch beside its 2 MiB output, its backward
  4.2 MiB. The CPU allocator reports every allocation and free to torch.profiler when it
  records memory, so on CPU both an op's workspace (memory.counted) and a step's peak
  (memory.measure_peak) are read from those events: the largest running sum of what was
  allocated in the window, less what was freed of it and of the storages alive at its start
  that it was told of. The allocator reports no free of memory it handed out while no
  profiler recorded: a tensor made before the window and freed in it counts as alive
  throughout (the counter saw it die), and the frees of other memory made before it are not
  counted, as the counter did not count that memory. Figures are the same to the byte from
  run to run where the kernels' scratch is (one thread or many, as long as it is the same).
  Starting and stopping the profiler prints two lines to the process's stderr from C++
  (kineto's "profiler_start"/"profiler_stop", and on a CUDA build without a GPU an error
  about the device count the first time); an op's workspace is taken once per signature, so
  those lines are silenced by pointing file descriptor 2 at /dev/null for the start and the
  stop only (what another thread writes there in those few milliseconds is lost too). The
  profiler cannot run inside another: one window opened inside another (a step measured that
  plans, profiling its ops) stops the outer's profiler while it runs and hands its events to
  it; where the user's profiler is running, no events are taken (`available()`): the callers
  fall back to the counter, with a warning, and such a profile is keyed apart in the profile
  directory (monet_opt/cache_keys.py).
  On by default since 2026-12-02 (`enabled()`); MONET_OPT_CPU_SCRATCH=0 in the environment
  turns it off: CPU plans then count, and measure_peak measures, what the live-bytes counter
  sees, as before. With it, the least peaks of small CNNs rise by their convolutions' scratch
  (a test CNN's from 34 % to 57 % of its activations): what their steps took anyway
  (docs/training.md, "Kernel scratch on CPU").
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterable, Iterator

import torch
from torch._C._profiler import ProfilerActivity, RecordScope, _EventType, _ExperimentalConfig
from torch.autograd import (ProfilerConfig, ProfilerState, _disable_profiler, _enable_profiler,
                            _prepare_profiler)


SWITCH = "MONET_OPT_CPU_SCRATCH"


def enabled() -> bool:
    """Whether CPU memory is read from allocation events: unless the environment sets SWITCH
    to 0 (NOTE [Allocation events])."""
    return os.environ.get(SWITCH, "1").strip() != "0"


def available() -> bool:
    """Whether allocation events can be taken now: no profiler runs, or only ours."""
    return bool(_open) or not torch._C._autograd._profiler_enabled()


UNMEASURED = ("scratch", False)  # a traced setting: kernels' scratch not measured


# NOTE [Plans made inside a profiler]
#   Inside the user's torch.profiler no allocation events can be taken beside it, so a step
#   planned there counts no kernels' scratch (the profiler warns, once per plan). Run outside
#   it, such a plan passed its limit by the scratch, silently, and the profile directory gave it
#   to a later optimize() inside a profiler without a word (a small CNN: 15,008 B over a
#   175,176 B limit at every step; settings probe, 2026-12-06). So "scratch unmeasured" is among
#   the settings a step is traced under (capture.autocast_state): a step run outside any
#   profiler after it was planned inside one is planned again, counting the scratch; a plan
#   that counts it serves inside a profiler too (module.OptimizedModule._step_for), so
#   profiling a few steps of a training run plans nothing.
def unmeasured() -> tuple[tuple[str, bool], ...]:
    """(UNMEASURED,) where CPU steps are measured by allocation events and none can be taken
    now; else ()."""
    return (UNMEASURED,) if enabled() and not available() else ()


class Allocations:
    """While open, records the CPU allocator's allocations and frees; then `peak` is the most
    it held above its start and `net` what it held more at its end (NOTE [Allocation
    events]). `held`: tensors alive at the start whose frees in the window count (the step's
    inputs, parameters...). One may open inside another (a step measured that plans, and the
    profiler taking an op's workspace): the outer's profiler stops while the inner runs, and
    takes in the inner's events as its own. `trace`: keep (time ns, `net`) after each event
    in `samples` (the benchmark's timeline)."""

    def __init__(self, held: Iterable[torch.Tensor] = (), trace: bool = False) -> None:
        self.samples: list[tuple[int, int]] | None = [] if trace else None
        self._live: dict[int, int] = {}  # pointer: bytes, of what a free counts
        for t in held:
            if t.device.type == "cpu" and not t.is_meta and not t._is_zerotensor() \
                    and t.layout == torch.strided:
                storage = t.untyped_storage()
                if storage.nbytes():
                    self._live[storage.data_ptr()] = storage.nbytes()
        self.peak = 0
        self.net = 0

    def __enter__(self) -> "Allocations":
        if _open:
            _open[-1]._stop()
            self._live = {**_open[-1]._live, **self._live}
        _open.append(self)
        self._start()
        return self

    def __exit__(self, *exc) -> None:
        events = self._stop()
        _open.pop()
        if _open:
            _open[-1]._take(events)
            _open[-1]._start()

    def _start(self) -> None:
        """NOTE [No profiler objects left to the collector]: torch.profiler.profile's Python
        objects form reference cycles (115 of them per window) that hold the profiler's C++
        results until the garbage collector frees them; with a window per op signature, test
        runs with the events on crashed inside the collector (three segmentation faults in
        about six runs, never with them off). The window drives the profiler through
        torch.autograd's functions instead: its results die when their last reference goes,
        at the end of `_stop`, and a window costs about 1 ms where it cost 20. The crashes went
        on, and had another cause, found: NOTE [No op events in a window]."""
        config = ProfilerConfig(ProfilerState.KINETO, False, True, False, False, False,
                                _ExperimentalConfig())
        global _warned_once
        # NOTE [The allocator's one warning]
        made_before = None if _warned_once else torch.empty(1)
        with _quiet_stderr():
            _prepare_profiler(config, {ProfilerActivity.CPU})
            _enable_profiler(config, {ProfilerActivity.CPU}, {_NO_OPS_SCOPE})
            if made_before is not None:
                del made_before
                _warned_once = True

    def _stop(self) -> list[tuple[int, int, int, int]]:
        """Stops the profiler and takes in its events; returns them."""
        with _quiet_stderr():
            results = _disable_profiler()
        events = _events(results)
        del results
        self._take(events)
        return events

    def _take(self, events: list[tuple[int, int, int, int]]) -> None:
        """Counts `events` in: a free only where its pointer was allocated in the window or
        is held."""
        for time_ns, _, ptr, size in events:
            if size > 0:
                self._live[ptr] = size
                self.net += size
                self.peak = max(self.peak, self.net)
            elif ptr in self._live:
                self.net -= self._live.pop(ptr)
            if self.samples is not None:
                self.samples.append((time_ns, self.net))


_open: list[Allocations] = []  # those open, innermost last
# NOTE [No op events in a window]
#   A window records allocations only: its profiler is started for one scope of functions no
#   training step runs (the mobile lite interpreter's), so it puts no callback on the step's
#   ops and Python scopes. With callbacks on every scope (the default), a scope that began in
#   one profiler session and ended in the next wrote its end time into the first's freed
#   events (torch's onFunctionExit finds a session running and writes through the pointer the
#   scope took at its start): a window around a step that plans stops and restarts its
#   profiler for the planning's own windows (NOTE [Allocation events]), and torch.compile
#   wraps the whole call in a "Torch-Compiled Region" scope. tests/test_wrapping.py's
#   torch.compile test so crashed in 4 of 24 runs here (a segmentation fault freeing the
#   profiler's results, the collector visiting a set written over, glibc's "corrupted size vs.
#   prev_size"); its body in a loop crashed once in 36 iterations, and in none of 36 without
#   torch.compile or of 36 without a step that plans; with no op callbacks, in none of 150.
#   The allocation events are the same with or without the op events
#   (tests/test_alloc_events.py).
_NO_OPS_SCOPE = RecordScope.LITE_INTERPRETER
# NOTE [The allocator's one warning]
#   Freed while a profiler records, memory the CPU allocator handed out while none did makes
#   it print "Memory block of unknown size was allocated before the profiling started" to
#   stderr, once per process: a step measured by a window frees what the step before it made.
#   The window counts such a free as none (NOTE [Allocation events]), so the line tells the
#   user nothing; the process's first window frees a tensor made before it while stderr
#   points at /dev/null, and the allocator's one warning is spent there.
_warned_once = False


def _events(results) -> list[tuple[int, int, int, int]]:
    """(time ns, order seen, pointer, bytes: negative for a free) of each CPU allocation event
    in the profiler's `results`."""
    out = []
    stack = list(results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation:
            fields = e.extra_fields
            if fields.device.type == "cpu":
                out.append((e.start_time_ns, len(out), fields.ptr, fields.alloc_size))
        else:
            stack.extend(reversed(e.children))
    return sorted(out)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 pointed at /dev/null (NOTE [Allocation events])."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
