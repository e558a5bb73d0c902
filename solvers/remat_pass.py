"""One rematerializing pass over a training step (NOTE [Rematerializing under the budget] in
solvers/remat.py): the forward, then the backward ops in order, holding, evicting and making
again under a budget, with the bytes counted as the simulator counts them."""
from __future__ import annotations

import math
import time
from typing import Callable

from solvers.problem import Problem
from solvers.schedule import Schedule


def rematerialize(problem: Problem, budget_bytes: float, a: float = 1.0, b: float = 1.0,
                  chosen: frozenset[int] = frozenset(), give_up_s: float = math.inf,
                  deadline: float = math.inf, kept: frozenset[int] | None = None
                  ) -> Schedule | None:
    """One pass (NOTE [Rematerializing under the budget]) with `chosen` variants in use, or None
    where some op cannot run within the budget however much is evicted, or where the step would
    take longer than `give_up_s` (every op once, and what the pass has made again so far).
    Raises Timeout past `deadline` (time.perf_counter()). `kept`: where given, the forward
    holds for the backward no more than these."""
    plain = problem.with_variants(chosen)
    facts = plain.memo.get("remat_facts")
    if facts is None:
        facts = plain.memo["remat_facts"] = _Facts(plain)
    walk = _Walk(facts, budget_bytes, a, b, give_up_s - plain.base_time_s, deadline)
    try:
        held = walk.forward(kept)
        backward = walk.backward()
    except _NoRoom:
        return None
    return Schedule(kept=held, backward=backward, variants=chosen)


class Timeout(Exception):
    """A pass ran past its deadline."""


class _NoRoom(Exception):
    """Everything that may go is gone and the op still does not fit, or the pass has made so
    much again that it cannot beat the fastest schedule found."""


class _Facts:
    """What every pass over one plain problem reads: sizes, times, and per forward tensor the
    backward positions that read it and the last position that reads it or anything made from
    it."""

    def __init__(self, p: Problem) -> None:
        self.p = p
        self.n_fwd = len(p.forward_ops)
        self.bwd = p.backward_ops
        self.size = [t.bytes for t in p.tensors]
        self.producer = [t.producer for t in p.tensors]
        self.rerun = [op.rerun_s for op in p.ops]
        self.forward = [False] * len(p.tensors)
        for t in p.forward_tensors:
            self.forward[t] = True
        self.reads: list[list[int]] = [[] for _ in p.tensors]
        self.last_backward = [-1.0] * len(p.tensors)  # backward tensors: last read position
        read_at = [(pos, t) for pos, i in enumerate(self.bwd) for t in p.ops[i].inputs]
        for pos, t in read_at + [(math.inf, t) for t in p.backward_outputs]:
            if self.forward[t]:
                self.reads[t].append(len(self.bwd) if pos == math.inf else pos)
            else:
                self.last_backward[t] = pos
        self.need_until = [-1] * len(p.tensors)
        for i in reversed(p.forward_ops):
            for t in p.ops[i].outputs:
                self.need_until[t] = max([self.reads[t][-1] if self.reads[t] else -1] + [
                    self.need_until[o] for c in p.consumers[t] if not p.ops[c].is_backward
                    for o in p.ops[c].outputs])
        self.last_forward_read = [-1] * len(p.tensors)
        for i in p.forward_ops:
            for t in p.ops[i].inputs:
                self.last_forward_read[t] = i
        # each op's inputs, earliest made first (tangents, made by none, before all)
        self.inputs = [tuple(sorted(op.inputs, key=lambda t: self.producer[t]))
                       for op in p.ops]


