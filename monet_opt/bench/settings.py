"""`monet-opt bench`'s command line: its arguments and the Settings of a run, each argument
checked before anything is measured (a bad one would otherwise fail after eager's run, or be
taken silently)."""
from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from monet_opt import zoo
from monet_opt.bench import methods, models
from monet_opt.cli_inputs import device_of, positive_int, positive_seconds
from monet_opt.errors import UsageError

LIMITS = ("100", "80", "60", "50", "40", "33", "a50", "a33", "min", "min+10")
QUICK_LIMITS = ("100", "50", "min")
QUICK_OUT = str(Path(tempfile.gettempdir()) / "monet-opt-bench-quick")
SOLVERS = ("auto", "milp", "dp", "checkmate")
BUDGETS = (1.0, 0.7, 0.5, 0.3, 0.1, 0.0)
QUICK_BUDGETS = (1.0, 0.5, 0.0)


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...]
    regime: str              # "cpu", "gpu" or "quick": which sizes (models.py)
    device: torch.device
    limits: tuple[str, ...]
    solvers: tuple[str, ...]
    compile_backend: str
    compile_budgets: tuple[float, ...]
    rounds: int
    time_limit_s: float
    out: Path
    merge: bool
    command: str
    git_commit: str  # taken when the run starts: commits made while it runs are not its code
    allocator: str = ""  # set when the run starts (NOTE [CPU allocator])
    size: dict[str, int] | None = None  # the factories' arguments, if not the regime's
    channels_last: bool = False  # every method on the model and input made channels-last
    profile_dir: str | None = None  # each model's own, new (NOTE [The bench's own profiles])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=",".join(models.DEFAULT_MODELS),
                   help=f"comma-separated, of {sorted(models.SPECS)}")
    p.add_argument("--quick", action="store_true",
                   help="tiny inputs, limits 100%%,50%%,min, budgets 1,0.5,0, 3 rounds, 5 s solver "
                        "limit: checks that everything runs, measures nothing worth reporting")
    p.add_argument("--out", help="folder for bench.json/.md/.png (default docs/benchmarks; "
                                 f"with --quick, {QUICK_OUT}: its tiny runs would replace the "
                                 "models' real ones in the committed figures)")
    p.add_argument("--limits", help=f"shares of eager's peak in %%, of its activations "
                                    f"('a33': the floor and 33%% of them) and/or 'min' "
                                    f"('min+10': 10%% above it) (default {','.join(LIMITS)})")
    p.add_argument("--solvers", default=",".join(SOLVERS),
                   help="the solvers to run through our executor (a name not in "
                        "solvers.available_solvers() is skipped and reported; 'checkmate': "
                        "Checkmate's MILP, the baseline)")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--compile-budgets", help="activation memory budgets, comma-separated "
                                             f"(default {','.join(map(str, BUDGETS))}; "
                                             "'none' to skip torch.compile)")
    p.add_argument("--rounds", type=positive_int,
                   help="timed interleaved rounds (default 11; quick 3)")
    p.add_argument("--time-limit", type=positive_seconds,
                   help="seconds each MILP may take (default 30, optimize()'s; quick 5)")
    p.add_argument("--device", choices=("cpu", "cuda"),
                   help="default: cuda when available (MONeT's batch sizes), else cpu")
    p.add_argument("--size", default="",
                   help="the models' factory arguments instead of the regime's, e.g. "
                        "batch=32,size=160 (with --out elsewhere: bench.json keys by model)")
    p.add_argument("--channels-last", action="store_true",
                   help="run every method on the model and its input converted to channels-last "
                        "(what torch.compile does inside on CPU); eager on the model as built "
                        "is timed beside them")
    p.add_argument("--no-merge", action="store_true",
                   help="replace bench.json instead of merging these models into it")


def settings_from(args: argparse.Namespace, argv: list[str]) -> Settings:
    device = _device(args.device)
    names = tuple(n for n in args.models.split(",") if n)
    unknown = [n for n in names if n not in models.SPECS]
    if unknown or not names:
        what = f"unknown models {unknown}" if unknown else f"no model in {args.models!r}"
        raise UsageError(f"{what}; choose from {sorted(models.SPECS)}")
    out = Path(args.out or (QUICK_OUT if args.quick else "docs/benchmarks")).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} is a file, not a folder; name a folder "
                         "(it is made if missing)")
    settings = Settings(
        models=names, regime="quick" if args.quick else device.type.replace("cuda", "gpu"),
        device=device,
        limits=_limits(args.limits) if args.limits else QUICK_LIMITS if args.quick else LIMITS,
        solvers=tuple(s for s in args.solvers.split(",") if s),
        compile_backend=args.compile_backend,
        compile_budgets=_budgets(args.compile_budgets or ",".join(
            map(str, QUICK_BUDGETS if args.quick else BUDGETS))),
        rounds=args.rounds or (3 if args.quick else 11),
        time_limit_s=args.time_limit or (5.0 if args.quick else 30.0),
        out=out, merge=not args.no_merge,
        command="monet-opt bench " + shlex.join(argv), git_commit=git_commit(),
        size=zoo.parse_size(args.size, names), channels_last=args.channels_last)
    if settings.compile_budgets:
        _check_backend(settings.compile_backend)
    _make_folder(out)  # last: a run refused for another argument leaves no folder behind
    return settings


def _device(name: str | None) -> torch.device:
    """--device, or cuda where torch sees it: a missing CUDA said now, not at the model's move."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return device_of(name)
    except UsageError as exc:
        raise UsageError(f"{exc}; run where torch sees one, or give "
                         "--device cpu") from None


def _check_backend(backend: str) -> None:
    """A backend torch.compile does not know failed each budget, after our points had run."""
    import torch._dynamo
    if backend not in torch._dynamo.list_backends(exclude_tags=()):  # debug ones too
        raise UsageError(f"--compile-backend: torch.compile has no backend "
                         f"{backend!r}; choose from {torch._dynamo.list_backends()} (or one "
                         "of list_backends(exclude_tags=())), or give --compile-budgets none")


def _make_folder(out: Path) -> None:
    """--out made now: one that cannot be made failed only when the results were written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out: cannot make the folder {out} "
                         f"({exc.strerror or exc}); name a folder that can be made") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"--out: cannot write into {out} (permission denied); "
                         "name a folder you can write to")


def _limits(text: str) -> tuple[str, ...]:
    limits = tuple(text.split(","))
    for setting in limits:
        try:
            methods.check_limit(setting)
        except ValueError as exc:
            raise UsageError(f"--limits: {exc}") from None
    return limits


def _budgets(text: str) -> tuple[float, ...]:
    """torch.compile's activation memory budgets: shares of its activations, 0 to 1."""
    if text == "none":
        return ()
    try:
        budgets = tuple(float(b) for b in text.split(","))
    except ValueError:
        budgets = (math.nan,)
    if not all(0 <= b <= 1 for b in budgets):
        raise UsageError(f"--compile-budgets: give numbers from 0 to 1 separated "
                         f"by commas (shares of torch.compile's activations, e.g. 1,0.5,0) or "
                         f"'none'; got {text!r}")
    return budgets


def git_commit(root: Path | None = None) -> str:
    """The commit the code ran at, "with uncommitted changes" where a tracked file other than
    markdown or one under docs/ differs from it: those hold what runs write (the bench's own
    output, rewritten after each model) and what people write about them, not what runs run,
    so a run of several models is not marked by its first model's figures."""
    root = root or Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":(exclude)docs", ":(exclude,glob)**/*.md"],
                               cwd=root, text=True, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" (with uncommitted changes)" if dirty.strip() else "")
