"""The native extension (trident._C) and the Python-side registration of its tables."""

from __future__ import annotations

import functools
import threading

import torch

from .. import _C  # noqa: F401  (loading it registers torch.ops.trident.*)
from .. import knobs, logs
from ..scm.ir import DEFAULT, AllocPlan, AtenStep, LaunchPlan, ValueRef
from ..scm.sizes import SizeExpr
from .cpu_launcher import make_cpu_runner

C = _C


@functools.lru_cache(maxsize=None)
def scalar_type_code(dtype: torch.dtype) -> int:
    return C.encode_meta(torch.empty(0, dtype=dtype)) & 0xFF


# Note [Recycled table slots] (csrc/scm_runtime.cpp): every registration and binding of native
# entries happens under TABLES_LOCK (trident/lowering/host_plan.py RegionTables.lower), and so
# does recycling, so no entry is bound while it is being recycled.
TABLES_LOCK = threading.Lock()
KERNEL, ALLOC, ATEN, VIEW, PLAN = range(5)  # the native tables, by number
# (table, entry) -> (the de-duplication map that names it, its key there)
_shared: dict[tuple[int, int], tuple[dict, tuple]] = {}
_deferred: set = set()  # candidates whose recycling waits for a later call (recycle_entries)


def shared(table: int, entries: dict, key: tuple, handle: int) -> int:
    """Records `handle` as `entries[key]`, an entry regions share (equal plans, one entry)."""
    entries[key] = handle
    _shared[(table, handle)] = (entries, key)
    return handle


def recycle_entries() -> int:
    """Note [Recycled table slots]: recycles the entries of destroyed regions that no living region
    binds; how many. Called with TABLES_LOCK held. Kernel entries are kept: one per compiled
    kernel the process ever launched (as Triton keeps them), each holding the CUDA modules it
    loaded. Entries may hold device constants a call made on another stream than the one that
    allocated them: the devices are synchronized before their memory can go back."""
    dead = _deferred | {(t, h) for t, h in C.dead_bindings() if t != KERNEL}
    _deferred.clear()
    if not dead:
        return 0
    free = dead - set(C.live_bindings())
    if free and torch.cuda.is_initialized():
        try:
            for device in range(torch.cuda.device_count()):
                torch.cuda.synchronize(device)
        except RuntimeError:  # another thread capturing a CUDA graph, say: recycled at a later miss
            _deferred.update(free)
            return 0
    for table, handle in free:
        entries, key = _shared.pop((table, handle), (None, None))
        if entries is not None and entries.get(key) == handle:
            del entries[key]
        C.recycle_entry(table, handle)
    return len(free)


def table_usage() -> dict:
    """Per native table (and the region registry): slots used and, of those, free for reuse (Note
    [Recycled table slots], Note [Region ids])."""
    names = ("kernel", "alloc", "aten", "view", "plan", "region")
    return {name: {"slots": used, "free": free} for name, (used, free) in zip(names, C.table_usage())}


_kernel_handles: dict[tuple, int] = {}


def register_launch(plan: LaunchPlan) -> int:
    """Native kernel table entry for a launch plan; one per compiled kernel and constexpr set.
    Where the plan launches a user kernel's waiting twin, the user's own kernel gets an entry too,
    which ordinary calls launch (Note [Programmatic edges only in graphs])."""
    key = (plan.step.kernel, plan.binary, plan.key, plan.cooperative, plan.pdl, plan.ordinary)
    handle = _kernel_handles.get(key)
    if handle is not None:
        return handle
    handle = _add_kernel(plan, plan.compiled, plan.pdl)
    if plan.ordinary is not None:
        own_key = (plan.step.kernel, plan.ordinary, plan.key, plan.cooperative, False, None)
        own = _kernel_handles.get(own_key)
        if own is None:
            own = shared(KERNEL, _kernel_handles, own_key, _add_kernel(plan, plan.ordinary_compiled, False))
        try:
            C.set_kernel_ordinary(handle, own)
        except RuntimeError as e:  # not the twin's launch after all: the twin serves every call, as it can
            logs.misses.warning("launch of %s: the kernel as written (Triton hash %s) cannot stand for its "
                                "waiting twin in ordinary calls (%s); the twin serves them", plan.step.kernel_name,
                                plan.ordinary, e)
    return shared(KERNEL, _kernel_handles, key, handle)


