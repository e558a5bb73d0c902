"""`monet-opt precompute`: a schedule zoo in the profile directory (list and explain: listing.py).

precompute profiles a model once (`module:factory` and an input shape) and solves a list of
memory limits into the profile directory, where a later `optimize()` of the same model, input
shapes, device and limit finds them (the same keys: nothing is profiled or solved again). list
says what the directory holds; explain prints a cached plan. A command line that cannot be
served raises `UsageError` (the CLI prints it on one line and exits with status 2).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

import solvers
from solvers.peak_bound import least_peak_bound
from monet_opt import api
from monet_opt.cache import Profile, ProfileCache
from monet_opt.cli_inputs import (device_of, load_factory, parse_shape, positive_seconds,
                                  profile_root)
from monet_opt.errors import FIXED, UsageError, internal_assert
from monet_opt.plan import Plan, make_plan
from monet_opt.units import Share, exact_bytes, format_bytes, parse_limit

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32}
AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_FRACTIONS = (0.7, 0.5, 0.4)
TOKEN_IDS = 100  # integer inputs are token ids in [0, TOKEN_IDS)


# ---- arguments -------------------------------------------------------------------------------

def add_precompute_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="a callable returning an nn.Module (or a (module, sample input) pair, "
                        "as monet_opt.zoo's do), e.g. torchvision.models:resnet18 or "
                        "monet_opt.zoo:tiny_cnn; MODULE is imported from the current directory "
                        "too. The model is profiled in train mode, with seed 0")
    p.add_argument("--input-shape", metavar="SHAPE",
                   help="the batch's shape, e.g. 32x3x160x160 (random values; needed unless "
                        "the factory returns a sample input)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="the input's dtype; an integer dtype (int64, int32) gives token ids in "
                        f"[0, {TOKEN_IDS}), for HF-style models (default float32)")
    p.add_argument("--input-name", metavar="NAME",
                   help="pass the input as this keyword argument (e.g. input_ids) instead of "
                        "positionally")
    p.add_argument("--channels-last", action="store_true",
                   help="make the model and its image batch (N, C, H, W) channels-last, for an "
                        "optimize() of a model you train channels-last")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where to profile: the device you will train on (default: %(default)s)")
    p.add_argument("--autocast", choices=sorted(AUTOCAST_DTYPES),
                   help="profile and solve the mixed-precision step: torch.autocast on --device "
                        "with this dtype. optimize() finds these schedules when called inside "
                        "the same torch.autocast block (NOTE [Autocast is traced])")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--limits", metavar="L1,L2,...",
                       help="memory limits, bytes or sizes such as 2GiB,1.5GiB,512MiB, or shares "
                            "as optimize() takes them: '50%% of activations,60%% of peak'")
    group.add_argument("--fractions", metavar="F1,F2,...",
                       help="limits as fractions of the store-all activation memory (the peak "
                            "above parameters, buffers, inputs and gradients), e.g. 0.7,0.5,0.4 "
                            "(the default)")
    p.add_argument("--solver", default="auto", choices=solvers.available_solvers(),
                   help="as optimize(solver=...) (default: auto)")
    p.add_argument("--time-limit-s", type=positive_seconds, default=30.0,
                   help="the solver's time limit per memory limit (default: 30, as optimize's)")
    p.add_argument("--profile-repeats", type=int, default=3,
                   help="timed runs per operator (default: 3, as optimize's)")
    p.add_argument("--profile-time-limit-s", type=positive_seconds, default=None,
                   help="wall time profiling may take; ops beyond it are estimated "
                        "(default: no limit)")
    add_profile_dir(p)
    p.add_argument("--no-variants", action="store_true",
                   help="recomputation alone, no operator variants (optimize(variants=False))")


def add_profile_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile-dir", default="profiles", type=_directory,
                   help="the profile directory (default: %(default)s, as optimize's)")


def _directory(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("give a directory (it was empty)")
    return text


def add_explain_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", metavar="PROFILE",
                   help="a profile's folder name as `monet-opt list` prints it, or a unique "
                        "prefix of it")
    p.add_argument("limit", metavar="LIMIT", nargs="?",
                   help="the memory limit of a cached schedule (bytes, 512MiB, or a share such "
                        "as \"50%% of activations\"); "
                        "without it, the cached limits are listed")
    p.add_argument("--solver", default="auto", choices=solvers.available_solvers(),
                   help="the solver the schedule was made with (default: auto)")
    add_profile_dir(p)


# ---- precompute ------------------------------------------------------------------------------

def build(args: argparse.Namespace) -> tuple[nn.Module, Any]:
    """The factory's model (in train mode, on --device) and the sample input."""
    shape = parse_shape(args.input_shape) if args.input_shape is not None else None
    factory = load_factory(args.factory)
    torch.manual_seed(0)
    made = factory()
    sample = None
    if isinstance(made, (tuple, list)) and made and isinstance(made[0], nn.Module):
        made, sample = made[0], (made[1] if len(made) > 1 else None)
    if not isinstance(made, nn.Module):
        raise UsageError(f"bad factory {args.factory!r}: it returned a {type(made).__name__}, "
                         "not an nn.Module (or a (module, sample input) pair)")
    device = device_of(args.device)
    model = made.to(device).train()
    if shape is not None:
        try:
            sample = random_input(args, shape)
        except RuntimeError as exc:  # the allocator's message, with a traceback, was all
            size = format_bytes(math.prod(shape) * DTYPES[args.dtype].itemsize)
            raise UsageError(f"--input-shape {args.input_shape}: a {args.dtype} batch of that "
                             f"shape takes {size}, which could not be allocated here "
                             f"({str(exc).splitlines()[0]})") from exc
    elif sample is None:
        raise UsageError(f"{args.factory!r} returned a model without a sample input: give "
                         "--input-shape, e.g. --input-shape 32x3x160x160")
    to_device = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    sample = pytree.tree_map(to_device, sample)
    if args.channels_last:
        if not (isinstance(sample, torch.Tensor) and sample.dim() == 4):
            raise UsageError("--channels-last needs an image batch (N, C, H, W) as the input, "
                             "e.g. --input-shape 32x3x160x160")
        model = model.to(memory_format=torch.channels_last)
        sample = sample.contiguous(memory_format=torch.channels_last)
    return model, sample


