"""Every warning and error class of monet_opt's that the README and docs name can be caught as
`monet_opt.<Name>` (ProfileCacheWarning, BatchNormScaleError and ProfileTimeLimitWarning could
not: docs probe, 2026-12-05)."""
from __future__ import annotations

import importlib
import pathlib
import pkgutil
import re

import monet_opt

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _own_classes() -> dict[str, type]:
    """The Warning and Error classes defined in monet_opt's modules, by name."""
    found = {}
    for info in pkgutil.iter_modules(monet_opt.__path__, "monet_opt."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, (Warning, Exception)) and \
                    value.__module__ == info.name:
                found[name] = value
    return found


def test_the_classes_the_docs_name_are_exported():
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    named = set(re.findall(r"\b([A-Z]\w+(?:Warning|Error))\b", text))
    own = _own_classes()
    missing = sorted(n for n in named & set(own) if getattr(monet_opt, n, None) is not own[n])
    assert not missing
    assert all(n in monet_opt.__all__ for n in named & set(own))
