"""How long one simulation takes (solvers.simulate, the one simulator every schedule is checked
by): on the saved problems of docs/benchmarks/problems_*.json.gz, or on a problem file a cache
holds (a profile directory's problem-*.json), five schedules each (kept on demand from random
shares of the saved tensors: all, 70, 40, 10 %, none), the least of 7 rounds, process time.

    .venv/bin/python docs/benchmarks/simulate_speed.py [densenet121 gpt2 ... | FILE.json]
"""
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import solvers  # noqa: E402
from solvers.ondemand import schedule_from_kept  # noqa: E402

import saved_problems  # noqa: E402


def problems(names: list[str]):
    for name in names or list(saved_problems.PROBLEMS):
        if name.endswith(".json"):
            with open(name) as f:
                yield os.path.basename(name), solvers.Problem.from_dict(json.load(f)["problem"])
        else:
            yield name, saved_problems.load(name)[0]


def per_schedule_ms(problem) -> float:
    rng = random.Random(0)
    saved = sorted(problem.saved_for_backward)
    schedules = [schedule_from_kept(problem, frozenset(x for x in saved if rng.random() < share))
                 for share in (1.0, 0.7, 0.4, 0.1, 0.0)]
    for s in schedules:
        solvers.simulate(problem, s)
    least = float("inf")
    for _ in range(7):
        start = time.process_time()
        for s in schedules:
            solvers.simulate(problem, s)
        least = min(least, (time.process_time() - start) / len(schedules))
    return least * 1e3


if __name__ == "__main__":
    for name, problem in problems(sys.argv[1:]):
        print(f"{name}: {len(problem.ops)} ops, {per_schedule_ms(problem):.2f} ms a simulation")
