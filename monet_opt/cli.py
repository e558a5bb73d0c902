"""monet-opt command line: `demo` runs the main job, `bench` the side-by-side benchmark;
`precompute` fills the profile directory with a model's profile and schedules (a schedule zoo),
`list` shows what it holds and `explain` prints a cached plan; `largest-batch` finds the
largest batch a plan fits under a limit."""
from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import warnings

from monet_opt.errors import MonetError, UsageError


_READING = ("list", "explain")  # commands whose output is all they do


def main(argv: list[str] | None = None) -> int:
    from monet_opt.cli_inputs import positive_int
    parser = argparse.ArgumentParser(prog="monet-opt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="optimize GPT-2 (12 layers) with activation memory halved "
                                       "and print eager vs optimized memory and time")
    demo.add_argument("--rounds", type=positive_int, default=5, help="timed steps per method")
    from monet_opt.bench import run as bench_run
    bench = sub.add_parser("bench", help="our memory/overhead frontier beside the peers' "
                                         "(torch.utils.checkpoint, torch.compile) on the same "
                                         "models; writes JSON, markdown and plots")
    bench_run.add_arguments(bench)
    from monet_opt import precompute
    precompute.add_precompute_arguments(sub.add_parser(
        "precompute", help="profile a model once and solve a list of memory limits into the "
                           "profile directory (a later optimize() of it neither profiles nor "
                           "solves)"))
    precompute.add_profile_dir(sub.add_parser(
        "list", help="every profile in the profile directory and its cached schedules"))
    explain = sub.add_parser("explain", help="print a cached plan (Plan.explain()), or the "
                                              "limits cached for a profile")
    precompute.add_explain_arguments(explain)
    from monet_opt import batch_size_cli
    batch_size_cli.add_arguments(sub.add_parser(
        "largest-batch", help="the largest batch whose training step a plan fits under a "
                              "memory limit, and that plan's overhead"))
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    if args.command == "explain":  # its optional LIMIT after --profile-dir D: left over above
        args = explain.parse_intermixed_args(argv[argv.index("explain") + 1:],
                                             argparse.Namespace(command="explain"))
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    warnings.formatwarning = _one_line  # the profile directory's: one line each
    try:
        return _run(args, argv)
    except UsageError as exc:
        print(f"monet-opt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except MonetError as exc:  # the model's or the limit's: said in full, without a traceback
        print(f"monet-opt {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: what was stored stays (each file written whole)
        print(f"monet-opt {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader (`| head`) left: not an error where it only reads
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so exit's flush does not fail
        # a precompute left unfinished (its progress notes go to that pipe too) said 0 with
        # nothing stored: as a process the pipe's signal ends says (CLI probe, 2026-12-07)
        return 0 if args.command in _READING else 128 + signal.SIGPIPE
    except OSError as exc:  # a profile directory it cannot read, a full disk: said, no trace
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EROFS):
            raise
        print(f"monet-opt {args.command}: error: {exc.strerror}: {exc.filename or ''}",
              file=sys.stderr)
        return 1
    finally:
        warnings.formatwarning = _format


def _one_line(message, category, filename, lineno, line=None) -> str:
    """A ProfileCacheWarning as `list` says it ("monet-opt: warning: ..."); others as Python
    does (file, line and source)."""
    from monet_opt.cache_files import ProfileCacheWarning
    if issubclass(category, ProfileCacheWarning):
        return f"monet-opt: warning: {message}\n"
    return _format(message, category, filename, lineno, line)


_format = warnings.formatwarning


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.command == "demo":
        from monet_opt import demo as demo_module
        demo_module.main(rounds=args.rounds)
        return 0
    if args.command == "bench":
        from monet_opt.bench import run as bench_run
        return bench_run.run(bench_run.settings_from(args, argv[1:]))
    from monet_opt import batch_size_cli, listing, precompute
    command = {"precompute": precompute.run_precompute, "list": listing.run_list,
               "explain": listing.run_explain, "largest-batch": batch_size_cli.run}[args.command]
    return command(args)


if __name__ == "__main__":
    raise SystemExit(main())