class _Walk:
    """One pass's state: the forward copies held (`held`, tensor -> bytes), the bytes resident
    (`resident`, fixed memory included, as the simulator counts between steps) and the
    backward order made so far."""

    def __init__(self, facts: _Facts, budget_bytes: float, a: float, b: float,
                 spare_s: float, deadline: float) -> None:
        self.f, self.budget, self.a, self.b = facts, budget_bytes, a, b
        self.spare_s = spare_s  # what making copies again may cost before the pass gives up
        self.deadline = deadline
        # the held copies and the backward's own tensors by the position after which they go
        self.expiring: dict[float, list[int]] = {}
        self.backward_phase = False
        self.held: dict[int, int] = {}
        self.others: dict[int, int] = {}  # backward tensors and tangents, until their last read
        self.resident = facts.p.fixed_bytes
        self.order: list[int] = []
        self.locks: dict[int, int] = {}
        self.next_read = [0] * len(facts.size)  # index into reads[t] of its next read
        self.cost_of: dict[int, float] = {}
        self.k = 0  # the forward step, then the backward position, running

    def forward(self, kept: frozenset[int] | None) -> frozenset[int]:
        f, p = self.f, self.f.p
        saved, outputs = p.saved_for_backward, set(p.forward_outputs)
        if kept is not None:
            saved = saved & kept
        for i in p.forward_ops:
            self.k = i
            if time.perf_counter() > self.deadline:
                raise Timeout
            self._make_room(i, forward=True)
            self._add(i, lambda t: True)
            for t in p.ops[i].inputs + p.ops[i].outputs:
                if t in self.held and t not in saved and t not in outputs and \
                        f.last_forward_read[t] <= i:
                    self._drop(t)
        for t in list(self.held):
            if t not in saved:
                self._drop(t)
        return frozenset(self.held)

    def backward(self) -> tuple[int, ...]:
        f, p = self.f, self.f.p
        for t in p.tangents:
            self.others[t] = f.size[t]
            self.resident += f.size[t]
        self.backward_phase, self.k = True, 0
        for t in self.held:
            self._expires(t, f.need_until[t])
        for t in p.tangents:
            self._expires(t, f.last_backward[t])
        for pos, i in enumerate(f.bwd):
            self.k = pos
            if time.perf_counter() > self.deadline:
                raise Timeout
            self._run(i)
            for t in self.expiring.pop(pos, ()):
                if t in self.held:
                    self._drop(t)
                elif t in self.others:
                    self.resident -= self.others.pop(t)
        self.k = len(f.bwd)  # a forward tensor the backward returns is read at its end
        for t in p.backward_outputs:
            if f.forward[t] and t not in self.held:
                self._run(f.producer[t])
        return tuple(self.order)

    def _run(self, i: int) -> None:
        """Make op i's missing inputs again (depth-first, NOTE [Rematerializing under the
        budget]), then op i; each op's inputs locked while it runs."""
        f = self.f
        stack = [[i, 0]]
        while stack:
            frame = stack[-1]
            j, k = frame
            inputs = f.inputs[j]
            if k < len(inputs):
                frame[1] += 1
                t = inputs[k]
                if f.forward[t] and t not in self.held:
                    frame[1] -= 1  # locked once made, when this frame comes back to it
                    stack.append([f.producer[t], 0])
                else:
                    self.locks[t] = self.locks.get(t, 0) + 1
                continue
            stack.pop()
            self._make_room(j, forward=False)
            self.order.append(j)
            if not f.p.ops[j].is_backward:
                self.spare_s -= f.rerun[j]
                if self.spare_s < 0:
                    raise _NoRoom
            self._add(j, lambda t: f.need_until[t] >= self.k)
            for t in inputs:
                self.locks[t] -= 1
                if not self.locks[t]:
                    del self.locks[t]

    def _add(self, i: int, held: Callable[[int], bool]) -> None:
        """Op i ran: its outputs are resident, forward ones held if `held` says so (a copy
        nothing reads goes right after it is made)."""
        f = self.f
        backward = f.p.ops[i].is_backward
        for t in f.p.ops[i].outputs:
            if backward:
                self.others[t] = f.size[t]
                self.resident += f.size[t]
                self._expires(t, f.last_backward[t])
            elif held(t):
                self.held[t] = f.size[t]
                self.resident += f.size[t]
                if self.backward_phase:
                    self._expires(t, f.need_until[t])
        self.cost_of.clear()

    def _expires(self, t: int, pos: float) -> None:
        """t goes after backward position `pos` (or the running one, if that is later)."""
        self.expiring.setdefault(max(pos, self.k), []).append(t)

    def _drop(self, t: int) -> None:
        self.resident -= self.held.pop(t)
        self.cost_of.clear()

    def _make_room(self, i: int, forward: bool) -> None:
        f = self.f
        op = f.p.ops[i]
        need = sum(f.size[t] for t in op.outputs) + op.extra_bytes
        while self.resident + need > self.budget:
            victim = self._victim(forward)
            if victim is None:
                raise _NoRoom
            self._drop(victim)

    def _victim(self, forward: bool) -> int | None:
        """The held copy of least score that may go (NOTE [Rematerializing under the budget]);
        scores bounded below by the producer's own time are only computed in full while they
        could still win."""
        f, k, a, b = self.f, self.k, self.a, self.b
        bounded = []
        outputs = f.p.forward_outputs
        for t, size in self.held.items():
            if t in self.locks or not size:
                continue
            if forward:
                if f.last_forward_read[t] >= k or t in outputs:
                    continue
                distance = f.n_fwd - k + f.reads[t][0] + 1
            else:
                distance = self._next_read(t) - k + 1
            weight = size * max(distance, 1) ** b
            bounded.append((max(f.rerun[f.producer[t]], 1e-12) ** a / weight, weight, t))
        bounded.sort()
        best, best_score = None, math.inf
        for low, weight, t in bounded:
            if low >= best_score:
                break
            score = self._cost(t) ** a / weight
            if score < best_score:
                best, best_score = t, score
        return best

    def _next_read(self, t: int) -> int:
        """The next backward position that reads t, or, where none does, the last that reads
        something made from it."""
        reads, n = self.f.reads[t], self.next_read[t]
        while n < len(reads) and reads[n] < self.k:
            n += 1
        self.next_read[t] = n
        return reads[n] if n < len(reads) else self.f.need_until[t]

    def _cost(self, t: int) -> float:
        """The time to make t again from what is held (Problem.remake_s), kept until the held
        set changes."""
        cost = self.cost_of.get(t)
        if cost is None:
            cost = self.cost_of[t] = max(self.f.p.remake_s(t, self.held), 1e-12)
        return cost
