"""The profile directory: profiles and schedules cached as plain JSON.

    <profile_dir>/<Model>-<profile digest[:16]>/profile.json
    <profile_dir>/<Model>-<profile digest[:16]>/schedule-<limit B>-<solver>-<digest[:12]>.json
    <profile_dir>/<Model>-<profile digest[:16]>/least-peak-<solver>.json
    <profile_dir>/<Model>-<profile digest[:16]>/least-peak-<solver>-<problem digest[:12]>.json

A profile is the profiled `solvers.Problem` of one training step (plus each op's source label),
keyed by a `ProfileKey`; a schedule file is one solver's answer for one memory limit (the Schedule
and the facts of its SolveResult), keyed by a `ScheduleKey` (both in cache_keys.py). A profile
that is measured again (its file was unusable) thus never meets the schedules of the old
measurement; they are deleted. A least-peak file holds the lowest-peak schedule a solver has
returned on the profile, handed back to it on every solve there (NOTE [Least peaks remembered]
in solvers/remembered.py), so a least budget once reported is met on any later call. A problem
derived from the profile's (`derived`: a step with gradients in place) has its schedules in the
same folder, keyed by its own content as every schedule is, and its own least-peak file.

NOTE [Problems as planned]
  optimize() solves the profile's problem with what the step holds beyond the measured ops
  counted as fixed memory (CPU generator states, tensors kept on modules, buffer copies, a
  loss held: api._Planner.partition), so for many models (any with dropout on CPU) the problem
  it solves is derived from the profile's. `monet-opt precompute` solved the profile's own
  problem: its schedules were never met by optimize(), which profiled nothing but solved
  again, and the peaks it printed were under the step's (a limit it called feasible was
  refused by optimize(), 5,056 B short: one generator state). It now solves the problem
  optimize() plans (api.profile_model returns it), and a derived problem solved is written
  beside its schedules (problem-<digest[:12]>.json), so `list` and `explain` show the
  schedules optimize() uses, with that problem's store-all peak.

NOTE [Cache files are untrusted]
  Every file is checked before use: that it is JSON, of our kind and schema version; that its
  content is what was written (a SHA-256 of it is written with it: a time, a fixed size or a
  solve's facts edited by hand or flipped on disk pass every check below); that its stored key
  is the key asked for; that a profile has the structure of the graph being planned; that a
  schedule's facts are ones a solve reports and that it passes the simulator on the cached
  problem, within its limit, with the peak and time it claims (the last three in
  cache_checks.py). A file failing any check is reported by a
  `ProfileCacheWarning` naming the file and the failure, then rebuilt and overwritten (but
  one that cannot be read at all: NOTE [Files that cannot be read]; a
  schedule or least-peak file is deleted first: it is written again only by a solve, which a
  schedule served from another file does not run): never used, never a crash.
  Writes go to a temporary file in the same folder, then `os.replace`: readers see the old file
  or the new one, never a part. Two processes writing one entry both succeed; the last rename
  wins, and both wrote a valid file. A profile measured again says how many schedules of the
  measurement before it were deleted (they were deleted silently: a directory precomputed for
  many limits lost them all without a word; cache probe, 2026-12-06).

NOTE [Files that cannot be read]
  A file that cannot be read at all (mode 000 from another user's umask, a folder at its path)
  is not known to be damaged. It was reported as unusable, then measured again and written
  over, and the profile's rebuild deleted every schedule beside it, all valid (cache probe,
  2026-12-06). Now it is reported and left as it is: its entry is measured or solved again for
  this call and nothing is written in its place (nor, for a profile, any schedule of the
  profile measured instead), so nothing is overwritten or deleted, and no later warning says
  it cannot be written.

NOTE [Writes cut short]
  A process killed inside a write leaves its temporary file (`.<name>.<random>.tmp`), which
  nothing read or removed: each killed write left one for good. Reading a profile's folder now
  deletes those older than STALE_TMP_S (a write takes milliseconds; a younger one may be
  another process's write in progress).
"""
from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from pathlib import Path
from typing import Callable, Sequence

import solvers
from monet_opt.cache_checks import Unreadable, Unusable
from monet_opt.cache_files import (SCHEMA_VERSION, ProfileCacheWarning, _listed, _load,
                                   _schedule_profile, _stat, _write)
from monet_opt.cache_keys import ProfileKey, ScheduleKey, library_version
from monet_opt.cache_reads import (_RESULT_FIELDS, FLOOR_KIND, PROBLEM_KIND,  # noqa: F401
                                   PROFILE_KIND, SCHEDULE_KIND, CachedSchedule, Profile,
                                   _read_floor, _read_profile, _read_schedule, _safe, derived)
