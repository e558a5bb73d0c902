"""monet-opt command line: `monet-opt demo` runs the main job."""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="monet-opt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="optimize GPT-2 (12 layers) with activation memory halved "
                                       "and print eager vs optimized memory and time")
    demo.add_argument("--rounds", type=int, default=5, help="timed steps per method")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from monet_opt import demo as demo_module
        demo_module.main(rounds=args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