def _add_kernel(plan: LaunchPlan, compiled, programmatic: bool) -> int:
    names = [p.name for p in plan.params]
    types = [p.ty for p in plan.params]
    runner = make_cpu_runner(plan.step.fn, names, types, plan.constexprs)
    meta = compiled.metadata if compiled is not None else None
    cubin = compiled.asm.get("cubin", b"") if compiled is not None else b""
    return C.add_kernel(
        compiled.name if compiled is not None else plan.step.kernel_name,
        cubin,
        getattr(meta, "num_warps", plan.num_warps),  # its own: set_kernel_ordinary compares the two entries'
        getattr(meta, "num_ctas", plan.num_ctas),
        plan.cooperative,
        programmatic,
        getattr(meta, "shared", plan.shared) if meta is not None else plan.shared,
        getattr(meta, "global_scratch_size", 0) or 0,
        getattr(meta, "global_scratch_align", 1) or 1,
        getattr(meta, "profile_scratch_size", 0) or 0,
        getattr(meta, "profile_scratch_align", 1) or 1,
        types,
        runner,
    )


_alloc_handles: dict[tuple, int] = {}


def register_alloc(plan: AllocPlan) -> int:
    """Native allocation entry; entries are immutable, so equal plans share one (a miss that
    changes only an alignment registers none)."""
    f = plan.facts
    key = (f, plan.step.zero, plan.step.slot, plan.arena_offset, plan.arena_bytes, plan.dynamic, plan.arena_slot)
    handle = _alloc_handles.get(key)
    if handle is None:
        handle = shared(ALLOC, _alloc_handles, key, C.add_alloc(
            list(f.sizes), list(f.strides), torch.empty(0, dtype=f.dtype), str(f.device), plan.step.zero,
            plan.step.slot, plan.arena_offset, plan.arena_bytes, plan.dynamic, plan.arena_slot,
        ))
    return handle


def _arg_spec(value, syms: list):
    """The native argument template of one operator argument; the SizeExprs in it are appended to
    `syms` and named by their index there (the host program computes them: Note [Symbolic sizes])."""
    if isinstance(value, ValueRef):
        return (value.kind, value.index)
    if value is DEFAULT:
        return ("default",)
    if isinstance(value, SizeExpr):
        syms.append(value)
        return ("sym", len(syms) - 1)
    if isinstance(value, list) and any(isinstance(v, SizeExpr) for v in value):
        return ("intlist", [_arg_spec(v, syms) if isinstance(v, SizeExpr) else ("const", int(v)) for v in value])
    if isinstance(value, list) and any(isinstance(v, ValueRef) for v in value):
        return ("list", [_arg_spec(v, syms) for v in value])
    return ("const", value)


def aten_sizes(step: AtenStep) -> list:
    """The SizeExprs of an operator step, in the order its native template indexes them."""
    syms: list = []
    for a in step.args:
        _arg_spec(a, syms)
    return syms


def register_aten(step: AtenStep) -> int:
    """Native call entry for an operator step: the op by name, an argument template."""
    schema = step.op._schema
    name, _, overload = schema.name, None, schema.overload_name
    syms: list = []
    return C.add_aten(
        name, overload, [_arg_spec(a, syms) for a in step.args], list(step.outputs), step.cached,
        knobs.native_path("typed") and not syms, knobs.native_path("gemm"),
    )


def kernel_function(kernel_handle: int, device: int) -> int:
    return C.kernel_function(kernel_handle, device)


def gemm_stats(region_id: int, local_aten: int) -> dict | None:
    """The cuBLASLt path of one aten::mm entry (Note [Cached GEMM plans]): calls taken and
    declined, and the plans built; None when the entry has no such path."""
    stats = C.gemm_stats(region_id, local_aten)
    if stats is None:
        return None
    taken, declined, plans = stats
    keys = ("scalar_type", "m", "n", "k", "op_a", "op_b", "workspace", "device")
    return {"taken": taken, "declined": declined, "plans": [dict(zip(keys, p)) for p in plans]}
