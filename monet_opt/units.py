"""Memory sizes: parse what users write, print what they can read."""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from decimal import Decimal

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_TOO_MANY = Decimal(10) ** 100  # bytes: "1e999999999" overflowed Decimal's context
_ACCEPTED = ("a positive whole number of bytes under 10**100 (an int, or a float such as 3e8), "
             "or a string such as '512MiB', '1.5GB', '300 MiB', '2GiB' (units B, KB, MB, GB, TB, "
             "KiB, MiB, GiB, TiB)")


def parse_memory_limit(value: object) -> int:
    """Return `value` as a positive int number of bytes, or raise ValueError saying what is
    accepted."""
    if isinstance(value, bool):
        raise ValueError(f"memory_limit must be {_ACCEPTED}; got the bool {value!r}")
    if isinstance(value, numbers.Integral):  # a NumPy int too
        if not 0 < value < _TOO_MANY:  # 10**400 failed after the solve, printing it
            raise ValueError(f"memory_limit must be {_ACCEPTED}; got {value}")
        return int(value)
    if isinstance(value, numbers.Real):  # a NumPy float32 too
        if not math.isfinite(value) or not 0 < value < _TOO_MANY or value != int(value):
            raise ValueError(f"memory_limit must be {_ACCEPTED}; got the float {value!r}")
        return int(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if m and _bits(m.group(2)):
            raise ValueError(f"memory_limit {value!r}: '{m.group(2)}' reads as bits (a capital "
                             f"prefix and a small b); write '{m.group(2)[:-1]}B' for bytes")
        if m and m.group(2).lower() in _UNITS:
            # exactly: as a float, "2.01MB" was 2,009,999 B, "9007199254740993" one less
            n = Decimal(m.group(1))
            n = n * _UNITS[m.group(2).lower()] if n.adjusted() < 100 else _TOO_MANY
            # in bytes, a fraction is no size ("1.5" was read as 1 B); past 10**100 B, none
            if 1 <= n < _TOO_MANY and (_UNITS[m.group(2).lower()] > 1 or n == int(n)):
                return int(n)
    raise ValueError(f"memory_limit must be {_ACCEPTED}; got {value!r}")


def _bits(unit: str) -> bool:
    """'8Gb' and '8Mib' are bits by convention; '8gb', all small, is read as bytes, as written."""
    return len(unit) > 1 and unit.endswith("b") and unit.lower() in _UNITS and unit != unit.lower()


@dataclass(frozen=True)
class Share:
    """NOTE [Limits as shares]
      A limit may be written as a share of the step with nothing recomputed: "50% of
      activations" (what torch.compile's activation_memory_budget means, and `monet-opt
      precompute --fractions`: the floor, which is parameters, buffers, inputs and gradients,
      plus that share of the store-all peak above it) or "60% of peak" (of the whole store-all
      peak). Neither is known before the step is traced and profiled, so the first plan turns
      the share into bytes (`Plan.memory_limit_bytes`) the way precompute does, byte for byte:
      `optimize()` then finds precompute's schedules. Inputs of other shapes are planned under
      those bytes, as under a limit given in bytes: the memory is what the limit bounds."""
    fraction: float
    of: str  # "activations" or "peak"

    def __post_init__(self) -> None:
        if self.of not in ("activations", "peak") or not 0 < self.fraction < math.inf:
            raise ValueError(f"Share({self.fraction!r}, {self.of!r}): the fraction must be "
                             "positive and finite, and `of` 'activations' or 'peak'")

    def bytes_of(self, floor: int, store_all_peak: int) -> int:
        """The limit in bytes, for a step whose floor and store-all peak are these; at most
        2**62 past the floor, as good as no limit ('1e308% of activations' overflowed)."""
        base = 0 if self.of == "peak" else floor
        share = self.fraction * (store_all_peak - base)
        return base + (int(share) if share < 2 ** 62 else 2 ** 62)

    def __str__(self) -> str:
        return f"{self.fraction * 100:g}% of {self.of}"


_SHARES = ("or a share of the store-all step: '50% of activations' (above parameters, buffers, "
           "inputs and gradients) or '60% of peak'")


def parse_limit(value: object) -> int | Share:
    """`value` as bytes (parse_memory_limit) or as a Share (NOTE [Limits as shares]), or raise
    ValueError saying what is accepted."""
    if isinstance(value, Share):
        return value
    if isinstance(value, str) and "%" in value:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*%\s*(?:of\s+)?"
                         r"(activations|peak)\s*", value, re.IGNORECASE)
        fraction = float(Decimal(m.group(1)) / 100) if m else 0.0
        if 0 < fraction < float("inf"):  # 1e400% is inf as a float: said as typed below
            return Share(fraction, m.group(2).lower())
        raise ValueError(f"memory_limit {value!r}: write a positive share of 'activations' or "
                         f"'peak', such as '50% of activations' or '60% of peak'")
    try:
        return parse_memory_limit(value)
    except ValueError as exc:
        raise ValueError(f"{exc}; {_SHARES}") from None


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def exact_bytes(n: int) -> str:
    """`format_bytes(n)` with the bytes themselves beside it, where it rounds them."""
    short = format_bytes(n)
    return short if short == f"{n} B" else f"{short} ({n} B)"
