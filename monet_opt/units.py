"""Memory sizes: parse what users write, print what they can read."""
from __future__ import annotations

import math
import re

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_ACCEPTED = ("a positive int number of bytes, or a string such as '512MiB', '1.5GB', '300 MiB', "
             "'2GiB' (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")


def parse_memory_limit(value: object) -> int:
    """Return `value` as a positive int number of bytes, or raise ValueError saying what is
    accepted."""
    if isinstance(value, bool):
        raise ValueError(f"memory_limit must be {_ACCEPTED}; got the bool {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"memory_limit must be {_ACCEPTED}; got {value}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value <= 0 or value != int(value):
            raise ValueError(f"memory_limit must be {_ACCEPTED}; got the float {value!r}")
        return int(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            n = float(m.group(1)) * _UNITS[m.group(2).lower()]
            if math.isfinite(n) and n >= 1:
                return int(n)
    raise ValueError(f"memory_limit must be {_ACCEPTED}; got {value!r}")


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
