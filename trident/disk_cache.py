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

Note [Kept measurements]
~~~~~~~~~~~~~~~~~~~~~~~~
The implementation choices made by measurement (`TUNING_KINDS`: Note [Decode matmuls by
measurement], Note [Decode attention by measurement]) cost a capture's first call ~20 s on an
H100 for a Llama-1B step (compiles and timings of ~135 candidates), every process again. As
Inductor keeps its autotuning results and Triton its binaries without being asked, they are kept
by default: in TRIDENT_CACHE_DIR when it is set (beside the plans, as every entry here), else in
TRIDENT_TUNING_DIR (`~/.cache/trident/tuning` unless set; '' keeps none). Only these kinds go
there: what they hold picks among implementations that all compute the operator's result within
its dtype's tolerance, is read back under the same rules as every entry (private folders, the
caller's check: a config the pass measures, times that are numbers) and is keyed by the device's
name, torch's and Triton's versions, the deciding module's and the kernels' sources and whether
times were taken after a kernel. A choice measured on a busy GPU stays until its key changes or
the folder is emptied. Tests run with it off (tests/conftest.py); the benchmarks too unless the
caller sets it (tools/knob_sets.py, which the trident.compile benchmarks import; bench_miss,
bench_tp, bench_recurrent and diag_calls set it themselves; tools/gpu_suite.sh exports it): a first
call measures as a user's first run does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
from typing import Any, Callable, Optional

import torch
import triton

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


def private_chain(folder: str, levels: int) -> bool:
    """`folder` and the `levels` folders above it are each private (the cache root included)."""
    for _ in range(levels + 1):
        if not private(folder):
            return False
        folder = os.path.dirname(folder)
    return True


# Note [Open once, check the descriptor]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Checking a path and then opening it again (or handing it to dlopen) lets another local user
# swap what the path names in between (a rename of a folder they can write). So every file read
# back from TRIDENT_CACHE_DIR is opened once, without following a symbolic link, and the
# descriptor is checked (a regular file this user owns that nobody else may write); its bytes
# are read from that descriptor, and a shared library is loaded through /proc/self/fd/<fd>,
# i.e. the very file whose bytes were hashed. The folders above it, the cache root included,
# must be private too, so nobody else can place a file where a key points.
def open_private(path: str) -> int:
    """A read-only descriptor of `path` when it is a regular file this user owns that nobody
    else may write (not followed through a symbolic link); OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise PermissionError(f"{path} is not a regular file private to this user")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private(path: str) -> bytes:
    """The bytes of a private file (open_private), read from its descriptor."""
    fd = open_private(path)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def key_of(*parts: Any) -> str:
    return hashlib.sha256(repr((torch.__version__, triton.__version__) + parts).encode()).hexdigest()


_SOURCES: dict = {}


def source_digest(*modules) -> str:
    """sha256 of the source files of `modules` (once per process): what an entry's answer was
    computed by, so that another Trident's entries are not taken for this one's."""
    key = tuple(m.__name__ for m in modules)
    if key not in _SOURCES:
        h = hashlib.sha256()
        for m in modules:
            with open(m.__file__, "rb") as f:
                h.update(f.read())
        _SOURCES[key] = h.hexdigest()
    return _SOURCES[key]


TUNING_KINDS = ("decode-matmul", "decode-matmul-group", "decode-attention")  # Note [Kept measurements]


def where(kind: str) -> str:
    """The setting whose folder keeps entries of `kind` now: TRIDENT_CACHE_DIR when set, else
    TRIDENT_TUNING_DIR for the measured choices (when set), else '' (none kept)."""
    if knobs.cache_dir():
        return "TRIDENT_CACHE_DIR"
    if kind in TUNING_KINDS and knobs.tuning_dir():
        return "TRIDENT_TUNING_DIR"
    return ""


def _path(kind: str, key: str) -> Optional[str]:
    setting = where(kind)
    root = knobs.cache_dir() if setting == "TRIDENT_CACHE_DIR" else knobs.tuning_dir() if setting else ""
    return os.path.join(root, kind, key[:2], f"{key}.json") if root else None


def load(kind: str, key: str, check: Callable[[Any], bool]) -> Any:
    """The value stored under (`kind`, `key`) when a folder keeps `kind` (`where`), it is there
    and `check(value)` holds; else None."""
    path = _path(kind, key)
    if path is None:
        return None
    folder = os.path.dirname(path)
    if not private_chain(folder, 2):
        if os.path.exists(path):
            _log.debug("cached %s %s ignored: its folder is not private to this user", kind, path)
        return None
    try:
        entry = json.loads(read_private(path).decode("utf-8"))  # Note [Open once, check the descriptor]
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