def random_input(args: argparse.Namespace, shape: tuple[int, ...]) -> Any:
    """A random batch of `shape` as --dtype and --input-name ask (on the CPU)."""
    dtype = DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, TOKEN_IDS, shape, generator=gen, dtype=dtype) \
        if not dtype.is_floating_point else torch.randn(shape, generator=gen, dtype=dtype)
    return {args.input_name: x} if args.input_name else x


def requested_limits(args: argparse.Namespace) -> list[tuple[int | Share, str]]:
    """--limits, or the --fractions, as (bytes or Share, as written) pairs, checked before
    profiling. An empty one (an unset shell variable) is refused, not read as not given."""
    for name in ("limits", "fractions"):
        if getattr(args, name) is not None and not getattr(args, name).strip():
            raise UsageError(f"--{name} is empty: give one or more, comma-separated, or leave "
                             "the option out for the defaults")
    if not args.limits:
        fractions = DEFAULT_FRACTIONS if not args.fractions else _fractions(args.fractions)
        return [(Share(f, "activations"), str(Share(f, "activations"))) for f in fractions]
    out = []
    for text in args.limits.split(","):
        try:
            out.append((parse_limit(text.strip()), text.strip()))
        except ValueError as exc:
            raise UsageError(f"bad --limits entry {text!r}: {exc}") from exc
    return out


def limits_of(requested: list[tuple[int | Share, str]], base: Plan) -> list[tuple[int, str]]:
    """(bytes, how it was asked) per limit: a share of the base (store-all) plan's step as
    optimize() makes it bytes (NOTE [Limits as shares] in monet_opt/units.py)."""
    floor = base.fixed_bytes + base.gradient_bytes
    return [(limit.bytes_of(floor, base.store_all_peak_bytes) if isinstance(limit, Share)
             else limit, asked) for limit, asked in requested]


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(f) for f in text.split(","))
    except ValueError as exc:
        raise UsageError(f"bad --fractions {text!r}: write numbers such as 0.7,0.5,0.4") from exc
    if not all(0 < f <= 1 for f in values):  # 50 was taken as 5000 % (journey probe)
        raise UsageError(f"bad --fractions {text!r}: each must be above 0 and at most 1, a "
                         "share of the store-all step's activations (1 = store-all; 50% is 0.5)")
    return values


