"""The profile directory: a second optimize() neither profiles nor solves; unusable files are
reported and rebuilt; concurrent writers leave only valid files."""
from __future__ import annotations

import dataclasses
import gc
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import monet_opt
import solvers
from monet_opt import cache, cache_files, measured
from monet_opt.cache import ProfileCache, ProfileCacheWarning
from monet_opt.cache_keys import ProfileKey
from monet_opt.lower import Lowered
from tests.problems import chain

HUGE = 1 << 40


def tiny():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    return model, torch.randn(256, 8)


class Calls:
    """Counts profiling runs and solver calls made through optimize()."""

    def __init__(self, monkeypatch):
        self.profiled = self.solved = 0
        profile, solve = measured.profile, solvers.solve

        def counted_profile(*a, **k):
            self.profiled += 1
            return profile(*a, **k)

        def counted_solve(*a, **k):
            self.solved += 1
            return solve(*a, **k)
        monkeypatch.setattr(measured, "profile", counted_profile)
        monkeypatch.setattr(solvers, "solve", counted_solve)

    def take(self) -> tuple[int, int]:
        counts, self.profiled, self.solved = (self.profiled, self.solved), 0, 0
        return counts


@pytest.fixture
def calls(monkeypatch):
    return Calls(monkeypatch)


def _optimize(model, x, limit, **kw):
    return monet_opt.optimize(model, x, limit, profile_repeats=1, **kw)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_second_call_neither_profiles_nor_solves(calls, tmp_path):
    model, x = tiny()
    least = _optimize(model, x, HUGE, profile_dir=None).plan.min_feasible_bytes
    assert calls.take() == (1, 1)
    first = _optimize(model, x, least)  # the default directory, "profiles"
    assert calls.take() == (1, 1)
    assert first.plan.recomputed_ops > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = _optimize(model, x, least)
    assert calls.take() == (0, 0)
    assert again.plan == first.plan
    # the cached plan trains like the fresh one
    grads = []
    for module in (first, again):
        model.zero_grad(set_to_none=True)
        module(x).square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    # another limit or solver option reuses the profile and solves; another shape profiles
    _optimize(model, x, least + 4096)
    assert calls.take() == (0, 1)
    _optimize(model, x, least, time_limit_s=5.0)
    assert calls.take() == (0, 1)
    _optimize(model, x[:128], HUGE)
    assert calls.take() == (1, 1)
    assert len(list(Path("profiles").glob("*/profile.json"))) == 2
    _optimize(model, x, least, profile_dir=None)
    assert calls.take() == (1, 1)


def test_only_profiling_and_solving_run_with_the_collector(monkeypatch, tmp_path):
    """NOTE [Tracing without the collector]: inside the trace the collector is on while the
    profiler and the solver run (as it was outside), off while cached files are read; after
    optimize() it is as it was."""
    seen = {"profile": [], "solve": [], "read": []}
    for owner, name, key in ((measured, "profile", "profile"), (solvers, "solve", "solve"),
                             (cache, "_read_profile", "read"), (cache, "_read_schedule", "read")):
        real = getattr(owner, name)

        def spy(*a, _real=real, _key=key, **k):
            seen[_key].append(gc.isenabled())
            return _real(*a, **k)
        monkeypatch.setattr(owner, name, spy)
    model, x = tiny()
    assert gc.isenabled()
    _optimize(model, x, HUGE, profile_dir=tmp_path)
    _optimize(model, x, HUGE, profile_dir=tmp_path)
    assert seen["profile"] == [True] and seen["solve"] == [True]
    assert len(seen["read"]) == 2 and not any(seen["read"])
    assert gc.isenabled()
    gc.disable()
    try:  # a collector the caller paused stays paused throughout
        _optimize(model, x, HUGE + 1, profile_dir=tmp_path)
        assert seen["solve"] == [True, False] and not gc.isenabled()
    finally:
        gc.enable()


def test_infeasible_answer_is_cached_too(calls):
    model, x = tiny()
    for expected in ((1, 1), (0, 0)):
        with pytest.raises(monet_opt.InfeasibleBudgetError) as info:
            _optimize(model, x, 1000)
        assert calls.take() == expected
        assert info.value.min_feasible_bytes > 1000


