"""`monet-opt precompute` where its --profile-dir cannot hold what it makes: refused, or a
failure where nothing (or not all) was stored."""
from __future__ import annotations

import warnings

import pytest

from monet_opt import cache
from monet_opt.cache_files import ProfileCacheWarning
from tests.test_cli import FACTORY, run_cli


def test_precompute_into_a_file_is_refused(tmp_path):
    """It warned three times, printed its results and exited 0 with nothing cached."""
    spot = tmp_path / "afile"
    spot.write_text("")
    code, _, err = run_cli("precompute", FACTORY, "--input-shape", "2x8", "--profile-dir",
                           str(spot))
    assert code == 2 and "is a file, not a directory" in err
    # under a file: "permission denied" (or, were it executable, rc 0 and nothing cached)
    code, _, err = run_cli("precompute", FACTORY, "--input-shape", "2x8", "--profile-dir",
                           str(spot / "sub"))
    assert code == 2 and f"{spot} is a file, not a directory" in err


def test_precompute_that_stored_nothing_fails(tmp_path, monkeypatch):
    """A directory that passes the checks but refuses every write (/proc/x) printed its table
    and exited 0."""
    real_write = cache._write  # a schedule's write refused, as cache_files._write warns
    monkeypatch.setattr(cache, "_write", lambda path, data: real_write(path, data) if not
                        path.name.startswith("schedule-") else warnings.warn(
                            f"{path} not cached (refused)", ProfileCacheWarning))
    with pytest.warns(ProfileCacheWarning):
        code, out, err = run_cli("precompute", FACTORY, "--input-shape", "2x8",
                                 "--profile-dir", str(tmp_path), "--limits", "5MiB")
    assert code == 2 and "5.00 MiB" in out and "1 of 1 schedules could not be stored" in err

