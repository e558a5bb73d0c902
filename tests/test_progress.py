"""NOTE [Progress]: optimize() tells the `monet_opt` logger what it does, and what it read from
the profile directory instead. (pytest's logging plugin is off here: a handler of our own.)"""
from __future__ import annotations

import contextlib
import logging

import monet_opt
from tests import limits, models


@contextlib.contextmanager
def told(level: int):
    """The messages the `monet_opt` logger passes at `level`, while the block runs."""
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("monet_opt")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield said
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def test_each_phase_is_logged_and_what_the_directory_served(tmp_path):
    model, x, _ = models.small_cnn()
    share = limits.share_between(model, x)  # NOTE [Limits between the least peak and store-all]
    with told(logging.INFO) as said:
        first = monet_opt.optimize(model, x, share, profile_repeats=1,
                                   time_limit_s=3, profile_dir=tmp_path)
    assert [m.split(": ")[1].split(" ")[0] for m in said] == \
        ["tracing", "profiling", "profiled", "solving", "plan"], said
    limit = monet_opt.format_bytes(first.plan.memory_limit_bytes)
    assert "float32[4x3x16x16]" in said[0]
    assert f"solving for {limit} with 'auto' (up to 3 s)" in said[3]
    assert f"of {limit}" in said[4] and first.plan.solver in said[4]
    assert "profile directory" not in said[4] and ", solved in " in said[4]
    with told(logging.INFO) as said:
        monet_opt.optimize(model, x, share, profile_repeats=1, time_limit_s=3,
                           profile_dir=tmp_path)
    assert len(said) == 2 and said[1].endswith("profile and schedule from the profile directory")
    assert ", solved before, in " in said[1]  # it read "(optimal, 2.6 s)" as if solved now


def test_silent_unless_asked():
    model, x, _ = models.small_cnn()
    with told(logging.WARNING) as said:
        monet_opt.optimize(model, x, 1 << 40, profile_repeats=1, profile_dir=None)
    assert said == []


def test_a_step_traced_for_its_sizes_says_so():
    model, x, _ = models.small_cnn()
    with told(logging.INFO) as said:
        monet_opt.lower_problem(model, x, timed=False)
    assert "profiling" not in " ".join(said) and said[-1].endswith("sizes only, not profiled")
