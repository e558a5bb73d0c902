"""Problem builders for solver tests (torch-free)."""
from __future__ import annotations

import random

from solvers import NO_PRODUCER, Op, Problem, Tensor


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
