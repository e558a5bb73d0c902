"""`monet-opt largest-batch`: monet_opt.largest_batch from the command line (NOTE [The largest
batch] in monet_opt/batch_size.py)."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import torch
from torch.utils import _pytree as pytree

from monet_opt.batch_size import largest_batch, limit_bytes, log
from monet_opt.errors import InfeasibleBudgetError, MonetError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from monet_opt import precompute
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="a callable returning an nn.Module, e.g. torchvision.models:resnet50")
    p.add_argument("--input-shape", metavar="SHAPE", required=True,
                   help="one batch's shape, e.g. 32x3x224x224: its first size is the batch, "
                        "which the search changes")
    p.add_argument("--limit", required=True, help="the memory limit, e.g. 16GiB")
    p.add_argument("--start", type=int, default=None,
                   help="the first batch traced (default: --input-shape's)")
    p.add_argument("--max-batch", type=int, default=1 << 16, help="no larger batch is tried")
    p.add_argument("--max-tries", type=int, default=12,
                   help="at most this many batches are tried, each a whole optimize() "
                        "(default: %(default)s)")
    p.add_argument("--dtype", choices=sorted(precompute.DTYPES), default="float32",
                   help="the input's dtype; an integer dtype gives token ids (default float32)")
    p.add_argument("--input-name", metavar="NAME",
                   help="pass the input as this keyword argument (e.g. input_ids)")
    p.add_argument("--channels-last", action="store_true",
                   help="make the model and its image batches channels-last")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="the device to train on (default: %(default)s)")
    p.add_argument("--solver", default="auto", help="as optimize(solver=...) (default: auto)")
    p.add_argument("--time-limit-s", type=float, default=30.0,
                   help="the solver's time limit per try (default: 30, as optimize's)")
    precompute.add_profile_dir(p)


def run(args: argparse.Namespace) -> int:
    """Print each batch tried and the largest that fits."""
    from monet_opt import cli_inputs, precompute
    from monet_opt.errors import UsageError
    shape = cli_inputs.parse_shape(args.input_shape)
    cli_inputs.profile_root(args.profile_dir, "largest-batch caches what it profiles and "
                            "solves", writing=True)
    try:
        limit = limit_bytes(args.limit)
    except ValueError as exc:
        raise UsageError(f"bad --limit {args.limit!r}: {exc}") from exc
    model, _ = precompute.build(args)
    device = cli_inputs.device_of(args.device)
    progress = logging.StreamHandler(sys.stderr)  # each try as it ends: a search takes minutes
    progress.setFormatter(logging.Formatter("monet-opt: %(message)s"))
    progress.addFilter(lambda record: record.getMessage().startswith("largest_batch: "))
    level = log.level
    log.addHandler(progress)
    log.setLevel(min(log.getEffectiveLevel(), logging.INFO))

    def make_input(batch: int) -> Any:
        x = pytree.tree_map(lambda t: t.to(device), precompute.random_input(
            args, (batch, *shape[1:])))
        return x.contiguous(memory_format=torch.channels_last) if args.channels_last else x

    try:
        start = args.start if args.start is not None else \
            max(1, min(shape[0], args.max_batch))  # the shape's batch, within --max-batch
        fit = largest_batch(model, make_input, limit, start=start,
                            max_batch=args.max_batch, max_tries=args.max_tries,
                            solver=args.solver, time_limit_s=args.time_limit_s,
                            profile_dir=args.profile_dir)
    except (ValueError, InfeasibleBudgetError) as exc:
        if isinstance(exc, MonetError) and not isinstance(exc, InfeasibleBudgetError):
            raise  # the model's (NoBackwardError): said as precompute says it, not a usage error
        raise UsageError(" ".join([str(exc), *getattr(exc, "__notes__", ())])) from exc
    finally:
        log.removeHandler(progress)
        log.setLevel(level)
    print(fit.text())
    return 0
