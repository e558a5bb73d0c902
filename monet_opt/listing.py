"""`monet-opt list | explain`: what the profile directory holds, and a cached plan.

list says which profiles the directory holds and their cached schedules; explain prints one
(Plan.explain()) or the limits cached for a profile. A command line that cannot be served
raises `UsageError` (the CLI prints it on one line and exits with status 2).
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import solvers
from monet_opt.cache import CachedSchedule, Profile, ProfileCache, ProfileCacheWarning
from monet_opt.errors import UsageError
from monet_opt.plan import limit_bytes, make_plan
from monet_opt.profiler import PROFILER_REVISION
from monet_opt.cli_inputs import profile_root
from monet_opt.units import exact_bytes, format_bytes, parse_limit


def _read(root: Path) -> list[tuple[Profile, list[CachedSchedule]]]:
    """Every valid profile under `root` and its schedules, each followed by the problems made
    from it that optimize() or precompute solved and theirs (NOTE [Problems as planned] in
    monet_opt/cache.py); unusable files are reported on stderr, one line each, and schedule
    files whose problem file is (`ProfileCache.unshown`) one line per folder."""
    cache = ProfileCache(root)
    found = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ProfileCacheWarning)
        for measured in cache.profiles():
            planned = cache.planned(measured)
            found += [(q, cache.schedules(q)) for q in [measured, *planned]]
            if n := cache.unshown(measured, planned):
                warnings.warn(ProfileCacheWarning(
                    f"monet_opt profile directory: {measured.folder}: {n} schedule file(s) "
                    "not shown: the problem they were solved on (problem-*.json) is missing or "
                    "unusable; optimize() writes it again when it plans that step"))
    for w in caught:  # the CLI's formatter says each in one line (monet_opt/cli.py)
        print(warnings.formatwarning(w.message, w.category, w.filename, w.lineno), end="",
              file=sys.stderr)
    return found


def run_list(args: argparse.Namespace) -> int:
    root = profile_root(args.profile_dir, "list reads profiles")
    if not root.is_dir():
        print(f"no profile directory at {root}/ (monet-opt precompute MODULE:FACTORY "
              f"--profile-dir {root} makes one)")
        return 0
    found = _read(root)
    if not found:
        print(f"{root}/ holds no usable profiles (monet-opt precompute MODULE:FACTORY "
              f"--profile-dir {root} adds some)")
        return 0
    measured = None
    for k, (profile, schedules) in enumerate(found):
        key, store_all = profile.key, _store_all(profile)
        if not profile.derived:
            measured = profile
            print(f"{profile.folder.name}")
            print(f"  model {profile.name}, inputs {key.inputs}, {len(profile.problem.ops)} "
                  f"ops; {key.device}; torch {key.torch_version}; options "
                  + ", ".join(f"{k}={v}" for k, v in key.options))
            made_by = dict(key.options).get("profiler")
            if made_by is not None and str(made_by) != str(PROFILER_REVISION):
                print(f"  made by profiler revision {made_by}, not this one's "
                      f"{PROFILER_REVISION}: optimize() measures the step anew and does not "
                      "read it (profiles/README.md says what changed)")
            if not schedules and k + 1 < len(found) and found[k + 1][0].derived:
                continue  # its schedules are the planned problems'
        else:
            states = sum(op.state_bytes for op in profile.problem.ops)
            extra = profile.problem.fixed_bytes - states - measured.problem.fixed_bytes
            kept = f", and {states:,} B of generator states where a plan keeps them (NOTE " \
                "[States kept only where used])" if states else ""
            print(f"  as optimize() plans the step ({extra:+,} B fixed: what it holds beyond the "
                  f"measured ops{kept}), problem " + profile.content_sha256[:12])
        print(f"  store-all: peak {format_bytes(store_all.peak_bytes)}, step "
              f"{store_all.time_s * 1e3:.2f} ms")
        if not schedules:
            print("  no schedules")
        else:
            print("  " + _SCHEDULE_HEADER)
        for s in schedules:
            print("  " + _schedule_line(s, store_all.time_s))
        _other_versions(ProfileCache(root), profile)
    return 0


def _other_versions(cache: ProfileCache, profile: Profile) -> None:
    """Says how many schedules of `profile` another version of the solvers made (not listed:
    optimize() and precompute solve those limits again)."""
    n = cache.other_versions(profile)
    if n:
        print(f"  ({n} schedule file(s) made by another version of the solvers not shown: "
              "optimize() and precompute solve those limits again)")


_SCHEDULE_HEADER = f"{'limit':>12} {'bytes':>13}  {'solver':<18} {'status':<10} " \
    f"{'time limit':>10} {'peak':>11} {'step ms':>9} {'overhead':>9}"


def _schedule_line(s: CachedSchedule, store_all_s: float) -> str:
    r, limit = s.result, s.key.memory_limit_bytes
    solver = r.solver if r.solver.startswith(s.key.solver) else f"{s.key.solver} ({r.solver})"
    # the time limit it was solved under: one limit may be cached under several (a
    # precompute's --time-limit-s and optimize()'s default), which were alike rows
    given = dict(s.key.options).get("time_limit_s")
    given = "" if given is None else f"{given:g} s"
    head = f"{format_bytes(limit):>12} {limit:>13}  {solver:<18} {r.status.value:<10} " \
        f"{given:>10} "
    if not r.feasible:
        return head + f"least feasible peak {format_bytes(r.min_feasible_bytes)}"
    overhead = r.objective_s / store_all_s - 1 if store_all_s else 0.0
    return head + (f"{format_bytes(r.peak_bytes):>11} {r.objective_s * 1e3:>9.2f} "
                   f"{overhead:>+9.1%}")


def _store_all(profile: Profile) -> solvers.Simulation:
    problem = profile.problem
    return solvers.simulate(problem, solvers.schedule_from_kept(problem,
                                                                problem.saved_for_backward))


def find_profile(found: list[tuple[Profile, list[CachedSchedule]]], name: str,
                 root: Path) -> list[tuple[Profile, CachedSchedule]]:
    """The schedules of the profile whose folder is `name`, or of the only one it is a prefix
    of (its planned problems' among them), each with its problem's profile."""
    exact = [f for f in found if f[0].folder.name == name]
    hits = exact or [f for f in found if f[0].folder.name.startswith(name)]
    folders = sorted({p.folder.name for p, _ in hits})
    if not hits:
        unread = "" if not (root / name).is_dir() else (
            " that could be read (its profile.json is unusable, as said above: monet-opt "
            "precompute, or optimize(), makes it again)")
        raise UsageError(f"no profile {name!r} in {root}/{unread}; `monet-opt list "
                         f"--profile-dir {root}` shows the profiles there")
    if len(folders) > 1:
        raise UsageError(f"{name!r} matches {len(folders)} profiles in {root}/ "
                         f"({', '.join(folders)}); give more of the name")
    return [(p, s) for p, schedules in hits for s in schedules] or [(hits[0][0], None)]


def run_explain(args: argparse.Namespace) -> int:
    root = profile_root(args.profile_dir, "explain reads profiles")
    if not root.is_dir():
        raise UsageError(f"no profile directory at {root}/ (monet-opt precompute "
                         f"MODULE:FACTORY --profile-dir {root} makes one)")
    if not args.profile:
        raise UsageError("give a profile's folder name, or its start (monet-opt list "
                         f"--profile-dir {root} shows them)")
    entries = find_profile(_read(root), args.profile, root)
    profile = entries[0][0]
    mine = [(p, s) for p, s in entries if s is not None and s.key.solver == args.solver]
    if args.limit is None:
        others = _solvers([s for _, s in entries if s is not None])
        print(f"{profile.folder.name}: {len(mine)} cached {args.solver} schedule(s)"
              + (":" if mine else f" (other solvers: {others})"))
        if mine:  # the columns `list` names (an API probe read them without)
            print("  " + _SCHEDULE_HEADER)
        for p, s in mine:
            print("  " + _schedule_line(s, _store_all(p).time_s))
        print(f"monet-opt explain {profile.folder.name} LIMIT prints one (LIMIT as in the "
              "bytes column)")
        return 0
    try:
        asked = parse_limit(args.limit)
    except ValueError as exc:
        raise UsageError(f"bad LIMIT {args.limit!r}: {exc}") from exc
    limit = limit_bytes(asked, profile.problem)  # a share: NOTE [Limits as shares]
    found = [(p, s) for p, s in mine if s.key.memory_limit_bytes == limit_bytes(asked, p.problem)]
    shown = [(p, s) for p, s in mine if format_bytes(s.key.memory_limit_bytes) ==
             format_bytes(limit)]  # typed as list shows it: "89.56 MiB" is 93,910,466 B
    if not found and len({s.key.memory_limit_bytes for _, s in shown}) == 1:
        found = shown
    at = sorted(found, key=lambda e: (not e[1].result.feasible, e[1].result.objective_s or 0.0))
    if not at:
        cached = ", ".join(str(s.key.memory_limit_bytes) for _, s in mine) or "none"
        raise UsageError(f"no cached {args.solver} schedule at {exact_bytes(limit)} "
                         f"for {profile.folder.name} (cached limits in bytes: {cached}); "
                         f"precompute it: monet-opt precompute MODULE:FACTORY --limits {limit}")
    planned, result, limit = at[0][0], at[0][1].result, at[0][1].key.memory_limit_bytes
    if not result.feasible:
        raise UsageError(f"{exact_bytes(limit)} is infeasible for "
                         f"{profile.folder.name}: the least feasible peak is "
                         f"{format_bytes(result.min_feasible_bytes)} "
                         f"({result.min_feasible_bytes} B); explain a larger limit")
    print(f"{profile.folder.name}: {profile.name}, inputs {profile.key.inputs}, "
          f"{profile.key.device}")
    if len(at) > 1:  # one limit solved under several time limits: which one this is
        given = [f"{dict(s.key.options).get('time_limit_s', 0):g} s" for _, s in at]
        print(f"the fastest of {len(at)} schedules cached at this limit (solved under time "
              f"limits {', '.join(given)}): the {given[0]} one")
    print(make_plan(planned.problem, planned.op_labels, result, limit).explain())
    return 0


def _solvers(schedules: list[CachedSchedule]) -> str:
    return ", ".join(sorted({s.key.solver for s in schedules})) or "none"