def run_precompute(args: argparse.Namespace) -> int:
    """Profile once, solve every limit into the profile directory, one line per limit."""
    if args.profile_time_limit_s is not None and not args.profile_time_limit_s > 0:
        raise UsageError("--profile-time-limit-s must be positive (or left out: no limit)")
    if not args.time_limit_s > 0:
        raise UsageError(f"--time-limit-s must be positive, not {args.time_limit_s}")
    if args.profile_repeats < 1:
        raise UsageError(f"--profile-repeats must be at least 1, not {args.profile_repeats}")
    requested = requested_limits(args)
    root = profile_root(args.profile_dir, "precompute caches its profile and schedules",
                        writing=True)
    model, sample = build(args)
    _note(f"profiling {args.factory} ({type(model).__name__}) on {args.device} into "
          f"{args.profile_dir}/ (or reading its profile there) ...")
    held = _profiles_held(root)
    start = time.perf_counter()
    with torch.autocast(torch.device(args.device).type, AUTOCAST_DTYPES.get(args.autocast),
                        enabled=args.autocast is not None):
        profile, base = api.profile_model(model, sample, profile_dir=args.profile_dir,
                                          profile_repeats=args.profile_repeats,
                                          variants=not args.no_variants,
                                          profile_time_limit_s=args.profile_time_limit_s)
    limits = limits_of(requested, base)
    internal_assert(profile is not None, "profile_model gave no profile for a profile_dir")
    before = held.get(profile.folder.name)
    read = before is not None and before == _profiles_held(root).get(profile.folder.name)
    print(f"profile {profile.folder.name}: {profile.key.inputs}, {len(profile.problem.ops)} "
          f"ops, {'read from the directory' if read else 'profiled'} in "
          f"{time.perf_counter() - start:.1f} s")
    print(f"  store-all peak {format_bytes(base.store_all_peak_bytes)}, fixed "
          f"{format_bytes(base.fixed_bytes)}, gradients {format_bytes(base.gradient_bytes)}, "
          f"activations {format_bytes(base.store_all_activation_bytes)}")
    print(f"  {'limit':>12} {'bytes':>13}  {'asked as':<19} {'peak':>11} {'overhead':>9}  "
          f"{'solver':<17} {'status':<10} {'solve s':>7}")
    cache = ProfileCache(args.profile_dir)
    # solved least first, so each limit starts from the schedules cached below it (NOTE
    # [Schedules remembered] in solvers/remembered.py); reported in the order asked
    results, cached = {}, set()
    distinct = sorted({limit for limit, _ in limits})  # two asked as the same bytes: one solve
    for k, limit in enumerate(distinct, 1):
        _note(f"solving {k}/{len(distinct)}: {format_bytes(limit)} ({args.solver}, up to "
              f"{args.time_limit_s:g} s) ...")
        path = cache.schedule_path(profile, limit, args.solver, args.time_limit_s)
        if path is not None and path.is_file():  # served as it is, unless damaged
            cached.add(limit)
        results[limit] = cache.solve(profile, limit, args.solver, args.time_limit_s)
    for limit, asked in limits:
        print(f"  {format_bytes(limit):>12} {limit:>13}  {asked:<19} "
              + _outcome(profile, results[limit], limit, limit in cached))
    # a directory that passed the checks above may still refuse (/proc/x): exit 0 only if stored
    # (not an answer cache.solve keeps: a time-limit stop, or past 2**64 B)
    paths = {limit: cache.schedule_path(profile, limit, args.solver, args.time_limit_s)
             for limit, _ in limits if results[limit].status != solvers.Status.TIMEOUT}
    unsaved = [limit for limit, path in paths.items() if path is not None and not path.is_file()]
    lost = ([] if (profile.folder / "profile.json").is_file() else ["the profile"]) + (
        [f"{len(unsaved)} of {len(limits)} schedules"] if unsaved else [])
    if lost:
        raise UsageError(f"--profile-dir {args.profile_dir}: {' and '.join(lost)} could not be "
                         f"stored in {profile.folder} (the warnings above say why); a later "
                         "optimize() would profile and solve again")
    return 0


def _profiles_held(root: Path) -> dict[str, int]:
    """Each profile folder under `root` and when its profile.json last changed."""
    held = {}
    for path in root.glob("*/profile.json") if root.is_dir() else ():
        with contextlib.suppress(OSError):
            held[path.parent.name] = path.stat().st_mtime_ns
    return held


def _outcome(profile: Profile, result: solvers.SolveResult, limit: int,
             cached: bool = False) -> str:
    """The rest of a precompute line: peak, overhead, solver, status, time; or why none."""
    if result.feasible:
        plan = make_plan(profile.problem, profile.op_labels, result, limit)
        return (f"{format_bytes(plan.predicted_peak_bytes):>11} {plan.predicted_overhead:>+9.1%}  "
                f"{result.solver:<17} {result.status.value:<10} "
                + (f"{'cached':>7}" if cached else f"{result.solve_time_s:>7.2f}"))
    if result.status == solvers.Status.TIMEOUT:
        return (f"no schedule within the time limit ({result.solver}, "
                f"{result.solve_time_s:.1f} s): raise --time-limit-s")
    least, bound = result.min_feasible_bytes, least_peak_bound(profile.problem).bytes
    if limit < bound:  # NOTE [Proven or not found] in monet_opt/errors.py
        return (f"infeasible: the least feasible peak is {exact_bytes(least)}, "
                f"and the step's sizes alone need {format_bytes(bound)}; ask for at least "
                f"{format_bytes(least)}")
    if result.solver in FIXED:  # a longer search finds nothing: it makes one schedule
        return (f"infeasible: the least feasible peak is {exact_bytes(least)}; ask for at "
                f"least that, or --solver auto may find one down to {format_bytes(bound)} "
                f"(the step's sizes; {result.solver} makes one schedule)")
    return (f"infeasible: the least feasible peak is {exact_bytes(least)}; ask "
            f"for at least that, or a longer --time-limit-s may find one down to "
            f"{format_bytes(bound)} (the step's sizes)")


def _note(text: str) -> None:
    print(f"monet-opt: {text}", file=sys.stderr, flush=True)
