"""Stable keys for the live objects a plan names.

Note [Stable keys]
~~~~~~~~~~~~~~~~~~
The SCM IR is data (Note [A closed plan]): a program step or a specialization holds no
JITFunction, Autotuner, Heuristics, OpOverload or CompiledKernel. It names them:

  * a Triton kernel by a `KernelRef`: its function's name and a digest of what Triton itself
    keys it by -- `JITFunction.cache_key` (its source and the sources and constexpr globals it
    depends on, Triton's DependenciesFinder) -- plus, for an @triton.autotune or
    @triton.heuristics wrapper, the configs / keys / value functions it adds;
  * an operator by its name (`aten.mm.default`), which `operator` resolves through torch.ops;
  * a compiled kernel by Triton's hash of it (`CompiledKernel.hash`, the name of its entry in
    Triton's cache).

The objects stay where the process keeps them: this registry maps each key to the object that
was registered under it (capture registers the kernels of the launches it records; specialize
the kernels Triton compiles). Two objects with the same key are the same kernel as far as Triton
is concerned (same source, same dependencies), so either serves. A key is the same in another
process for the same source, which is what lets plans be written to disk and compared.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir as inductor_default_cache_dir
from triton import knobs as triton_knobs
from triton._C.libtriton import get_cache_invalidating_env_vars
from triton.compiler.compiler import CompiledKernel
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.runtime.cache import FileCacheManager, get_cache_manager

from .. import triton_state


@dataclass(frozen=True)
class KernelRef:
    """A Triton kernel (or a wrapper of one) by stable key. Prints as its name."""

    name: str
    key: str  # hex digest (Note [Stable keys])
    kind: str = "jit"  # "jit" | "autotune" | "heuristics"

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{self.name}@{self.key[:12]}"


_live: dict[KernelRef, Any] = {}
_by_object: dict[int, tuple[Any, KernelRef]] = {}  # id -> (the object, kept alive; its ref)
_compiled: dict[str, Any] = {}


def _const_digest(c) -> str:
    if hasattr(c, "co_code"):
        return _code_digest(c)
    if isinstance(c, frozenset):  # its repr's order follows the hash seed
        return "frozenset" + repr(sorted(map(_const_digest, c)))
    return repr(c)


def _code_digest(code) -> str:
    """What a code object does, the same in every process (no addresses)."""
    return repr((code.co_code, [_const_digest(c) for c in code.co_consts], code.co_names))


def _function_digest(fn) -> str:
    if fn is None:
        return "None"
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object: its class and, when it has one, its __call__'s code
        call = getattr(type(fn), "__call__", None)
        return f"{type(fn).__module__}.{type(fn).__qualname__}:{_code_digest(call.__code__) if hasattr(call, '__code__') else ''}"
    return _code_digest(code)


def _digest(kernel) -> tuple[str, str, str]:
    """(name, key, kind) of a JITFunction, Autotuner or Heuristics."""
    h = hashlib.sha256()
    if isinstance(kernel, Autotuner):
        name, inner, _ = _digest(kernel.fn)
        h.update(inner.encode())
        h.update(repr([str(c) for c in kernel.configs]).encode())
        h.update(repr(list(kernel.keys)).encode())
        for part in (getattr(kernel, "early_config_prune", None), getattr(kernel, "perf_model", None)):
            h.update(_function_digest(part).encode())
        return name, h.hexdigest(), "autotune"
    if isinstance(kernel, Heuristics):
        name, inner = _digest(kernel.fn)[:2]
        h.update(inner.encode())
        for value_name, fn in sorted(kernel.values.items()):
            h.update(value_name.encode())
            h.update(_function_digest(fn).encode())
        return name, h.hexdigest(), "heuristics"
    name = getattr(getattr(kernel, "fn", None), "__qualname__", None) or getattr(kernel, "__name__", "kernel")

    try:
        with triton_state.exclusive():  # the dependency walk reads triton.language (Note [Triton's interpreter state])
            key = kernel.cache_key  # Triton's: source and dependencies
    except Exception:  # noqa: BLE001 - a kernel Triton cannot key still needs a name here
        key = _function_digest(getattr(kernel, "fn", kernel))
    h.update(getattr(getattr(kernel, "fn", None), "__module__", "").encode())
    h.update(name.encode())
    h.update(str(key).encode())
    return name.rsplit(".", 1)[-1], h.hexdigest(), "jit"


def kernel_ref(kernel) -> KernelRef:
    """The stable key of `kernel` (a JITFunction, Autotuner or Heuristics), registering it.
    The digest does not see everything an object holds (a closure's captured values, a
    partial's arguments, decorator options), so a second, different object with the digest of a
    registered one gets its own key (the digest and a count): a key never names two objects."""
    known = _by_object.get(id(kernel))
    if known is not None and known[0] is kernel:
        return known[1]
    name, key, kind = _digest(kernel)
    ref = KernelRef(name, key, kind)
    n = 1
    while _live.setdefault(ref, kernel) is not kernel:
        ref = KernelRef(name, f"{key}#{n}", kind)
        n += 1
    _by_object[id(kernel)] = (kernel, ref)
    return ref


def live(ref: KernelRef):
    """The object registered under `ref`."""
    try:
        return _live[ref]
    except KeyError:
        raise KeyError(f"no kernel registered in this process under {ref!r} (capture registers them)") from None


def op_name(op: torch._ops.OpOverload) -> str:
    """The name `operator` resolves back to `op`: namespace.name.overload."""
    name = f"{op.namespace}.{op._schema.name.split('::', 1)[1]}.{op._overloadname}"
    if operator(name) is not op:
        raise ValueError(f"operator {op} cannot be named stably ({name} resolves to {operator(name)})")
    return name


@functools.lru_cache(maxsize=None)
def operator(name: str) -> torch._ops.OpOverload:
    """The OpOverload named `name` ("aten.mm.default", "mylib.op.overload")."""
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def register_compiled(compiled) -> str:
    """Triton's hash of a CompiledKernel, which names it from now on."""
    _compiled.setdefault(compiled.hash, compiled)
    return compiled.hash


def triton_environment() -> str:
    """A digest of the environment settings Triton's compiler keys its cache by
    (`get_cache_invalidating_env_vars`): a compiled kernel named by its hash is the one Triton
    would compile now only while these are the same."""
    return hashlib.sha256(repr(sorted(get_cache_invalidating_env_vars().items())).encode()).hexdigest()[:16]


# Triton's scalar type names (its key) -> the element types its TTIR prints (unsigned are signless there)
_TTIR_TYPES = {"fp64": "f64", "fp32": "f32", "fp16": "f16", "bf16": "bf16", "i1": "i1", "i8": "i8", "i16": "i16",
               "i32": "i32", "i64": "i64", "u1": "i1", "u8": "i8", "u16": "i16", "u32": "i32", "u64": "i64"}
_TTIR_ARG = re.compile(r"%([A-Za-z_][\w]*): (!tt\.ptr<[^>]*>|\w+)((?: \{[^}]*\})?)")


def signature_mismatch(compiled, fn, params, num_warps: "int | None" = None) -> "str | None":
    """Why `compiled`, read from Triton's cache by the hash a record names, is not the kernel of
    the launch of `fn` (the @triton.jit function) that Triton's key describes (None: it is).
    `params`: (name, (type, attribute)) per parameter, Triton's key; `num_warps`: the launch's,
    where it says. Checked from what the compiled kernel carries: its name is `fn`'s; its TTIR
    signature keeps exactly the key's non-constexpr parameters, in order and by name, each a pointer or a scalar of the key's
    element type (signless in TTIR), with the 16-divisibility the key gives it; its num_warps.
    Not checkable there: constexpr values (folded into the code) -- those are trusted as the
    record is (docs/persistent_cache.md). Not compared: the source file its TTIR locates it in --
    Triton's key hashes the source and its first line, not the file's path, so a cache shared by
    two checkouts of one program serves either with the path of the one that compiled first."""
    ttir = compiled.asm.get("ttir") if getattr(compiled, "asm", None) else None
    name = getattr(fn, "__name__", None)
    if compiled.name != name:
        return f"it is kernel {compiled.name}, the launch's is {name}"
    head = f"tt.func public @{compiled.name}("
    lines = ttir.splitlines() if isinstance(ttir, str) else []
    line = next((ln for ln in lines if head in ln), None)
    if line is None:
        return "Triton's cache holds no TTIR signature for it"
    got = [(m[1], m[2], "tt.divisibility = 16 " in m[3]) for m in _TTIR_ARG.finditer(line.split(head, 1)[1])]
    want = [(pname, ty, attr == "D") for pname, (ty, attr) in params if ty != "constexpr"]
    if [g[0] for g in got] != [w[0] for w in want]:
        return f"its parameters are {[g[0] for g in got]}, the launch passes {[w[0] for w in want]}"
    for (pname, got_ty, got_div), (_, ty, div) in zip(got, want):
        pointer = isinstance(ty, str) and ty.startswith("*")
        element = _TTIR_TYPES.get(ty[1:] if pointer else ty) if isinstance(ty, str) else None
        expect = f"!tt.ptr<{element}>" if pointer and element else element
        if pointer != got_ty.startswith("!tt.ptr<") or (expect is not None and got_ty != expect):
            return f"its parameter {pname} is {got_ty}, the launch passes {ty}"
        if got_div != div:
            return f"its parameter {pname} is {'' if got_div else 'not '}assumed 16-divisible, unlike the launch's"
    if num_warps is not None and compiled.metadata.num_warps != num_warps:
        return f"it runs {compiled.metadata.num_warps} warps, the launch {num_warps}"
    return None


def load_compiled(key: str, name: str):
    """The CompiledKernel Triton's hash `key` names: registered in this process, else read from
    Triton's own cache the way its compile reads a cache hit (`CompiledKernel(src, group, hash)`,
    no compiler and no `triton_key()` -- which hashes Triton's installation, ~0.3 s once per
    process); None when Triton's cache does not hold it (Note [Where Triton's cache is])."""
    if key in _compiled:
        return _compiled[key]

    metadata = f"{name[:150]}.json"  # the file name Triton's compile gives it
    try:
        manager = get_cache_manager(key)
        group = manager.get_group(metadata)
        if (not group or metadata not in group) and type(manager) is FileCacheManager:
            group = _group_elsewhere(manager.key, metadata)
        if not group or metadata not in group:
            return None
        compiled = CompiledKernel(None, group, key)
    except Exception:  # noqa: BLE001 - an unreadable entry: Triton compiles (or finds) it again
        return None
    if compiled.name != name or compiled.hash != key:
        return None
    return _compiled.setdefault(key, compiled)


# Note [Where Triton's cache is]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Triton's file cache is `triton.knobs.cache.dir`: TRITON_CACHE_DIR, else ~/.triton/cache. But the
# first time Inductor makes a Triton kernel in a process (torch.compile, or Trident's fused glue,
# which uses Inductor's code generator), Inductor sets TRITON_CACHE_DIR, when the user set none,
# to a folder of its own (<inductor cache>/triton/<device>) for the rest of the process. So a
# kernel compiled before that lies in one folder and one compiled after it in another, and a
# process restoring a plan (Note [Persistent plans]) may look before or after its own switch. A
# kernel missing from the current folder is therefore looked up in the others Triton may have
# used: its default and Inductor's. An entry is named by Triton's hash of everything its compile
# depends on (source, options, target, the environment it keys by), so an entry of that hash in
# any folder is that kernel; one that does not read back is ignored (the caller compiles). The
# other folders are read only where the folder, the entry and its files are the user's own and
# writable by nobody else (the folders above them are not checked) (Inductor's lies under the shared temporary directory), as Trident's own
# cache is (docs/cache.md). A cache manager of the user's own (TRITON_CACHE_MANAGER) is asked alone.

def _triton_cache_dirs() -> list[str]:
    """The folders Triton's file cache may be in for this user, the current one first."""
    dirs = [triton_knobs.cache.dir, triton_knobs.cache.get_triton_dir("cache")]
    inductor = os.path.join(os.path.abspath(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or inductor_default_cache_dir()),
                            "triton")
    try:
        dirs += [os.path.join(inductor, d) for d in sorted(os.listdir(inductor)) if d.isdigit()]
    except OSError:
        pass
    return list(dict.fromkeys(os.path.abspath(d) for d in dirs if d))


def _group_elsewhere(entry: str, metadata: str) -> Optional[dict]:
    """FileCacheManager.get_group of entry folder `entry` (Triton's name for a hash) in the
    folders other than the current one: file name -> path of the files present, or None."""
    for root in _triton_cache_dirs()[1:]:
        folder = os.path.join(root, entry)
        path = os.path.join(folder, f"__grp__{metadata}")
        try:
            if not all(_private(p) for p in (root, folder, path)):
                continue
            with open(path) as f:
                children = json.load(f).get("child_paths")
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(children, dict):
            continue
        group = {c: p for c, p in children.items()
                 if isinstance(p, str) and os.path.dirname(os.path.abspath(p)) == folder and _private(p)}
        if metadata in group:
            return group
    return None


def _private(path: str) -> bool:
    """Whether `path` exists, is the user's own, not a link, and writable by no one else: not by
    others, and by its group only where that is the user's own group (Triton writes its cache
    under the umask, 002 where each user has a group of their own)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    group_ok = not st.st_mode & 0o020 or st.st_gid == os.getgid()
    return st.st_uid == os.getuid() and not st.st_mode & 0o002 and group_ok and not stat.S_ISLNK(st.st_mode)


def compiled_kernel(key: str, name: str):
    """The CompiledKernel Triton's hash `key` names: registered in this process (register_compiled),
    else read from Triton's cache (a plan unpickled in another process, say)."""
    compiled = load_compiled(key, name)
    if compiled is None:
        raise KeyError(f"compiled kernel {name} (Triton hash {key}) is neither registered in this process nor "
                       "in Triton's cache; plan the specialization again")
    return compiled
