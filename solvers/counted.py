"""What a program that counts memory itself counts above the simulator.

NOTE [Counted above the step]
  The joint MILP and Checkmate's program write their own memory rows; simulate() is the one
  judge of a schedule's peak. Two of its rules they count at full size: an op writing its
  output into a dying input (NOTE [Writing into a dying input] in simulate.py; the MILP counts
  most of them in the forward: NOTE [Written into in the forward] in encode_reads.py) and an
  op's smaller first-run workspace (NOTE [A first run's workspace]; the MILP's forward rows take
  it, Checkmate's program does not). Their schedules are safe (every row an upper bound), but
  a schedule they count over the budget may fit it, so their proof of optimality is no proof:
  the MILP called 42 s optimal at 132 B where "auto" found 36.25 s, a recomputed op writing
  into a recomputed input (solvers fuzzing, 2026-12-05). Where a problem has such an op, they
  report FEASIBLE and a bound that holds for every schedule.

NOTE [Bounds without the states]
  A CPU step's generator states (`Op.state_bytes`) and their copies at forward runs
  (`Op.captured_workspace_bytes`) are counted by every program whatever the schedule keeps, and
  by the simulator only where it keeps them. A bound proved counting them is no bound: on a
  small CNN with dropout the boundary bound said +32.4 % where "auto" found +24.6 % (bench
  test, 2026-12-06). The boundary bound is proved on the problem without them
  (`Problem.stateless`), on which every schedule peaks at most as it does, and the cut
  program's dual bound is taken only where there are none.
"""
from __future__ import annotations

from solvers.problem import Problem


def counted_above(problem: Problem, first_runs: bool) -> str:
    """What a program counts above the simulator on `problem` ("" where nothing): in-place
    writes and generator states (NOTE [Bounds without the states]) always; smaller first-run
    workspaces unless the program counts them (`first_runs`)."""
    said = []
    if any(op.overwrites for op in problem.ops):
        said.append("outputs written into dying inputs")
    if not first_runs and any(op.first_workspace_bytes is not None and
                              op.first_workspace_bytes < op.workspace_bytes
                              for op in problem.ops):
        said.append("smaller first-run workspaces")
    if any(op.state_bytes or op.run_workspace_bytes(True) != op.run_workspace_bytes(True, True)
           for op in problem.ops):  # NOTEs [The capture's copy], [States kept only where used]
        said.append("generator states a schedule keeps none of")  # in monet_opt/recompute.py
    return " and ".join(said)
