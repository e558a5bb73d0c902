"""The CLI at its edges: list and explain (monet_opt/listing.py) against what optimize() would
serve, profile directories that cannot be one, inputs and limits past what a machine holds."""
from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import monet_opt
from monet_opt import cache, cli, units
from tests.test_cli import FACTORY, precompute, run_cli


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


def test_a_profile_dir_that_is_a_file_or_a_dead_link_is_said_so(tmp_path):
    """list said "no profile directory at FILE/ (precompute ... makes one)", which precompute
    then refused; precompute into a link to an unmounted share profiled and solved, then
    failed to store; largest-batch into a file exited 0 after 15 raw warnings."""
    afile, dead = tmp_path / "afile", tmp_path / "share"
    afile.write_text("")
    dead.symlink_to(tmp_path / "unmounted")
    for spot, said in ((afile, "is a file, not a directory"), (dead, "which does not exist")):
        for argv in (("list",), ("explain", "Sequential"),
                     ("precompute", FACTORY, "--input-shape", "2x8"),
                     ("largest-batch", FACTORY, "--input-shape", "2x8", "--limit", "1MiB")):
            code, out, err = run_cli(*argv, "--profile-dir", str(spot))
            assert code == 2 and said in err and out == "", (argv, err)


def test_a_profile_dir_in_an_unknown_users_home_is_said_so():
    """"~nosuchuser/x" printed Path.expanduser's traceback from every subcommand and reached
    optimize()'s caller as a bare RuntimeError."""
    spot = "~monet-opt-no-such-user/profiles"
    for argv in (("list",), ("explain", "Sequential"),
                 ("precompute", FACTORY, "--input-shape", "2x8")):
        code, out, err = run_cli(*argv, "--profile-dir", spot)
        assert code == 2 and "which this machine does not know" in err and out == "", argv
    with pytest.raises(ValueError, match="home of '~monet-opt-no-such-user'"):
        monet_opt.optimize(nn.Linear(2, 2), torch.randn(1, 2), 1 << 30, profile_dir=spot)


def test_explain_needs_a_profile_name(tmp_path):
    """An empty name matched the only profile as a prefix."""
    root = tmp_path / "profiles"
    precompute(root, "64x8", "--limits", "1MiB")
    code, _, err = run_cli("explain", "", "--profile-dir", str(root))
    assert code == 2 and "give a profile's folder name" in err


def test_a_limit_past_what_a_file_name_holds_is_solved_not_stored(tmp_path):
    """precompute printed its feasible row, then exited 2: '1 of 1 schedules could not be
    stored (the warnings above say why)', with no warnings above."""
    out = precompute(tmp_path / "profiles", "64x8", "--limits", str(2 ** 64))
    assert "18446744073709551616" in out and " auto" in out


def test_ctrl_c_and_an_unknown_solver_are_said_in_one_line(tmp_path, monkeypatch):
    """Ctrl-C printed a KeyboardInterrupt traceback; explain --solver nosuch said 'no cached
    nosuch schedule ... precompute it'."""
    from monet_opt import precompute as precompute_module

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(precompute_module, "build", interrupted)
    code, _, err = run_cli("precompute", FACTORY, "--input-shape", "2x8", "--profile-dir",
                           str(tmp_path))
    assert code == 130 and err == "monet-opt precompute: interrupted\n"
    with pytest.raises(SystemExit) as exit_:
        run_cli("explain", "Seq", "--solver", "nosuch", "--profile-dir", str(tmp_path))
    assert exit_.value.code == 2


@pytest.mark.parametrize("raised, code, said", [
    (BrokenPipeError(), 141, ""),  # the reader left: precompute stored nothing, said 0
    (PermissionError(13, "Permission denied", "locked/sub"), 1,
     "monet-opt precompute: error: Permission denied: locked/sub\n")])
def test_a_precompute_that_cannot_finish_says_so(tmp_path, monkeypatch, raised, code, said):
    """CLI probe, 2026-12-07: `precompute ... 2>&1 | head -1` exited 0 with no schedule
    stored; an unreadable profile directory ended in a traceback."""
    from monet_opt import precompute as precompute_module

    def failing(args):
        raise raised
    monkeypatch.setattr(precompute_module, "build", failing)
    got, _, err = run_cli("precompute", FACTORY, "--input-shape", "2x8", "--profile-dir",
                          str(tmp_path))
    assert (got, err) == (code, said)


