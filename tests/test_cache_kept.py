"""What the profile directory keeps: a file that cannot be read is left as it is (NOTE [Files
that cannot be read]), deletions are said, temporary files of writes cut short are swept (NOTE
[Writes cut short]) and `list` says which schedules it cannot show (cache probe, 2026-12-06)."""
from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest
import torch

import monet_opt
from monet_opt import cache
from monet_opt.cache import ProfileCacheWarning
from tests import models
from tests.test_cache import HUGE, _files, _optimize, tiny
from tests.test_cli import run_cli


def _cached(root: Path):
    """tiny() optimized into `root` at two limits: a profile and two schedules there."""
    model, x = tiny()
    least = _optimize(model, x, HUGE, profile_dir=root).plan.min_feasible_bytes
    _optimize(model, x, least, profile_dir=root)
    return model, x


def test_a_profile_that_cannot_be_read_is_left_as_it_is(tmp_path):
    """A folder where profile.json should be (as a file of mode 000 is to another user): it
    was measured again and its schedules, valid, deleted; each call said it would rebuild."""
    model, x = _cached(tmp_path)
    profile, = tmp_path.glob("*/profile.json")
    profile.unlink()
    profile.mkdir()
    before = _files(tmp_path)
    for _ in range(2):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            opt = _optimize(model, x, HUGE, profile_dir=tmp_path)
        said = [str(w.message) for w in seen if w.category is ProfileCacheWarning]
        assert len(said) == 1 and "left as it is" in said[0], said
    assert _files(tmp_path) == before and profile.is_dir()
    assert opt.plan.predicted_peak_bytes <= HUGE


def test_a_profile_measured_again_says_what_it_removed(tmp_path):
    model, x = _cached(tmp_path)
    profile, = tmp_path.glob("*/profile.json")
    profile.unlink()
    with pytest.warns(ProfileCacheWarning, match=r"removed 3 schedule and least-peak file"):
        _optimize(model, x, HUGE, profile_dir=tmp_path)


def test_temporary_files_of_writes_cut_short_are_swept(tmp_path):
    model, x = _cached(tmp_path)
    folder = next(tmp_path.glob("*/profile.json")).parent
    old, young = folder / ".profile.json.abc123.tmp", folder / ".schedule-1.json.def456.tmp"
    for path in (old, young):
        path.write_text("{")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    _optimize(model, x, HUGE, profile_dir=tmp_path)  # served from the directory
    assert not old.exists() and young.exists()  # young: maybe a write in progress


def test_list_says_which_schedules_it_cannot_show(tmp_path):
    """A damaged problem file hid its schedules: `list` said "no schedules" and nothing else."""
    root = tmp_path / "profiles"
    monet_opt.optimize(models.tiny_dropout_mlp(), torch.randn(64, 8), "90% of activations",
                       profile_repeats=1, profile_dir=root)
    path, = root.glob("*/problem-*.json")
    path.write_bytes(path.read_bytes()[:100])
    code, _, err = run_cli("list", "--profile-dir", str(root))
    assert code == 0 and "1 schedule file(s) not shown" in err and "truncated" in err
    assert cache.ProfileCache(root).profiles()  # the measured profile itself is still read


def test_a_damaged_file_is_said_at_the_callers_line_and_for_what_it_is(tmp_path):
    """ProfileCacheWarning named a line of monet_opt/api.py, and a profile with bytes after its
    JSON was said to be truncated (UX probe, 2026-12-06)."""
    model, x = _cached(tmp_path)
    profile, = tmp_path.glob("*/profile.json")
    profile.write_text(profile.read_text() + "garbage")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        monet_opt.optimize(model, x, HUGE, profile_dir=tmp_path, profile_repeats=1)
    said = [w for w in seen if w.category is ProfileCacheWarning]
    assert said and all(w.filename == __file__ for w in said), [w.filename for w in said]
    assert "more after its JSON object" in str(said[0].message)