def test_fingerprint_sees_shapes_not_values():
    model, x = tiny()
    other, _ = tiny()
    with torch.no_grad():
        other[0].weight.add_(1.0)
    _optimize(model, x, HUGE)
    _optimize(other, x, HUGE)
    _optimize(model, torch.randn(256, 8), HUGE)
    assert len(list(Path("profiles").iterdir())) == 1
    _optimize(model, x[:64], HUGE)
    assert len(list(Path("profiles").iterdir())) == 2


def _truncate(path: Path) -> None:
    path.write_text(path.read_text()[: path.stat().st_size // 2])


def _garble(path: Path) -> None:
    path.write_bytes(b'{"kind": "monet_opt.profile", \x00\xff garbage ]]')


def _edit(change, sign=True):
    """A file edited as our writer would write it (signed: the checks past the checksum are
    what is tested), or by hand (`sign` False)."""
    def run(path: Path) -> None:
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(cache_files.signed(data) if sign else data))
    return run


def _rewire_first_backward_op(data):
    ops = data["problem"]["ops"]
    op = next(o for o in ops if o["is_backward"] and len(o["inputs"]) > 1)
    op["inputs"] = op["inputs"][:-1]


class Direct:
    """The cache without a model: a chain problem as the 'lowered graph', counting how often
    it is measured and solved."""

    def __init__(self, calls: Calls) -> None:
        self.problem = chain(8, size=10, fixed=100)
        self.lowered = Lowered(self.problem, op_nodes=(), tensor_nodes=(), view_nodes=frozenset(),
                               fixed_nodes=frozenset(),
                               op_labels=tuple(f"op {i}" for i in range(len(self.problem.ops))))
        self.key = ProfileKey("0" * 64, "float32[4x8]", "cpu: test", torch.__version__,
                              (("repeats", 1),))
        self.cache, self.calls, self.measured, self.runs = ProfileCache("profiles"), calls, 0, 0

    def measure(self):
        """A new measurement: the same graph, other times."""
        self.measured += 1
        self.runs += 1
        ops = tuple(dataclasses.replace(op, time_s=op.time_s * (1 + self.runs / 10))
                    for op in self.problem.ops)
        return dataclasses.replace(self.problem, ops=ops)

    def profile(self):
        return self.cache.profile(self.key, "Chain", self.lowered, self.measure)

    def solve(self, limit):
        return self.cache.solve(self.profile(), limit, "auto", 30.0)

    def take(self) -> tuple[int, int]:
        counts = (self.measured, self.calls.take()[1])
        self.measured = 0
        return counts


@pytest.fixture
def direct(calls):
    return Direct(calls)


PROFILE_DAMAGE = {
    "truncated": (_truncate, "truncated"),
    "empty": (lambda p: p.write_text(""), "truncated"),
    # a RecursionError out of json.loads, through optimize() and `monet-opt list`
    "nested too deeply": (lambda p: p.write_text("[" * 100000 + "]" * 100000), "nested too"),
    "corrupt": (_garble, "corrupt"),
    "plain text": (lambda p: p.write_text("garbage"), "corrupt: not valid JSON"),  # "truncated"
    "foreign version": (_edit(lambda d: d.update(schema_version=99)), "schema version 99"),
    "foreign kind": (_edit(lambda d: d.update(kind="something.else")), "not a monet_opt.profile"),
    "other key": (_edit(lambda d: d["key"].update(device="cuda: elsewhere")),
                  "mismatched: its key has device"),
    "other graph": (_edit(_rewire_first_backward_op), "mismatched: op #"),
    "older lowering": (_edit(lambda d: d["problem"]["ops"][1].update(overwrites=[0])),
                       "made by another monet_opt: op #1"),
    "malformed problem": (_edit(lambda d: d["problem"].pop("ops")), "malformed"),
    # passed every check below: a hand-edited time or fixed size was taken as measured
    "edited by hand": (_edit(lambda d: d["problem"].update(fixed_bytes=10**9), sign=False),
                       "edited or damaged"),
    "wrong label count": (_edit(lambda d: d["op_labels"].pop()), "malformed"),
    # NOTE [Numbers a problem may hold]: a NaN time hung HiGHS, 1e300 overflowed a solver
    "nan time": (_edit(lambda d: d["problem"]["ops"][0].update(time_s=float("nan"))), "absurd"),
    "huge time": (_edit(lambda d: d["problem"]["ops"][0].update(time_s=1e300)), "absurd"),
    "inf workspace": (_edit(lambda d: d["problem"]["ops"][0].update(
        workspace_bytes=float("inf"))), "absurd"),
    # int("...") refuses over 4,300 digits: a bare ValueError out of optimize() and `list`
    "a number of 5,000 digits": (lambda p: p.write_text(p.read_text().replace(
        '"fixed_bytes": ', '"fixed_bytes": ' + "9" * 5000, 1)), "a number in it cannot be read"),
}


@pytest.mark.parametrize("damage", PROFILE_DAMAGE)
def test_unusable_profile_is_reported_and_rebuilt(damage, direct):
    direct.solve(25)
    assert direct.take() == (1, 1)
    path, = Path("profiles").glob("*/profile.json")
    spoil, reason = PROFILE_DAMAGE[damage]
    spoil(path)
    with pytest.warns(ProfileCacheWarning, match=re.escape(str(path)) + ".*" + reason):
        direct.profile()
    assert direct.take() == (1, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert direct.profile().problem.ops[0].time_s == direct.problem.ops[0].time_s * 1.2
        direct.solve(25)
    assert direct.take() == (0, 1)  # the old measurement's schedule was dropped with it


def _claim(field, delta):
    return _edit(lambda d: d["result"].update({field: d["result"][field] + delta}))


def _drop_backward_step(data):
    data["schedule"]["backward"] = data["schedule"]["backward"][1:]


SCHEDULE_DAMAGE = {
    "truncated": (_truncate, "truncated"),
    "nested too deeply": (lambda p: p.write_text("[" * 100000 + "]" * 100000), "nested too"),
    "foreign version": (_edit(lambda d: d.update(schema_version=0)), "schema version 0"),
    "fails the simulator": (_edit(_drop_backward_step), "fails the simulator"),
    "wrong peak": (_claim("peak_bytes", -8), "mismatched: it claims peak"),
    "wrong time": (_claim("objective_s", 1.0), "mismatched: it claims peak"),
    "bad status": (_edit(lambda d: d["result"].update(status="splendid")), "malformed"),
    "edited by hand": (_edit(lambda d: d["result"].update(solve_time_s=0.5), sign=False),
                       "edited or damaged"),
    # explain() raised on the gap; the least peak and the time were shown as real
    "gap not a number": (_edit(lambda d: d["result"].update(gap="x")), "malformed: facts"),
    "absurd least peak": (_edit(lambda d: d["result"].update(min_feasible_bytes=1)),
                          "malformed: facts"),
    "negative solve time": (_edit(lambda d: d["result"].update(solve_time_s=-5.0)),
                            "malformed: facts"),
    # read as a proven refusal of a limit its own first solve fitted
    "feasible without a schedule": (_edit(lambda d: d.update(schedule=None)),
                                    "(optimal|feasible) without a schedule"),
    "unknown variant": (_edit(lambda d: d["schedule"].update(variants=[99])),
                        "fails the simulator"),
    "other limit": (_edit(lambda d: d["key"].update(memory_limit_bytes=7)),
                    "mismatched: its key has memory_limit_bytes"),
}


@pytest.mark.parametrize("damage", SCHEDULE_DAMAGE)
def test_unusable_schedule_is_reported_and_resolved(damage, direct):
    least = solvers.solve(direct.problem, HUGE).min_feasible_bytes
    direct.take()
    first = direct.solve(least)
    assert direct.take() == (1, 1) and first.schedule is not None
    path, = Path("profiles").glob(f"*/schedule-{least}-*.json")
    spoil, reason = SCHEDULE_DAMAGE[damage]
    spoil(path)
    with pytest.warns(ProfileCacheWarning, match=re.escape(str(path)) + ".*" + reason):
        again = direct.solve(least)
    assert direct.take() == (0, 1)
    assert again.schedule == first.schedule
    assert direct.solve(least) == again
    assert direct.take() == (0, 0)


def test_a_damaged_least_peak_file_is_removed_and_written_again(direct):
    """A schedule served from its own file runs no solve, so a damaged least-peak file was
    reported as "rebuilt" at every call and stayed damaged: it is removed, reported once, and
    the next solve writes it again."""
    least = solvers.solve(direct.problem, HUGE).min_feasible_bytes
    direct.solve(HUGE)
    direct.solve(least)
    floor, = Path("profiles").glob("*/least-peak-*.json")
    _truncate(floor)
    with pytest.warns(ProfileCacheWarning, match=re.escape(str(floor)) + ".*truncated.*removed"):
        direct.solve(HUGE)
    assert not floor.exists()
    direct.take()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        direct.solve(least)
        assert direct.take() == (0, 0)  # served from its file, nothing reported again
        direct.solve(least + 1)
    assert direct.take() == (0, 1) and cache._read_floor(floor, direct.profile())[0] == least


def test_schedule_over_its_limit_is_refused(direct):
    least = solvers.solve(direct.problem, HUGE).min_feasible_bytes
    direct.solve(HUGE)
    direct.solve(least)
    # plant the store-all schedule's file under the tight limit's name
    loose, = Path("profiles").glob(f"*/schedule-{HUGE}-*.json")
    tight, = Path("profiles").glob(f"*/schedule-{least}-*.json")
    data = json.loads(loose.read_text())
    data["key"]["memory_limit_bytes"] = least
    tight.write_text(json.dumps(cache_files.signed(data)))
    direct.take()
    with pytest.warns(ProfileCacheWarning, match=f"above its limit {least} B"):
        result = direct.solve(least)
    assert result.peak_bytes <= least and direct.take() == (0, 1)


def test_damaged_files_never_break_optimize(calls):
    model, x = tiny()
    _optimize(model, x, HUGE)
    profile, = Path("profiles").glob("*/profile.json")
    schedule, = Path("profiles").glob("*/schedule-*.json")
    _garble(schedule)
    _truncate(profile)
    calls.take()
    with pytest.warns(ProfileCacheWarning, match="truncated"):
        opt = _optimize(model, x, HUGE)
    assert calls.take() == (1, 1)
    # the garbled schedule was made on the old measurement: deleted with it
    names = sorted(p.name for p in _files(Path("profiles")))
    assert names[:2] == ["least-peak-auto.json", "profile.json"] and len(names) == 3
    assert names[2].startswith("schedule-") and schedule.name not in names
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = _optimize(model, x, HUGE)
    assert calls.take() == (0, 0) and again.plan == opt.plan


def test_unwritable_directory_warns_and_still_optimizes():
    model, x = tiny()
    Path("blocked").write_text("a file where the directory should be")
    with pytest.warns(ProfileCacheWarning, match="cannot write"):
        opt = _optimize(model, x, HUGE, profile_dir="blocked")
    assert opt.plan.predicted_peak_bytes <= HUGE


def test_a_schedule_from_other_solver_code_is_solved_again(direct, monkeypatch):
    """The schedule key's library version carries a digest of solvers/'s source: after the
    solvers change (same package version), cached schedules are not served."""
    from monet_opt import cache, cache_keys
    assert "+solvers." in cache_keys.library_version()
    direct.solve(25)
    assert direct.take() == (1, 1)
    direct.solve(25)
    assert direct.take() == (0, 0)
    monkeypatch.setattr(cache, "library_version", lambda: "0.1.0+solvers.000000000000")
    direct.solve(25)
    assert direct.take() == (0, 1)


def test_a_limit_too_long_for_a_file_name_is_solved_uncached(direct):
    """optimize(model, x, 10**300) raised OSError "File name too long" with a profile
    directory (the limit is in the schedule's file name)."""
    result = direct.solve(10 ** 300)
    assert result.feasible and direct.take() == (1, 1)
    assert not list(Path("profiles").glob("*/schedule-*.json"))
