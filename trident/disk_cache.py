"""Small facts kept in TRIDENT_CACHE_DIR beside the plans (Note [Persistent plans]).

Note [Cached analyses]
~~~~~~~~~~~~~~~~~~~~~~
Some answers Trident needs per kernel cost more than the rest of a warm start: torch's TTIR
analysis of which arguments a launch writes (`get_mutated_tensors` compiles the kernel to TTIR,
~40 ms a kernel). They depend only on what the key names (the kernel's stable key, Note [Stable
keys], its constant arguments, each argument's dtype or scalar value, the versions of torch and
Triton), so with TRIDENT_CACHE_DIR set each answer is kept as `<dir>/<kind>/<k[:2]>/<k>.json`
and read back by a later process. Folders are created 0700 (as the plans'), and an entry is read
only from folders owned by this user that nobody else may write: like a plan, an answer read
back is trusted (a planted write analysis could drop a dependency), so it must be the user's
own. An entry is written to a temporary file and renamed; one that does not parse, names
another key or fails the caller's check is ignored (the answer is computed again and written
anew). Only answers the analysis gave are kept, never the fallback it takes when it fails.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from typing import Any, Callable, Optional

from . import knobs, logs

_log = logs.misses


def make_private_dirs(folder: str) -> None:
    """`folder` and the folders above it that do not exist yet, each created 0700."""
    missing = []
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass


def private(folder: str) -> bool:
    """The folder belongs to this user and nobody else may write it."""
    try:
        st = os.stat(folder)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def key_of(*parts: Any) -> str:
    import torch
    import triton

    return hashlib.sha256(repr((torch.__version__, triton.__version__) + parts).encode()).hexdigest()


def _path(kind: str, key: str) -> Optional[str]:
    root = knobs.cache_dir()
    return os.path.join(root, kind, key[:2], f"{key}.json") if root else None


def load(kind: str, key: str, check: Callable[[Any], bool]) -> Any:
    """The value stored under (`kind`, `key`) when TRIDENT_CACHE_DIR is set, it is there and
    `check(value)` holds; else None."""
    path = _path(kind, key)
    if path is None:
        return None
    folder = os.path.dirname(path)
    if not (private(folder) and private(os.path.dirname(folder)) and private(os.path.dirname(os.path.dirname(folder)))):
        if os.path.exists(path):
            _log.debug("cached %s %s ignored: its folder is not private to this user", kind, path)
        return None
    try:
        with open(path, "rb") as f:
            entry = json.loads(f.read().decode("utf-8"))
        if isinstance(entry, dict) and entry.get("key") == key and check(entry.get("value")):
            return entry["value"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError):
        pass
    _log.debug("cached %s %s ignored (unreadable or not what it should be)", kind, path)
    return None


def store(kind: str, key: str, value: Any) -> None:
    path = _path(kind, key)
    if path is None:
        return
    folder = os.path.dirname(path)
    try:
        make_private_dirs(folder)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "value": value}, f)
        os.replace(tmp, path)
    except OSError as e:  # a read-only or full disk costs the cache, never the call
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("could not write cached %s %s: %s", kind, path, e)
