"""The profile directory's entries as read back: profiles, schedules and least-peak files,
each checked before use (NOTE [Cache files are untrusted] in monet_opt/cache.py)."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from monet_opt.cache_checks import Unusable, check_key, check_result, check_structure, simulated
from monet_opt.cache_files import _load
from monet_opt.cache_keys import ProfileKey, ScheduleKey
from solvers import Problem, Schedule, SolveResult, Status

PROFILE_KIND, SCHEDULE_KIND = "monet_opt.profile", "monet_opt.schedule"
FLOOR_KIND, PROBLEM_KIND = "monet_opt.least_peak", "monet_opt.problem"


@dataclass(frozen=True)
class Profile:
    """A profile in the directory. folder: where it and its schedules live. derived: the
    problem is not the measured one but made from it (`derived()`). stored: False where its
    file cannot be read: measured anew, it and its schedules are not written (NOTE [Files
    that cannot be read] in monet_opt/cache.py)."""

    key: ProfileKey
    name: str
    problem: Problem
    op_labels: tuple[str, ...]
    folder: Path
    derived: bool = False
    stored: bool = True  # False: its file could not be read, so nothing of it is written

    @functools.cached_property  # every schedule's key and check reads it; the problem is frozen
    def content_sha256(self) -> str:
        return hashlib.sha256(self.problem.to_json().encode()).hexdigest()


def derived(profile: Profile, problem: Problem) -> Profile:
    """`profile` solving `problem`, made from its measured one (a step with gradients in
    place: NOTE [Gradients resident at the start] in monet_opt/accumulate.py). Its schedules
    are keyed by the problem's content, as every schedule is, and its least peak is stored
    apart."""
    if problem is profile.problem:
        return profile
    return dataclasses.replace(profile, problem=problem, derived=True)


@dataclass(frozen=True)
class CachedSchedule:
    key: ScheduleKey
    result: SolveResult
    path: Path


_RESULT_FIELDS = ("solver", "objective_s", "peak_bytes", "bound_s", "gap", "solve_time_s",
                  "min_feasible_bytes", "note")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", name).strip("._") or "model"


def _read_profile(path: Path, folder: Path, key: ProfileKey | None,
                  fresh: Problem | None = None) -> Profile:
    """The profile in `path`, checked against `key` and (if given) the freshly lowered graph."""
    data = _load(path, PROFILE_KIND)
    try:
        stored = ProfileKey.from_dict(data["key"])
        check_key(data["key"], stored.to_dict() if key is None else key.to_dict())
        if not folder.name.endswith(f"-{stored.digest[:16]}"):
            raise Unusable(f"mismatched: its key's digest {stored.digest[:16]} is not in the "
                            f"folder name {folder.name!r}")
        problem = Problem.from_dict(data["problem"])
        labels = tuple(str(s) for s in data["op_labels"])
        name = str(data["name"])
    except Unusable:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Unusable(f"malformed ({type(exc).__name__}: {exc})") from exc
    if len(labels) != len(problem.ops):
        raise Unusable(f"malformed: {len(labels)} op labels for {len(problem.ops)} ops")
    if fresh is not None:
        check_structure(problem, fresh)
    return Profile(stored, name, problem, labels, folder)


def _read_schedule(path: Path, profile: Profile, key: ScheduleKey | None) -> CachedSchedule:
    data = _load(path, SCHEDULE_KIND)
    try:
        stored = ScheduleKey.from_dict(data["key"])
        check_key(data["key"], stored.to_dict() if key is None else key.to_dict())
        if stored.profile_sha256 != profile.content_sha256:
            raise Unusable("mismatched: it was made on another profile")
        name = f"schedule-{stored.memory_limit_bytes}-{_safe(stored.solver)}-{stored.digest[:12]}"
        if path.name != name + ".json":  # renamed or copied: listed as another limit's
            raise Unusable(f"mismatched: its key names it {name}.json")
        facts = data["result"]
        schedule = None if data["schedule"] is None else \
            Schedule.from_json(json.dumps(data["schedule"]))
        result = SolveResult(**{f: facts[f] for f in _RESULT_FIELDS},
                             status=Status(facts["status"]), schedule=schedule)
    except Unusable:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Unusable(f"malformed ({type(exc).__name__}: {exc})") from exc
    check_result(result, profile.problem, stored.memory_limit_bytes)
    return CachedSchedule(stored, result, path)


def _read_floor(path: Path, profile: Profile) -> tuple[int, Schedule] | None:
    """The least-peak schedule stored in `path` and its peak, checked by the simulator; None
    where it is of another profile of the same key, which a caller sharing the directory wrote
    (two DDP ranks profiling one model at once: the second's profile.json replaced the first's,
    and each of the first's later solves warned the file "mismatched" and removed it; DDP
    probe, 2026-12-06): passed over, and replaced by the next least found."""
    data = _load(path, FLOOR_KIND)
    try:
        if data["key"]["profile_sha256"] != profile.content_sha256:
            return None
        peak = int(data["peak_bytes"])
        schedule = Schedule.from_json(json.dumps(data["schedule"]))
    except Unusable:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Unusable(f"malformed ({type(exc).__name__}: {exc})") from exc
    sim = simulated(profile.problem, schedule)
    if sim.peak_bytes != peak:
        raise Unusable(f"mismatched: it claims peak {peak} B; the simulator says "
                        f"{sim.peak_bytes} B")
    return peak, schedule
