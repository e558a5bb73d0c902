"""What `monet-opt bench` prints as it goes."""
from __future__ import annotations

from monet_opt.bench import results, run


def test_a_point_not_planned_is_said(tmp_path, capsys):
    """Points below the least peak (or failing) were in bench.json and bench.md only."""
    argv = ["--models", "tiny_cnn", "--quick", "--out", str(tmp_path), "--solvers", "auto",
            "--limits", "1", "--compile-budgets", "none", "--rounds", "1", "--no-merge"]
    assert run.main(argv) == 0
    point = next(p for p in results.load(tmp_path / results.JSON_NAME)["tiny_cnn"].points
                 if p.family == "ours")
    assert point.status == "infeasible"
    said = [line for line in capsys.readouterr().out.splitlines() if "infeasible" in line]
    assert said and said[0].split() == ["monet_opt", "auto", point.setting, "infeasible:",
                                         *point.note.split()], said
