"""Make CPU memory behave like CUDA's caching allocator for timing.

NOTE [CPU allocator]
  CUDA's caching allocator hands freed blocks back to the next request, so after its first
  step a training loop allocates no fresh memory. glibc malloc instead maps large blocks fresh
  and unmaps them when freed (its threshold adapts, but a block as large as the largest freed
  one is mapped again), and trims the heap's free top. Writing into fresh pages faults on every
  page: on this machine a 16 MiB add takes 23 ms into fresh pages and 1.5 ms into reused ones.
  So on CPU a step's time depends on the order of its allocations more than on its arithmetic,
  and it wanders: ResNet-50 b16 128x128 eager steps measured 971-1269 ms (7 interleaved rounds)
  under glibc's defaults, 953-984 ms with freed memory kept. The benchmark and the demo keep
  freed memory (mallopt: no mmap, no trimming), as a GPU run would; the live-bytes counter that
  measures peaks counts tensors, not pages, so peaks do not change. A CPU user can do the same
  with MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647 in the environment.
"""
from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_INT_MAX = 2**31 - 1
KEPT = "glibc malloc keeping freed memory (mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB)"


def keep_freed_memory() -> str:
    """NOTE [CPU allocator]: tell glibc malloc to keep and reuse freed memory; returns what the
    process's allocator now does, for the report."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _INT_MAX) == 1
    except (OSError, AttributeError, TypeError):
        ok = False
    return KEPT if ok else "the C library's default malloc (mallopt unavailable)"
