"""Problem builders for solver tests (torch-free)."""
from __future__ import annotations

import random
from dataclasses import replace

from solvers import (NO_PRODUCER, Op, Problem, Schedule, SolveResult, Status, Tensor, Variant,
                     simulate, solve)


def autodiff_problem(n_fwd: int, rng: random.Random, fan_in: int = 2, fixed: int = 1000,
                     name: str = "random") -> Problem:
    """A random forward DAG and the backward an autodiff would make of it: backward op i reads
    the gradients of op i's consumers (or the tangent) and op i's inputs, and makes one gradient.
    """
    ops: list[Op] = []
    tensors: list[Tensor] = []
    fwd_inputs: list[tuple[int, ...]] = []
    for i in range(n_fwd):
        ins = tuple(sorted(set(rng.sample(range(i), min(i, rng.randint(1, fan_in)))))) if i else ()
        fwd_inputs.append(ins)
        tensors.append(Tensor(f"a{i}", rng.randint(1, 50), i))
        ops.append(Op(f"f{i}", False, rng.uniform(0.1, 2.0), ins, (i,)))
    consumers = {i: [j for j in range(n_fwd) if i in fwd_inputs[j]] for i in range(n_fwd)}
    tangent = len(tensors)
    tensors.append(Tensor("tangent", tensors[n_fwd - 1].bytes, NO_PRODUCER))
    grad_of: dict[int, int] = {}
    for i in reversed(range(n_fwd)):
        if i == n_fwd - 1 or not consumers[i]:
            grads = (tangent,)
        else:
            grads = tuple(grad_of[j] for j in consumers[i])
        k = len(ops)
        t = len(tensors)
        tensors.append(Tensor(f"g{i}", rng.randint(1, 50), k))
        saved = fwd_inputs[i] + ((i,) if rng.random() < 0.3 else ())
        ops.append(Op(f"b{i}", True, rng.uniform(0.1, 3.0), tuple(dict.fromkeys(grads + saved)),
                      (t,)))
        grad_of[i] = t
    return Problem(tuple(ops), tuple(tensors), fixed, forward_outputs=(n_fwd - 1,),
                   backward_outputs=(grad_of[0],), name=name)


def chain(n: int, size: int = 10, fixed: int = 100) -> Problem:
    """f0 -> f1 -> ... ; backward op i reads the incoming gradient and f(i-1)'s output."""
    ops, tensors = [], []
    for i in range(n):
        ops.append(Op(f"f{i}", False, 1.0, (i - 1,) if i else (), (i,)))
        tensors.append(Tensor(f"a{i}", size, i))
    tensors.append(Tensor("tangent", size, NO_PRODUCER))
    prev = n
    for k, i in enumerate(reversed(range(n))):
        ops.append(Op(f"b{i}", True, 2.0, (prev, i - 1) if i else (prev,), (len(tensors),)))
        tensors.append(Tensor(f"g{i}", size, n + k))
        prev = len(tensors) - 1
    return Problem(tuple(ops), tuple(tensors), fixed, forward_outputs=(n - 1,),
                   backward_outputs=(prev,), name=f"chain{n}")


def with_masks(p: Problem, rng: random.Random, frac: float = 0.5) -> Problem:
    """`p` plus operator variants: for a random share of the forward tensors that exactly one
    backward op reads, an encode op right after the producer makes a smaller form (a "mask")
    which that backward op may read instead, at a random extra cost; sometimes two such forms
    (exclusive) for the same read."""
    readers = {x: [b for b in p.backward_ops if x in p.ops[b].inputs] for x in p.forward_tensors}
    chosen = [x for x in p.forward_tensors if len(readers[x]) == 1 and p.tensors[x].bytes > 1
              and rng.random() < frac]
    forms = {x: rng.choice([1, 1, 2]) for x in chosen}
    order: list[tuple[str, int, int]] = []  # (kind, old op or tensor, form number)
    for i in p.forward_ops:
        order.append(("op", i, 0))
        for x in p.ops[i].outputs:
            order += [("enc", x, f) for f in range(forms.get(x, 0))]
    order += [("op", b, 0) for b in p.backward_ops]
    new_id = {old: k for k, (kind, old, _) in enumerate(order) if kind == "op"}
    tensors = [Tensor(t.name, t.bytes, new_id.get(t.producer, NO_PRODUCER)) for t in p.tensors]
    ops: list[Op] = []
    variants: list[Variant] = []
    for k, (kind, old, f) in enumerate(order):
        if kind == "op":
            ops.append(p.ops[old])
            continue
        m = len(tensors)
        tensors.append(Tensor(f"m{old}.{f}", rng.randint(1, p.tensors[old].bytes - 1), k))
        ops.append(Op(f"enc{old}.{f}", False, rng.uniform(0.01, 0.3), (old,), (m,)))
        variants.append(Variant(f"mask{old}.{f}", new_id[readers[old][0]], old, (m,), (k,),
                                rng.uniform(-0.05, 0.2), rng.choice([0, 0, 5])))
    return Problem(tuple(ops), tuple(tensors), p.fixed_bytes, p.forward_outputs,
                   p.backward_outputs, tuple(variants), name=p.name + "+masks")