from monet_opt.errors import user_stacklevel
from monet_opt.lower import Lowered
from solvers import Problem, Schedule, SolveResult, Status
from solvers.remembered import with_known


def home_expanded(root: str | os.PathLike) -> Path:
    """`root` as a path, "~" and "~user" as a shell has them; ValueError, saying so, where
    the home is unknown (Path.expanduser's RuntimeError reached the caller bare)."""
    try:
        return Path(root).expanduser()
    except RuntimeError:
        raise ValueError(f"monet_opt: the profile directory {str(root)!r} begins with the home "
                         f"of {str(root).split('/')[0]!r}, which this machine does not know: "
                         "give a path without it, or a user's that exists") from None


class ProfileCache:
    """The profile directory `root`. optimize() asks it for a profile and for each schedule;
    it answers from a valid file or builds (measures, solves) and writes one."""

    def __init__(self, root: str | os.PathLike) -> None:
        if not isinstance(root, (str, os.PathLike)) or not str(root).strip():
            raise TypeError("monet_opt: profile_dir must be a path (a str or os.PathLike, "
                            f"not empty), or None for no profile directory; got {root!r}")
        self.root = home_expanded(root)

    def profile(self, key: ProfileKey, name: str, lowered: Lowered,
                measure: Callable[[], Problem]) -> Profile:
        """The cached profile of `lowered`'s graph, or `measure()` stored as one."""
        folder = self.root / f"{_safe(name)}-{key.digest[:16]}"
        path = folder / "profile.json"
        seen = _stat(path)
        _sweep(folder)  # NOTE [Writes cut short]
        with _reported(path) as failed:
            if seen is not None:
                return _read_profile(path, folder, key, lowered.problem)
        problem = measure()
        if failed and isinstance(failed[0], Unreadable):  # NOTE [Files that cannot be read]
            return Profile(key, name, problem, lowered.op_labels, folder, stored=False)
        if _stat(path) not in (seen, None):  # another process stored it meanwhile: use theirs
            with contextlib.suppress(Unusable):
                return _read_profile(path, folder, key, lowered.problem)
        profile = Profile(key, name, problem, lowered.op_labels, folder)
        _write(path, {"kind": PROFILE_KIND, "schema_version": SCHEMA_VERSION,
                      "key": key.to_dict(), "name": name, "op_labels": list(profile.op_labels),
                      "problem": json.loads(profile.problem.to_json())})
        removed = 0
        for stale in _listed(folder, "problem-*.json"):  # made from an older measurement
            with contextlib.suppress(OSError):
                stale.unlink()
        for stale in [*_listed(folder, "schedule-*.json"), *_listed(folder, "least-peak-*.json")]:
            # made on an older measurement
            if _schedule_profile(stale) != profile.content_sha256:
                with contextlib.suppress(OSError):
                    stale.unlink()
                    removed += 1
        if removed:
            warnings.warn(f"monet_opt profile directory: {folder}: removed {removed} schedule "
                          "and least-peak file(s) made on the profile measured before this "
                          "one; each limit is solved again when asked for.",
                          ProfileCacheWarning, stacklevel=user_stacklevel())
        return profile

    def find(self, key: ProfileKey, name: str, lowered: Lowered) -> Profile | None:
        """The cached profile of `lowered`'s graph under `key` if a valid one is stored (an
        unusable one is warned about and left for `profile()` to rebuild), else None."""
        folder = self.root / f"{_safe(name)}-{key.digest[:16]}"
        path = folder / "profile.json"
        if _stat(path) is None:
            return None
        with _reported(path, "not used"):
            return _read_profile(path, folder, key, lowered.problem)
        return None

    def solve(self, profile: Profile, limit_bytes: int, solver: str, time_limit_s: float,
              solve: Callable[..., SolveResult] | None = None,
              known: Sequence[Schedule] = (),
              candidates: Sequence[Schedule] = ()) -> SolveResult:
        """The cached answer of `solver` at `limit_bytes` on `profile`, or a fresh one stored
        (made by `solve`, a wrapper of solvers.solve, or by solvers.solve). Results without a
        schedule are stored only when the solver proved infeasibility (a time-limit stop may go
        otherwise next time). known: schedules of the problem found elsewhere (NOTE [Least
        peaks remembered] in solvers/remembered.py); candidates: more for "auto" beside those
        the directory holds (NOTE [Plans for other shapes])."""
        key = self._key(profile, limit_bytes, solver, time_limit_s)
        if key is None or not profile.stored:  # more digits than a file name holds: not cached
            return (solve or solvers.solve)(profile.problem, limit_bytes, solver,
                                            time_limit_s=time_limit_s, known=known,
                                            candidates=list(candidates))
        path = self.schedule_path(profile, limit_bytes, solver, time_limit_s)
        tag = f"-{profile.content_sha256[:12]}" if profile.derived else ""
        floor_path = profile.folder / f"least-peak-{_safe(solver)}{tag}.json"
        floor = None
        with _reported(floor_path, "to be written again by the next solve",
                       remove=True) as floor_failed:
            if _stat(floor_path) is not None:  # an unsearchable folder: None
                floor = _read_floor(floor_path, profile)
        known = ([floor[1]] if floor else []) + list(known)
        if profile.derived:  # NOTE [Problems as planned]
            self._keep_problem(profile)
        with _reported(path, "solved again", remove=True) as failed:
            if _stat(path) is not None:
                return with_known(profile.problem, limit_bytes,
                                  _read_schedule(path, profile, key).result, known)
        solve = solve or solvers.solve
        result = solve(profile.problem, limit_bytes, solver, time_limit_s=time_limit_s,
                       known=known, candidates=self._held(profile, solver) + list(candidates))
        if result.floor_schedule is not None and not _unreadable(floor_failed) and (
                floor is None or result.min_feasible_bytes < floor[0]) and \
                self._lowers(floor_path, profile, result.min_feasible_bytes):
            _write(floor_path, {"kind": FLOOR_KIND, "schema_version": SCHEMA_VERSION,
                                "key": {"profile_sha256": profile.content_sha256,
                                        "solver": solver},
                                "peak_bytes": result.min_feasible_bytes,
                                "schedule": json.loads(result.floor_schedule.to_json())})
        if result.status != Status.TIMEOUT and not _unreadable(failed):
            facts = {f: getattr(result, f) for f in _RESULT_FIELDS}
            _write(path, {"kind": SCHEDULE_KIND, "schema_version": SCHEMA_VERSION,
                          "key": key.to_dict(), "result": {**facts, "status": result.status.value},
                          "schedule": None if result.schedule is None
                          else json.loads(result.schedule.to_json())})
        return result

    @staticmethod
    def _lowers(floor_path: Path, profile: Profile, peak: int) -> bool:
        """Whether `peak` is below the least peak `floor_path` holds now: another process
        sharing the directory may have written a lower one while this one solved (its file,
        read before the solve, was overwritten with a higher least: a later call at the
        least peak that process reported was refused; cache probe, 2026-12-06)."""
        with _reported(floor_path, "to be written again", remove=True):
            if _stat(floor_path) is not None:
                held = _read_floor(floor_path, profile)
                return held is None or peak < held[0]
        return True

    def _keep_problem(self, profile: Profile) -> None:
        """Write the derived problem `profile` solves beside its schedules, where it is missing
        or unusable (a damaged one was skipped by `list` and never written again: its
        schedules were listed as none)."""
        path = profile.folder / f"problem-{profile.content_sha256[:12]}.json"
        problem = json.loads(profile.problem.to_json())
        if _stat(path) is not None:
            with _reported(path, "written again") as failed:
                if _load(path, PROBLEM_KIND).get("problem") == problem:
                    return
                raise Unusable("mismatched: not the problem its name says")
            if _unreadable(failed):
                return
        _write(path, {"kind": PROBLEM_KIND, "schema_version": SCHEMA_VERSION,
                      "problem": problem})

    @staticmethod
    def _key(profile: Profile, limit_bytes: int, solver: str,
             time_limit_s: float) -> ScheduleKey | None:
        if limit_bytes >= 2 ** 64:
            return None
        return ScheduleKey(profile.content_sha256, limit_bytes, solver,
                           (("time_limit_s", float(time_limit_s)),), library_version())

    def schedule_path(self, profile: Profile, limit_bytes: int, solver: str,
                      time_limit_s: float) -> Path | None:
        """Where `solve` stores that answer (None: a limit of 2**64 B or more is not stored)."""
        key = self._key(profile, limit_bytes, solver, time_limit_s)
        if key is None:
            return None
        return profile.folder / f"schedule-{limit_bytes}-{_safe(solver)}-{key.digest[:12]}.json"

    def _held(self, profile: Profile, solver: str) -> list[Schedule]:
        """For "auto": every schedule held for `profile`'s problem, at any limit, by any solver
        (NOTE [Schedules remembered] in solvers/remembered.py)."""
        if solver != "auto":
            return []
        with warnings.catch_warnings():  # unusable files are reported where they are used
            warnings.simplefilter("ignore", ProfileCacheWarning)
            held = self.schedules(profile, any_version=True)
        return [s.result.schedule for s in held if s.result.schedule is not None]

    def profiles(self) -> list[Profile]:
        """Every valid profile in the directory (unusable ones are warned about, and a
        directory that cannot be read)."""
        found = []
        if self.root.is_dir() and not os.access(self.root, os.R_OK | os.X_OK):
            warnings.warn(ProfileCacheWarning(f"monet_opt profile directory: cannot read "
                                              f"{self.root} (permission denied)"),
                          stacklevel=user_stacklevel())
        for path in _listed(self.root, "*/profile.json"):
            with _reported(path, "skipped"):
                found.append(_read_profile(path, path.parent, None))
        return found

    def planned(self, profile: Profile) -> list[Profile]:
        """The problems made from `profile`'s that were solved (NOTE [Problems as planned]), as
        derived profiles (unusable files are warned about)."""
        found = []
        for path in _listed(profile.folder, "problem-*.json"):
            with _reported(path, "skipped"):
                data = _load(path, PROBLEM_KIND)
                try:
                    made = derived(profile, Problem.from_dict(data["problem"]))
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    raise Unusable(f"malformed ({type(exc).__name__}: {exc})") from exc
                if len(made.problem.ops) != len(profile.problem.ops) or \
                        path.name != f"problem-{made.content_sha256[:12]}.json":
                    raise Unusable("mismatched: not a problem made from this profile's")
                found.append(made)
        return found

    def schedules(self, profile: Profile, any_version: bool = False) -> list[CachedSchedule]:
        """Every valid schedule of `profile`, by limit then solver (those of an older
        measurement of it are passed over, and unless `any_version` those another version of
        the solvers made, which `solve` does not serve: `other_versions`). A file whose key
        cannot be read is reported with the measured profile alone."""
        found = []
        for path in self._files(profile):
            if not any_version and _schedule_profile(path, "library_version") not in (
                    library_version(), None):
                continue
            with _reported(path, "skipped"):
                found.append(_read_schedule(path, profile, None))
        return sorted(found, key=lambda s: (s.key.memory_limit_bytes, s.key.solver))

    def unshown(self, profile: Profile, planned: list[Profile]) -> int:
        """How many schedule files in `profile`'s folder were made on none of it and the
        problems `planned` from it: their problem file is missing or unusable (NOTE [Problems as
        planned]; `list` said "no schedules" there, and `explain` to precompute them)."""
        known = {None, profile.content_sha256, *(p.content_sha256 for p in planned)}
        return sum(_schedule_profile(path) not in known
                   for path in _listed(profile.folder, "schedule-*.json"))

    def other_versions(self, profile: Profile) -> int:
        """How many of `profile`'s schedule files another version of the solvers made."""
        return sum(_schedule_profile(path, "library_version") not in (library_version(), None)
                   for path in self._files(profile))

    @staticmethod
    def _files(profile: Profile) -> list[Path]:
        """`profile`'s schedule files, and for a measured profile those whose key is unread."""
        found = []
        for path in _listed(profile.folder, "schedule-*.json"):
            made_on = _schedule_profile(path)
            if made_on == profile.content_sha256 or (made_on is None and not profile.derived):
                found.append(path)
        return found


