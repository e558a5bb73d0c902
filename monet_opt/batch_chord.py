"""Where the largest batch search tries next (NOTE [The largest batch] in
monet_opt/batch_size.py): lines through known least peaks, pure arithmetic on the tries."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monet_opt.batch_fit import Try

GROWTH = 3  # before a try fails, a try's batch is at most this many times the largest that fit


def next_batch(tries: list[Try], fixed: int, limit: int, lo: int, hi: int) -> int:
    """The next batch, strictly between `lo` (the largest found to fit) and `hi` (the smallest
    found not to): where the line through two known least peaks reaches the limit. Between
    `lo` and a tried `hi`, the chord through their least peaks, the far end's pulled halfway
    towards the limit for each further try on the same side (the Illinois rule: a convex
    curve would otherwise be approached from one side only); halfway where `hi`'s least peak
    is unknown or the line has no slope. Before any try fails, the lower of the lines through
    the largest batch that fits and either (0, `fixed`) or the batch before it, at most GROWTH
    times `lo`."""
    least = {t.batch: t.least_bytes for t in tries if t.least_bytes is not None}
    under = [(0, fixed)] + sorted((b, n) for b, n in least.items() if b <= lo)
    bracketed = any(not t.fits for t in tries)
    if bracketed:
        if hi not in least:
            return (lo + hi) // 2
        (b1, l1), (b2, l2) = under[-1], (hi, least[hi])
        side = same_side(tries)
        if side >= 2 and tries[-1].fits:
            l2 = limit + (l2 - limit) / 2 ** (side - 1)
        elif side >= 2:
            l1 = limit - (limit - l1) / 2 ** (side - 1)
        guess = crossing((b1, l1), (b2, l2), limit, (lo + hi) // 2)
    else:  # the lower of two lines: a batch too large costs the most to try
        guess = min(crossing(under[0], under[-1], limit, lo * GROWTH),
                    crossing(under[-2 if len(under) > 1 else 0], under[-1], limit,
                             lo * GROWTH), lo * GROWTH)
    return min(max(guess, lo + 1), hi - 1)


def crossing(p1: tuple[int, float], p2: tuple[int, float], limit: int, otherwise: int) -> int:
    """The batch where the line through p1 and p2 (batch, least peak) reaches the limit;
    `otherwise` where it does not rise."""
    (b1, l1), (b2, l2) = p1, p2
    if b2 <= b1 or l2 <= l1:
        return otherwise
    return int(b1 + (limit - l1) * (b2 - b1) // (l2 - l1))


def same_side(tries: list[Try]) -> int:
    """How many of the last tries in a row came out as the last one did (fit or not)."""
    n = 0
    while n < len(tries) and tries[-1 - n].fits == tries[-1].fits:
        n += 1
    return n