def test_a_solver_that_makes_one_schedule_is_not_told_to_search_longer(tmp_path):
    """It was told a longer --time-limit-s may find one (CLI probe, 2026-12-07)."""
    out = precompute(tmp_path, "4x8", "--limits", "50% of activations", "--solver",
                     "store_all")
    assert "--solver auto may find one" in out and "store_all makes one schedule" in out
    assert "--time-limit-s" not in out


def test_a_schedule_file_under_another_name_is_not_listed_as_another_limit(tmp_path):
    """A copy named for 2 MiB was listed again (the limit its key holds); the name is its
    key's."""
    root = tmp_path / "profiles"
    precompute(root, "64x8", "--limits", "1MiB")
    path, = root.glob("*/schedule-1048576-*.json")
    path.with_name(path.name.replace("1048576", "2097152")).write_bytes(path.read_bytes())
    code, out, err = run_cli("list", "--profile-dir", str(root))
    assert code == 0 and len([line for line in out.splitlines() if " auto" in line]) == 1
    assert "schedule-2097152" in err and "its key names it" in err


def test_an_input_shape_past_memory_is_said_in_one_line(tmp_path):
    """The allocator's RuntimeError came with a traceback."""
    code, _, err = run_cli("precompute", FACTORY, "--input-shape", "100000000x100000000",
                           "--profile-dir", str(tmp_path))
    assert code == 2 and "could not be allocated here" in err and "GiB" in err


def test_precompute_says_what_it_read_from_the_directory(tmp_path):
    """Run again, it said 'profiled in 0.5 s' and gave the first run's solve time, though it
    read both from the directory."""
    root = tmp_path / "profiles"
    first = precompute(root, "64x8", "--limits", "1MiB")
    assert "profiled in" in first and " cached" not in first
    again = precompute(root, "64x8", "--limits", "1MiB")
    assert "read from the directory in" in again and " cached" in again


def test_the_profile_directorys_warnings_are_printed_in_one_line():
    """precompute's and largest-batch's came out as Python prints them: file, line, source."""
    import warnings

    from monet_opt import cli
    from monet_opt.cache_files import ProfileCacheWarning
    said = ProfileCacheWarning("monet_opt profile directory: cannot write x; not cached.")
    assert cli._one_line(said, ProfileCacheWarning, "api.py", 330) == \
        "monet-opt: warning: monet_opt profile directory: cannot write x; not cached.\n"
    assert "api.py:330" in cli._one_line(UserWarning("y"), UserWarning, "api.py", 330)
    before = warnings.formatwarning
    run_cli("list", "--profile-dir", "no-such-directory")
    assert warnings.formatwarning is before


def test_largest_batch_within_max_batch_and_the_models_errors_as_precompute_says_them(tmp_path):
    """--max-batch below the --input-shape's batch was refused ("start=64, max_batch=2"),
    though the API takes it; a model with nothing to train was a usage error (exit 2) where
    precompute says NoBackwardError (exit 1). Ops probe, 2026-12-05."""
    root = str(tmp_path / "profiles")
    code, out, err = run_cli("largest-batch", FACTORY, "--input-shape", "64x8", "--limit",
                             "64MiB", "--max-batch", "2", "--profile-dir", root,
                             "--time-limit-s", "5")
    assert code == 0 and "largest batch 2" in out, err
    code, _, err = run_cli("largest-batch", "torch.nn:Identity", "--input-shape", "2x8",
                           "--limit", "1MiB", "--profile-dir", root)
    assert code == 1 and "NoBackwardError" in err, err


def test_list_tells_apart_a_limit_solved_under_two_time_limits(tmp_path):
    """One limit precomputed with --time-limit-s 5 and solved again under another time limit
    (optimize()'s default is 30 s) was listed as two identical rows."""
    root = tmp_path / "profiles"
    precompute(root, "64x8", "--limits", "1MiB")
    precompute(root, "64x8", "--limits", "1MiB", "--time-limit-s", "6")
    code, out, _ = run_cli("list", "--profile-dir", str(root))
    rows = [line for line in out.splitlines() if " 1048576 " in line]
    assert code == 0 and len(rows) == 2 and "time limit" in out
    assert sorted(row.split()[5:7] for row in rows) == [["5", "s"], ["6", "s"]], rows


