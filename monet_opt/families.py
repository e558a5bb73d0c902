"""Which operator-variant families optimize() offers the solver, and which measured variants
it keeps (NOTE [Lossy bound] in monet_opt/variants.py)."""
from __future__ import annotations

from typing import Collection

from monet_opt import bn_split
from monet_opt import variants as variant_library


def offered_families(variants: bool | Collection[str], allow_lossy: bool) -> frozenset[str]:
    """The family names `optimize(variants=..., allow_lossy=...)` offers: the library's, and
    BatchNorm's recomputation from its statistics (NOTE [BatchNorm recomputed from its
    statistics]), exact."""
    lossy_ok = lambda f: f.exact or allow_lossy  # noqa: E731
    if variants is True or variants is False:
        return frozenset([f.name for f in variant_library.FAMILIES if lossy_ok(f)]
                         + [bn_split.NAME]) if variants else frozenset()
    names = frozenset(variants)
    known = {f.name for f in variant_library.FAMILIES} | {bn_split.NAME}
    if names - known:
        raise ValueError(f"monet_opt.optimize: unknown variant families {sorted(names - known)}; "
                         f"choose from {sorted(known)}")
    lossy = sorted(n for n in names - {bn_split.NAME}
                   if not lossy_ok(variant_library.family(n)))
    if lossy:
        raise ValueError(f"monet_opt.optimize: variant families {lossy} are lossy; pass "
                         f"allow_lossy=True to use them")
    return names


def acceptable(site, error: float, allow_lossy: bool) -> bool:
    """Whether a variant whose measured result is `error` (relative) off the op's may be used:
    exact families only at 0, lossy ones (if allowed) within their family's bound."""
    fam = variant_library.family(site.family)
    if fam.exact or not allow_lossy:
        return error == 0.0
    return error <= fam.max_rel_error
