"""HiGHS in forked children after its task scheduler started with worker threads in the parent
(NOTE [HiGHS after fork] in solvers/highs.py). Each case runs in a fresh interpreter, so that the
scheduler started there is not this process's."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("highspy")

# A scheduler of four threads started first (what HiGHS's default does on an eight-core
# machine, or another library's run in the user's process), then a small program of ours.
_SCRIPT = textwrap.dedent("""
    import json, random, sys, time
    import highspy, numpy as np
    from solvers import highs as H, mip as M
    from solvers.aside import Aside

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 4)
    h.addVars(1, np.array([0.0]), np.array([1.0]))
    h.run()

    def program():
        rng = random.Random(0)
        m = M.Mip()
        xs = [m.var(cost=-rng.random()) for _ in range(60)]
        for _ in range(20):
            m.row([(rng.choice(xs), rng.random()) for _ in range(6)], hi=1.0)
        return m

    def solved():
        t0 = time.perf_counter()
        r = M.solve_mip(program(), time_limit_s=LIMIT)
        return [r.status, time.perf_counter() - t0]

    LIMIT = 4.0
    where = sys.argv[1]
    if where == "child":
        H.CHILD_MIN_VARS = 0  # every program in a forked child
        out = solved()
    elif where == "aside":
        out = Aside(solved).result()
    else:
        out = solved()
    print(json.dumps(out))
""")


@pytest.mark.parametrize("where", ["here", "child", "aside"])
def test_highs_solves_after_a_scheduler_of_other_threads(where):
    """Before the fix, in a forked child (where programs of 2,000 variables or more are
    solved) HiGHS waited on the parent's workers, which forking does not copy: a 30-variable
    program solved in 0.02 s in a fresh child came back at its 5 s limit as a mere incumbent;
    in an Aside child (the least-peak program's) this one had no answer after 60 s. In-process,
    the fix's request for one thread is refused where a scheduler of four runs: the run must
    go on with those."""
    # its own session: a stalled child's forked children spin on, and go with it
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, where], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"HiGHS stalled {where}: no answer in 30 s")
    assert proc.returncode == 0, err[-2000:]
    status, seconds = json.loads(out.strip().splitlines()[-1])
    assert status == "optimal"
    assert seconds < 2.0  # a fraction of its 4 s limit