def test_an_infinite_solver_time_is_refused(tmp_path):
    """--time-limit-s inf passed, profiled, then crashed in HiGHS's poll."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as raised:
        cli.main(["precompute", FACTORY, "--input-shape", "2x8", "--time-limit-s", "inf",
                  "--profile-dir", str(tmp_path)])
    assert raised.value.code == 2 and "above 0, got 'inf'" in err.getvalue()


def test_the_cli_says_only_what_was_wrong(tmp_path):
    """--profile-repeats 0 was told with --time-limit-s beside it; a limit under 1 KiB was said
    "999 B (999 B)"; `python -m monet_opt` had no __main__."""
    code, _, err = run_cli("precompute", FACTORY, "--input-shape", "2x8", "--profile-dir",
                           str(tmp_path), "--profile-repeats", "0")
    assert code == 2 and "--profile-repeats must be at least 1, not 0" in err
    assert "time-limit-s" not in err
    assert units.exact_bytes(999) == "999 B"
    assert units.exact_bytes(4096) == "4.00 KiB (4096 B)"
    done = subprocess.run([sys.executable, "-m", "monet_opt", "list", "--profile-dir",
                           str(tmp_path / "none")], capture_output=True, text=True)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_limits_asked_as_the_same_bytes_are_solved_once(tmp_path):
    """`--limits 1MiB,1048576` said "solving 2/2" of a limit it did not solve, and both rows
    "cached", though one was solved in that run (API probe, 2026-12-06)."""
    code, out, err = run_cli("precompute", FACTORY, "--input-shape", "64x8", "--profile-dir",
                             str(tmp_path / "profiles"), "--profile-repeats", "1",
                             "--time-limit-s", "5", "--limits", "1MiB,1048576")
    assert code == 0, err
    assert "solving 1/1" in err and "solving 2/" not in err
    rows = [line for line in out.splitlines() if "1048576" in line]
    assert len(rows) == 2 and not any("cached" in row for row in rows)


def test_explain_says_which_of_a_limits_schedules_it_prints(tmp_path):
    """One limit solved under two time limits: `explain PROFILE LIMIT` printed one without
    saying which, and `explain PROFILE` listed them without the columns' names (API probe)."""
    root = tmp_path / "profiles"
    for seconds in ("5", "4"):
        code, _, err = run_cli("precompute", FACTORY, "--input-shape", "64x8", "--profile-dir",
                               str(root), "--profile-repeats", "1", "--time-limit-s", seconds,
                               "--limits", "1MiB")
        assert code == 0, err
    folder, = (p.name for p in root.iterdir() if p.is_dir())
    code, out, err = run_cli("explain", folder, "--profile-dir", str(root))
    assert code == 0, err
    assert "time limit" in out and "overhead" in out
    code, out, err = run_cli("explain", folder, "1048576", "--profile-dir", str(root))
    assert code == 0, err
    assert "the fastest of 2 schedules cached at this limit" in out


def test_a_small_fraction_is_said_as_optimize_takes_it():
    """--fractions 1e-9 was said "0% of activations", a limit optimize() refuses."""
    from argparse import Namespace

    from monet_opt.precompute import requested_limits
    for share, said in requested_limits(Namespace(limits=None, fractions="1e-9,0.333")):
        assert units.parse_limit(said) == share, said


def test_explain_of_a_damaged_profile_says_it_could_not_be_read(tmp_path):
    """It warned the profile was skipped, then said "no profile" of a folder that is there."""
    root = tmp_path / "profiles"
    precompute(root, "64x8", "--limits", "1MiB")
    folder, = (p for p in root.iterdir() if p.is_dir())
    (folder / "profile.json").write_text("garbage")
    code, _, err = run_cli("explain", folder.name, "--profile-dir", str(root))
    assert code == 2 and "that could be read" in err, err


def test_a_profile_an_older_profiler_made_is_listed_as_not_read(tmp_path, monkeypatch):
    """It was listed as a current one, its revision only among the options: optimize() does
    not read it (its key names that revision)."""
    from monet_opt import api, profiler
    root = tmp_path / "profiles"
    with monkeypatch.context() as m:
        m.setattr(api, "PROFILER_REVISION", profiler.PROFILER_REVISION - 1)
        precompute(root, "64x8", "--limits", "1MiB")
    _, out = _listed_rows(root)
    assert f"made by profiler revision {profiler.PROFILER_REVISION - 1}, not this one's" in out
