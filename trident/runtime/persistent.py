"""Plans that outlive the process: TRIDENT_CACHE_DIR.

Note [Persistent plans]
~~~~~~~~~~~~~~~~~~~~~~~
With TRIDENT_CACHE_DIR set, every specialization a region builds is written there as its closed
record (Note [A closed plan]) when it is built (Note [A specialization proves itself]: the record
of one whose first run failed is removed again; restoring stops at that gap) and a later process that optimizes the same region restores them
instead of planning: no value propagation, no autotuner benchmarks, and Triton's kernels from
Triton's own on-disk cache (its compile finds them; nothing is compiled again). The host
program of each specialization is kept too, as a shared library (the ExecutionEngine's object
file linked with `ld -shared`; host.<sha256>.so): its sha256 is in the entry and checked before
it is loaded (ctypes), and it is used only when the restored specialization binds the same
native table indices it baked in; otherwise, or without a linker, it is built again (LLVM at
-O0, Note [One host program per specialization]).

  * Key: sha256 over the region's program as printed (steps, operators, constants, grids), its
    captured input facts, each kernel's Triton cache key (source and the globals it reads),
    autotuner configs, and the versions of Trident (and a digest of its sources and native
    extension), torch, triton, torch-mlir, the knobs that shape plans, plus the compute
    capability of each CUDA device the inputs are on. One folder per key; `spec-<serves>.json` per
    specialization.
  * An entry is {"versions", "key" (the region key it was filed under), "sha256" of its payload,
    native record and key, "payload"}, in `spec-<serves>.json`, named by a digest of what the
    specialization serves (its input guards and size guards): processes that plan the same
    specialization write the same file, those that plan others write other files, so writers
    racing on a cold folder never lose or duplicate a record (Note [Records named by what they
    serve]). It is written to a temporary file and renamed (readers never see half a file).
    Folders are created 0700; an existing cache root is used when it belongs to this user and
    nobody else may write it (its mode is the user's).
  * On load an entry whose JSON does not parse (truncated), whose hash does not match (corrupt)
    or whose versions differ (foreign) is rejected with a line on the `trident.misses` logger
    and removed, as is one filed under another key; entries and libraries are read only when
    they and every folder up to the cache root belong to this user and nobody else may write
    them, through one descriptor (Note [Open once, check the descriptor]); a restored
    specialization must serve the layouts its region serves (its guards pass the region's own
    layout guards); otherwise the specialization is built again and written anew. Every valid
    entry is restored, in the order its writer selected them (the index recorded in it, then
    the file's age); a rejected one is skipped, not the ones after it.

Note [Records named by what they serve]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Records used to be named by specialization index (spec0.json, spec1.json, ...). Two processes
starting cold on one folder each built their own specialization 0 -- for different shapes, say
-- and the second rename replaced the first's record (lost), while its specialization 1 could be
the other's 0 (duplicated). The index is only a selection order, and guards are sound in any
order, so the name is now a digest of what a specialization serves, and the index is a sort key
inside it. The host library baked the native table indices of the process that wrote it: one
restored at another position does not bind the same indices (`handles` in its record) and is
built again and written anew; the library no record names then is removed by a later write to the
folder (`_drop_orphans`, once a minute old: another process may be about to name a fresh one).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata as md
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any, Optional

import torch
import triton

from .. import knobs, logs
from ..disk_cache import make_private_dirs, open_private, private_chain, read_private
from ..scm.printer import format_facts, format_program
from ..scm.serialize import FORMAT

_log = logs.misses


def versions(devices) -> dict:
    def version(dist):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "unknown"

    caps = sorted(
        f"{d}:sm_{''.join(map(str, torch.cuda.get_device_capability(d)))}" for d in {str(x) for x in devices}
        if d.startswith("cuda")
    )
    return {"plan_format": FORMAT, "trident": version("trident-scm"), "trident_build": _build_digest(),
            "torch": torch.__version__, "triton": triton.__version__, "torch_mlir": version("torch-mlir"),
            "devices": caps, "knobs": {k: knobs.get(k) for k in _PLAN_KNOBS}}


# Knobs that change what a plan or a host program is.
_PLAN_KNOBS = ("native_paths", "triton_copies", "compile_cubin_on_cpu", "mlir_opt_level", "pdl", "pdl_user_kernels")
_BUILD_DIGEST: list = []


def _build_digest() -> str:
    """sha256 of Trident itself: its Python and C++ sources, and its native extension's size and
    modification time (reading its ~30 MB costs more than the rest of a warm start's checks; any
    rebuild rewrites it). Records and host programs bake in the planner's output and the host
    ABI (runtime table order, facts layout, type codes), so any change of Trident's code -- not
    only of its version number -- makes other entries foreign."""
    if not _BUILD_DIGEST:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the trident package
        h = hashlib.sha256()
        for folder, dirs, files in sorted(os.walk(root)):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(folder, name)
                if name.endswith((".py", ".h", ".cpp")):
                    h.update(os.path.relpath(path, root).encode())
                    with open(path, "rb") as f:
                        h.update(f.read())
                elif name.endswith(".so"):
                    st = os.stat(path)
                    h.update(f"{os.path.relpath(path, root)}:{st.st_size}:{st.st_mtime_ns}".encode())
        _BUILD_DIGEST.append(h.hexdigest())
    return _BUILD_DIGEST[0]


def region_key(scm) -> str:
    program = scm.program
    parts = list(format_program(scm))
    parts += [format_facts(f) for f in program.captured_inputs]
    parts += [repr(g.record()) for g in program.size_guards]  # Note [Symbolic sizes]
    for step in program.launches:  # Note [Stable keys]: Triton's cache key, autotuner configs and all
        parts.append(f"{step.name}: {step.kernel.key} {step.tuner.key if step.tuner is not None else ''}")
    parts.append(json.dumps(versions(f.device for f in program.captured_inputs), sort_keys=True))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


_LOADED_FDS: list = []  # descriptors of the host libraries loaded from the cache (load_native)


def _digest(payload: dict, native: Optional[dict], key: str) -> str:
    """What an entry's hash covers: the plan, the record of its host program's library, and the
    region key it was filed under (an entry copied into another region's folder is foreign)."""
    return hashlib.sha256(
        json.dumps({"payload": payload, "native": native, "key": key}, sort_keys=True).encode()
    ).hexdigest()


class PlanCache:
    """The records of one region in TRIDENT_CACHE_DIR (Note [Persistent plans])."""

    def __init__(self, root: str, key: str, name: str, devices):
        self.key = key
        self.folder = os.path.join(root, key[:2], key)
        self.name = name
        self.versions = versions(devices)

    @staticmethod
    def for_region(scm) -> "Optional[PlanCache]":
        root = knobs.cache_dir()
        if not root:
            return None
        return PlanCache(root, region_key(scm), scm.program.name, (f.device for f in scm.program.captured_inputs))

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    @staticmethod
    def record_name(payload: dict) -> str:
        """Note [Records named by what they serve]: the file of a specialization's record."""
        serves = json.dumps([payload.get("guards"), payload.get("size_guards")], sort_keys=True)
        return f"spec-{hashlib.sha256(serves.encode()).hexdigest()[:24]}.json"

    def entries(self) -> "list[tuple[str, dict, Optional[dict]]]":
        """(name, plan payload, native record or None) of every valid record of the region, in
        the order its writers selected them (Note [Records named by what they serve]); rejected
        ones are removed and skipped."""
        try:
            names = [n for n in os.listdir(self.folder) if n.startswith("spec-") and n.endswith(".json")]
        except FileNotFoundError:
            return []
        except OSError as e:
            _log.warning("%s: persistent plans in %s not read (%s); building them again", self.name, self.folder, e)
            return []
        if not names:
            return []
        if not private_chain(self.folder, 2):  # Note [Open once, check the descriptor]
            _log.warning("%s: persistent plans in %s not read: the folder (or one above it, up to the cache root) is "
                         "not private to this user; building them again", self.name, self.folder)
            return []
        found = []
        for name in sorted(names):
            loaded = self._load(name)
            if loaded is not None:
                payload, native_record, written = loaded
                index = payload.get("index")
                found.append((index if isinstance(index, int) else 1 << 62, written, name, payload, native_record))
        found.sort(key=lambda e: e[:3])
        return [(name, payload, native_record) for _, _, name, payload, native_record in found]

    def _load(self, name: str) -> "Optional[tuple[dict, Optional[dict], int]]":
        """(plan payload, native record or None, modification time in ns) of record `name`, or
        None (absent or rejected: removed); the folder's chain was checked by `entries`."""
        path = self._path(name)
        if os.sep in name or not os.path.lexists(path):
            return None
        try:
            fd = open_private(path)  # Note [Open once, check the descriptor]
            try:
                written = os.fstat(fd).st_mtime_ns
                with os.fdopen(fd, "rb", closefd=False) as f:
                    raw = f.read()
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            _log.warning("%s: persistent plan %s not read (%s); building it again", self.name, path, e)
            return None
        why = None
        try:
            entry = json.loads(raw.decode("utf-8"))
            if not isinstance(entry, dict) or "payload" not in entry:
                why = "not a plan entry"
            elif entry.get("versions") != self.versions:
                why = "written by another build (versions, Trident's code or plan knobs differ)"
            elif entry.get("key") != self.key:
                why = "filed under another region's key"
            elif entry.get("sha256") != _digest(entry["payload"], entry.get("native"), self.key):
                why = "its hash does not match its content (corrupt)"
            elif not isinstance(entry["payload"], dict) or self.record_name(entry["payload"]) != name:
                why = "filed under another specialization's name"
        except ValueError as e:  # UnicodeDecodeError included
            why = f"not valid JSON (truncated?): {e}"
        if why is not None:
            self.reject(name, why)
            return None
        return entry["payload"], entry.get("native"), written

    def load_native(self, native: dict) -> "Optional[tuple[Any, int, int]]":
        """(library, host address, select address) of a cached host program, hash-checked
        before it is loaded; None when it is absent or does not match (then it is rebuilt)."""
        name = str(native.get("file", ""))
        path = os.path.join(self.folder, name)
        if os.sep in name or not private_chain(self.folder, 2):
            _log.warning("%s: cached host program %s not loaded: its folder (or one above it, up to the cache root) "
                         "is not private to this user; building it again", self.name, path)
            return None
        # Note [Open once, check the descriptor]: hashed and loaded through one descriptor
        try:
            fd = open_private(path)
        except OSError as e:
            _log.warning("%s: cached host program %s not loaded (%s); building it again", self.name, path, e)
            return None
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            lib = host = select = None
            if digest != native.get("sha256"):
                _log.warning("%s: cached host program %s rejected: its hash does not match; building it again",
                             self.name, path)
            else:
                lib, host, select = self._dlopen(fd, path)
        except BaseException:
            os.close(fd)
            raise
        if lib is None or host is None:
            os.close(fd)
            return None
        # The descriptor stays open for the process: dlopen knows a loaded library by the name it
        # was opened with, and a later library opened at the same descriptor number would be
        # handed this one's handle (libraries are never unloaded, one descriptor each).
        _LOADED_FDS.append(fd)
        return lib, host, select

    def _dlopen(self, fd: int, path: str):
        """(library, host address, select address) loaded through descriptor `fd`, or Nones."""
        try:
            lib = ctypes.CDLL(f"/proc/self/fd/{fd}")
            host = ctypes.cast(getattr(lib, "_mlir_scm_host"), ctypes.c_void_p).value
            select = ctypes.cast(getattr(lib, "_mlir_scm_select"), ctypes.c_void_p).value
        except (OSError, AttributeError) as e:
            _log.warning("%s: cached host program %s could not be loaded (%s); building it again", self.name, path, e)
            return None, None, None
        return lib, host, select

    def store_native(self, engine) -> Optional[dict]:
        """Writes the host program an ExecutionEngine compiled as a shared library (its object
        file linked with `ld -shared`); the record to keep in the entry, or None where that is
        not possible here (no linker: the host program is then rebuilt on a warm start)."""
        linker = shutil.which("ld")
        if linker is None:
            return None
        try:
            make_private_dirs(self.folder)
            fd, obj = tempfile.mkstemp(dir=self.folder, prefix=".host.", suffix=".o")
            os.close(fd)
            fd, lib = tempfile.mkstemp(dir=self.folder, prefix=".host.", suffix=".so")
            os.close(fd)
            try:
                engine.dump_to_object_file(obj)
                done = subprocess.run([linker, "-shared", "-o", lib, obj], capture_output=True, text=True)
                if done.returncode != 0:
                    _log.debug("%s: ld failed on a host program: %s", self.name, done.stderr[-500:])
                    return None
                os.chmod(lib, 0o600)  # ld gives its output 0755 less the umask; files here are 0600
                with open(lib, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                name = f"host.{digest[:24]}.so"  # by content: writers of one program write one file
                os.replace(lib, os.path.join(self.folder, name))
            finally:
                for leftover in (obj, lib):
                    if os.path.exists(leftover):
                        os.remove(leftover)
        except OSError as e:
            _log.debug("%s: could not write a host program: %s", self.name, e)
            return None
        return {"file": name, "sha256": digest}

    def reject(self, name: str, why: str) -> None:
        _log.warning("%s: persistent plan %s rejected: %s; building it again", self.name, self._path(name), why)
        try:
            os.remove(self._path(name))
        except OSError:
            pass

    def _libraries(self) -> set:
        """The host libraries the folder's records name."""
        names = set()
        for record in os.listdir(self.folder):
            if record.startswith("spec-") and record.endswith(".json"):
                try:
                    # as every read: one descriptor, no link followed (Note [Open once, check the descriptor])
                    native = json.loads(read_private(self._path(record)).decode("utf-8")).get("native") or {}
                    names.add(str(native.get("file", "")))
                except (OSError, ValueError, AttributeError):
                    continue
        return names

    def _drop_orphans(self, written: Optional[dict]) -> None:
        """Removes host libraries no record names any more (a record rewritten with a rebuilt
        library leaves its old one behind); `written`: the native record just stored, kept. One
        written in the last minute is kept too: another process may be about to name it."""
        try:
            if not private_chain(self.folder, 2):
                return
            libraries = [n for n in os.listdir(self.folder) if n.startswith("host.") and n.endswith(".so")]
            if not libraries:
                return
            named = self._libraries() | {str((written or {}).get("file", ""))}
            now = time.time()
            for lib in libraries:
                path = self._path(lib)
                if lib not in named and now - os.lstat(path).st_mtime > 60:
                    os.remove(path)
        except OSError as e:
            _log.debug("%s: could not remove unused host libraries: %s", self.name, e)

    def store(self, payload: dict, native: Optional[dict] = None) -> str:
        """Writes a specialization's record; its name (Note [Records named by what they serve])."""
        name = self.record_name(payload)
        try:
            make_private_dirs(self.folder)
            entry = {"versions": self.versions, "key": self.key, "sha256": _digest(payload, native, self.key),
                     "payload": payload, "native": native}
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".spec.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(entry, f)
                os.replace(tmp, self._path(name))
            except BaseException:
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise
        except OSError as e:  # a read-only or full disk costs the cache, never the call
            _log.warning("%s: could not write persistent plan %s: %s", self.name, self._path(name), e)
            return name
        self._drop_orphans(native)
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("%s: persistent plan %s written", self.name, self._path(name))
        return name
