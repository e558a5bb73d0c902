"""`monet-opt list | explain` (monet_opt/listing.py) against what optimize() would serve."""
from __future__ import annotations

from pathlib import Path

from monet_opt import cache
from tests.test_cli import precompute, run_cli


def _listed_rows(root: Path) -> tuple[list[str], str]:
    code, out, err = run_cli("list", "--profile-dir", str(root))
    assert code == 0 and err == ""
    return [line for line in out.splitlines() if " auto" in line], out


def test_schedules_other_solvers_made_are_not_listed(tmp_path, monkeypatch):
    """A schedule another version of the solvers made is not served (its key names that
    version): list showed it beside the one solved again, two rows for one limit."""
    root = tmp_path / "profiles"
    with monkeypatch.context() as m:
        m.setattr(cache, "library_version", lambda: "0.0.1+solvers.000000000000")
        precompute(root, "64x8", "--limits", "1MiB")
    rows, out = _listed_rows(root)
    assert rows == [] and "no schedules" in out
    assert "1 schedule file(s) made by another version of the solvers not shown" in out
    precompute(root, "64x8", "--limits", "1MiB")
    assert len(list(root.glob("*/schedule-1048576-*.json"))) == 2
    rows, out = _listed_rows(root)
    assert len(rows) == 1 and "1048576" in rows[0] and "1 schedule file(s)" in out
