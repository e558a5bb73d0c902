"""monet-opt command line: `monet-opt demo` runs the main job, `monet-opt bench` the
side-by-side benchmark."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="monet-opt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="optimize GPT-2 (12 layers) with activation memory halved "
                                       "and print eager vs optimized memory and time")
    demo.add_argument("--rounds", type=int, default=5, help="timed steps per method")
    from monet_opt.bench import run as bench_run
    bench = sub.add_parser("bench", help="our memory/overhead frontier beside the peers' "
                                         "(torch.utils.checkpoint, torch.compile) on the same "
                                         "models; writes JSON, markdown and plots")
    bench_run.add_arguments(bench)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from monet_opt import demo as demo_module
        demo_module.main(rounds=args.rounds)
    elif args.command == "bench":
        return bench_run.run(bench_run.settings_from(args, argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