def masked_chain(n: int, size: int = 32, mask: int = 1, encode_s: float = 0.1) -> Problem:
    """A chain of ReLU-like ops whose backward reads only its own output, each with a variant
    that reads a `mask`-byte encoding instead (made by an encode op costing `encode_s`)."""
    ops, tensors, variants = [], [], []
    for i in range(n):
        ops.append(Op(f"r{i}", False, 1.0, (2 * i - 2,) if i else (), (2 * i,)))
        tensors.append(Tensor(f"y{i}", size, 2 * i))
        ops.append(Op(f"enc{i}", False, encode_s, (2 * i,), (2 * i + 1,)))
        tensors.append(Tensor(f"m{i}", mask, 2 * i + 1))
    tensors.append(Tensor("tangent", size, NO_PRODUCER))
    prev = len(tensors) - 1
    for i in reversed(range(n)):
        k = len(ops)
        variants.append(Variant(f"mask{i}", k, 2 * i, (2 * i + 1,), (2 * i + 1,)))
        ops.append(Op(f"b{i}", True, 2.0, (prev, 2 * i), (len(tensors),)))
        tensors.append(Tensor(f"g{i}", size, k))
        prev = len(tensors) - 1
    return Problem(tuple(ops), tuple(tensors), 100, forward_outputs=(2 * n - 2,),
                   backward_outputs=(prev,), variants=tuple(variants), name=f"masked_chain{n}")


def diamonds(k: int, size: int = 10, fixed: int = 100) -> Problem:
    """k diamonds in a row: each block's input x feeds two branches l = f(x), r = g(x), joined
    by j = h(l, r), which is the next block's input. The backward is autodiff's: one op per
    forward op (in reverse), reading the gradients of its consumers and its forward inputs."""
    fwd_inputs: list[tuple[int, ...]] = [()]  # op 0 makes the first block's input
    for b in range(k):
        x = 3 * b
        fwd_inputs += [(x,), (x,), (x + 1, x + 2)]
    n = len(fwd_inputs)
    ops = [Op(f"f{i}", False, 1.0 + (i % 3 == 1), ins, (i,)) for i, ins in enumerate(fwd_inputs)]
    tensors = [Tensor(f"a{i}", size * (1 + (i % 3 == 2)), i) for i in range(n)]
    tensors.append(Tensor("tangent", size, NO_PRODUCER))
    grad_of: dict[int, int] = {}
    for i in reversed(range(n)):
        users = [j for j in range(n) if i in fwd_inputs[j]]
        grads = tuple(grad_of[j] for j in users) if users else (n,)
        grad_of[i] = len(tensors)
        tensors.append(Tensor(f"g{i}", size, len(ops)))
        ops.append(Op(f"b{i}", True, 2.0, grads + fwd_inputs[i], (grad_of[i],)))
    return Problem(tuple(ops), tuple(tensors), fixed, forward_outputs=(n - 1,),
                   backward_outputs=(grad_of[0],), name=f"diamonds{k}")


def budget_between(p: Problem, frac: float) -> int:
    """A budget `frac` of the way from auto's least peak on `p` up to store-all's peak."""
    store_peak = solve(p, 10**12, "store_all").peak_bytes
    least = solve(p, 10**12, "auto").min_feasible_bytes
    return int(least + frac * (store_peak - least))


def with_overwrites(p: Problem, rng: random.Random) -> tuple[Problem, Problem]:
    """`p` with about half its forward ops free to write into one of their inputs (outputs
    resized to match); the backward often stops reading those inputs (as a ReLU's backward
    reads its output), so that a recomputation can be their last reader, and one of them may be
    a forward output too. And the same problem without that freedom."""
    ops, tensors = list(p.ops), list(p.tensors)
    chosen = []
    for i in p.forward_ops:
        op = ops[i]
        if op.inputs and rng.random() < 0.5:
            t = rng.choice(op.inputs)
            out = op.outputs[0]
            tensors[out] = replace(tensors[out], bytes=tensors[t].bytes)
            ops[i] = replace(op, overwrites=(t,))
            chosen.append(t)
    unread = {t for t in chosen if rng.random() < 0.7}
    for i in p.backward_ops:
        ops[i] = replace(ops[i], inputs=tuple(t for t in ops[i].inputs if t not in unread))
    outputs = p.forward_outputs + ((rng.choice(chosen),) if chosen and rng.random() < 0.5 else ())
    free = replace(p, ops=tuple(ops), tensors=tuple(tensors),
                   forward_outputs=tuple(dict.fromkeys(outputs)))
    plain = replace(free, ops=tuple(replace(o, overwrites=()) for o in ops))
    return free, plain


def as_result(problem: Problem, schedule: Schedule, solver: str = "milp") -> SolveResult:
    """`schedule` as a feasible result of `solver`, as simulated: a stand-in solver's answer
    (monkeypatched into the registry or over solvers.solve)."""
    sim = simulate(problem, schedule)
    return SolveResult(solver, Status.FEASIBLE, schedule, sim.time_s, sim.peak_bytes, None,
                       None, 0.0, sim.peak_bytes)
