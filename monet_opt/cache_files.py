"""The profile directory's files: checked reads, signed atomic writes (NOTE [Cache files are
untrusted] in monet_opt/cache.py)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from monet_opt.cache_checks import Unreadable, Unusable
from monet_opt.errors import user_stacklevel

SCHEMA_VERSION = 2  # 2: each file holds the SHA-256 of its content


class ProfileCacheWarning(UserWarning):
    """A file in the profile directory was unusable; it is rebuilt."""


def _load(path: Path, kind: str) -> dict[str, Any]:
    """The JSON object in `path`, checked for kind and schema version."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise Unreadable(f"cannot be read ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise Unusable(f"corrupt: not UTF-8 text ({exc})") from exc
    try:
        data = json.loads(text)
    except RecursionError as exc:
        raise Unusable("corrupt: its JSON is nested too deeply to be ours") from exc
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # whole, then more: "truncated" said it was cut short
            raise Unusable(f"corrupt: more after its JSON object, from byte {exc.pos}") from exc
        end = text.rstrip()
        # our files are one object, "{" to "}"; cut after a "-" or a "t", the error is at the
        # last character, not past it
        ours = not end or end.lstrip().startswith("{")  # "garbage" is no cut-off object
        if ours and (exc.pos >= len(end) - 1 or exc.msg.startswith("Unterminated string") or
                     not end.endswith("}")):
            raise Unusable(f"truncated: the JSON ends early, at byte {len(text)}") from exc
        raise Unusable(f"corrupt: not valid JSON ({exc})") from exc
    except ValueError as exc:  # a number of over 4,300 digits: Python's bound on int("...")
        raise Unusable(f"corrupt: a number in it cannot be read ({exc})") from exc
    if not isinstance(data, dict) or data.get("kind") != kind:
        found = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise Unusable(f"not a {kind} file (kind {found!r})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise Unusable(f"schema version {data.get('schema_version')!r}, but this monet_opt "
                        f"reads version {SCHEMA_VERSION}")
    if data.get("sha256") != content_sha256(data):
        raise Unusable("edited or damaged: its content is not what was written (its SHA-256 "
                       "differs from the one written with it)")
    return data


def signed(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the SHA-256 of its content, as a file of the directory is written."""
    return {**data, "sha256": content_sha256(data)}


def content_sha256(data: dict[str, Any]) -> str:
    """The SHA-256 of `data` less its "sha256", written canonically (JSON's floats read back as
    written, so a file read back hashes as it did when it was written)."""
    body = {k: v for k, v in data.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
                          ).hexdigest()


def _schedule_profile(path: Path, field: str = "profile_sha256") -> str | None:
    """The profile a schedule file was made on (or another `field` of its key: the solvers'
    "library_version"), or None if that cannot be read."""
    try:
        return json.loads(path.read_bytes())["key"][field]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def _listed(folder: Path, pattern: str) -> list[Path]:
    """folder.glob(pattern), sorted; none where the folder cannot be searched (its mode, its
    owner: optimize() went on to a PermissionError after profiling)."""
    try:
        return sorted(folder.glob(pattern))
    except OSError:
        return []


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _write(path: Path, data: dict[str, Any]) -> None:
    """Write `data` atomically (a temporary file in the same folder, then os.replace). A folder
    that cannot be written is warned about; optimize() goes on without caching."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(signed(data), f)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if not isinstance(exc, OSError):
            raise
        warnings.warn(f"monet_opt profile directory: cannot write {path} ({exc}); not cached.",
                      ProfileCacheWarning, stacklevel=user_stacklevel())
