"""`bench-solvers --near-floor`: every solver at the least peak "auto" reports and a little
above it, where the least peak is known to each solve as an earlier call's."""
from __future__ import annotations

import io
import re

import pytest

import solvers
from monet_opt import bench_solvers


def test_near_floor_solves_every_budget_from_the_least_peak_up():
    out = io.StringIO()
    bench_solvers.near_floor("tiny_cnn", 2.0, out, ("auto", "milp"), {"batch": 2}, repeats=2)
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1]
            for line in out.getvalue().splitlines() if line.startswith("| auto") or
            line.startswith("| milp")}
    assert set(rows) == {"auto", "milp"}
    for solver, cells in rows.items():
        assert len(cells) == len(bench_solvers.NEAR_FLOOR)
        for cell in cells:
            runs = [r.strip() for r in cell.split(",")]
            # the least peak reported is met again (NOTE [Least peaks remembered]), so
            # every budget from it up has a schedule, each solve's overhead printed
            assert len(runs) == 2 and all(re.fullmatch(r"[+-]\d+\.\d%", r) for r in runs), \
                (solver, cell)
    assert re.search(r"Least peak \d+\.\d MiB", out.getvalue())


def test_a_negative_count_of_solves_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench_solvers.main(["--near-floor", "-1", "--models", "tiny_cnn"])
    assert "at least 1, got -1" in capsys.readouterr().err


def test_bounds_hold_under_what_auto_finds_at_each_share():
    # two budgets a third and two thirds of the way from the least peak to store-all, and one
    # under it (at 70 % of the activations, tiny_cnn's least is above once scratch is counted)
    problem, floor, act, _ = bench_solvers.lowered("tiny_cnn", io.StringIO(), {"batch": 2})
    least = solvers.solve(problem, floor, "auto", time_limit_s=2.0).min_feasible_bytes
    above = (least - floor) / act
    shares = (above + 2 * (1 - above) / 3, above + (1 - above) / 3, 0.25)
    assert shares[-1] < above
    out = io.StringIO()
    bench_solvers.bounds("tiny_cnn", 2.0, out, {"batch": 2}, shares=shares)
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.getvalue().splitlines()
            if line.startswith("| ") and "MiB (" in line]
    assert [r[0].split(" (")[1] for r in rows] == [f"{s:.0%})" for s in shares]
    numbers = [r for r in rows if r[1] != "infeasible"]
    assert len(numbers) >= 2, out.getvalue()
    for limit, bound, found, own, gap, _ in numbers:
        # a bound holds for every schedule, auto's included: auto is never below either
        assert re.fullmatch(r"[+-]\d+\.\d%", bound) and re.fullmatch(r"[+-]\d+\.\d%", found)
        assert re.fullmatch(r"[+-]\d+\.\d%", own)
        assert float(found[:-1]) >= max(float(bound[:-1]), float(own[:-1])) - 0.05, \
            (limit, bound, own, found)
        assert float(gap[:-1]) >= 0.0
    # where the bound proves no schedule fits, auto finds none either
    assert rows[-1][1:3] == ["infeasible", "infeasible"], rows[-1]


def test_near_floor_takes_its_budgets_above_the_least_peak(capsys):
    out = io.StringIO()
    bench_solvers.near_floor("tiny_cnn", 2.0, out, ("auto",), {"batch": 2}, repeats=1,
                             above=(0.0, 0.013))
    assert "| solver | least | least +1.3% |" in out.getvalue()
    with pytest.raises(SystemExit):
        bench_solvers.main(["--near-floor", "1", "--above", "0,-0.1", "--models", "tiny_cnn"])
    assert "at or above the least peak" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_solvers.main(["--near-floor", "1", "--above", "two", "--models", "tiny_cnn"])
    assert "got 'two'" in capsys.readouterr().err