@contextlib.contextmanager
def _reported(path: Path, then: str = "rebuilt", remove: bool = False):
    """Turn an unusable file into a warning that names it and says why; the list it yields
    gets the failure. remove: the file is deleted, unless another process replaced it
    meanwhile (a solve served from another file rebuilds nothing: a damaged least-peak file
    was reported as rebuilt at every call). A file that cannot be read is left as it is (NOTE
    [Files that cannot be read])."""
    seen, failed = _stat(path), []
    try:
        yield failed
    except Unusable as why:
        failed.append(why)
        if isinstance(why, Unreadable):
            then = ("not used and left as it is; nothing is cached in its place until it can "
                    "be read (make it readable, or remove it)")
        elif remove and seen is not None and _stat(path) == seen:
            with contextlib.suppress(OSError):
                path.unlink()
                then = f"removed, {then}"
        warnings.warn(f"monet_opt profile directory: {path}: {why}; {then}.",
                      ProfileCacheWarning, stacklevel=user_stacklevel())


def _unreadable(failed: list[Unusable]) -> bool:
    return any(isinstance(why, Unreadable) for why in failed)


STALE_TMP_S = 600  # a temporary file this old is no write in progress (NOTE [Writes cut short])


def _sweep(folder: Path) -> None:
    """Delete the temporary files of writes cut short in `folder` (NOTE [Writes cut short])."""
    for tmp in _listed(folder, ".*.tmp"):
        with contextlib.suppress(OSError):
            if time.time() - tmp.stat().st_mtime > STALE_TMP_S:
                tmp.unlink()
