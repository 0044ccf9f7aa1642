"""Stage 2 of the lowering, first half: a specialization's steps as a table (Note [Host plans]).

Note [Host plans]
~~~~~~~~~~~~~~~~~
A specialization's plan is a list of ops the native runtime walks (scm_runtime.h: HostPlan,
`run_plan`): allocate slot s, call operator j, make view v, launch kernel k with these parameter
sources and this grid, release slot s. A parameter's source is a constant's raw bits, an input's
data pointer, a value's data pointer, a base pointer plus a planned byte offset (a view only
kernels read), or an entry of the size program's array (Note [Symbolic sizes]), and it may be
checked for the 16-byte alignment the kernel was specialized on. The generated host program
(scm_to_llvm.py) keeps what must be native code: the guards (a constant table walked by a loop,
plus the size guards as expressions), the size program (every SizeExpr the plan reads, computed
into an array), and the call of `run_plan`. So building a specialization emits a few dozen MLIR
operations whatever the region's size, instead of ~20 per step, and LLVM compiles it in
milliseconds (issue 11: a 24-layer decode specialization went from ~19,000 MLIR operations and
0.7 s of LLVM to ~40 and a few ms; tools/bench_miss.py). Walking the table costs a few ns per
step against the direct calls it replaces, small beside the services themselves (an operator
call through the dispatcher, a kernel launch), and nothing at all on a graph replay.

The table is plain data derived from the Specialization and the native indices its entries
were registered under (`host_plan`), and prints readably (`format_plan`). `RegionTables` is the
one place that registers a region's native state: a specialization's allocation plans, operator
calls, views, kernels and the table itself (Note [A closed plan]: the Specialization holds no
runtime handles; they live in its HostPlan).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..runtime import native
from ..runtime.native import aten_sizes
from ..scm import sizes as S
from ..scm.ir import SCM, AllocStep, AtenStep, LaunchPlan, Param, Specialization, ValueRef

# scm_runtime.h: PlanOp::Kind and PlanSource::Kind
OP_KINDS = {"alloc": 0, "aten": 1, "view": 2, "launch": 3, "release": 4}
SOURCE_KINDS = {"const": 0, "input": 1, "value": 2, "address": 3, "size": 4}
MAX_PARAMS = 256  # HostPlan::kMaxParams


def slot_bits(ty: str, value) -> int:
    """Raw bits of a scalar kernel parameter, zero-extended to 64 bits (Note [Host ABI])."""
    if ty in ("i1", "u1"):
        return int(bool(value))
    if ty[0] in "iu":
        width = int(ty[1:])
        return int(value) & ((1 << width) - 1)
    if ty == "fp32":
        return struct.unpack("<I", struct.pack("<f", float(value)))[0]
    if ty == "fp64":
        return struct.unpack("<Q", struct.pack("<d", float(value)))[0]
    if ty in ("fp16", "bf16"):
        dt = torch.float16 if ty == "fp16" else torch.bfloat16
        return int(torch.tensor(float(value), dtype=dt).view(torch.int16).item()) & 0xFFFF
    raise ValueError(f"no slot encoding for kernel parameter type {ty!r}")


@dataclass(frozen=True)
class Source:
    """Where a launch parameter or grid dimension comes from (scm_runtime.h: PlanSource)."""

    kind: str  # const | input | value | address | size
    a: int = 0  # const: raw bits; input: index; value: slot; address: slot, or -(input + 1); size: index
    b: int = 0  # address: byte offset; size: mask of the parameter's width
    aligned: bool = False  # checked for 16-byte alignment (a 'D' pointer the plan cannot guard)

    def native(self) -> tuple:
        return (SOURCE_KINDS[self.kind], self.a, self.b, self.aligned)

    def __str__(self) -> str:
        check = " aligned16" if self.aligned else ""
        if self.kind == "const":
            return f"{self.a}"
        if self.kind == "input":
            return f"input{self.a}{check}"
        if self.kind == "value":
            return f"%{self.a}{check}"
        if self.kind == "address":
            base = f"input{-self.a - 1}" if self.a < 0 else f"%{self.a}"
            return f"{base}+{self.b}B{check}"
        mask = "" if self.b == -1 else f" & {hex(self.b)}"
        return f"sizes[{self.a}]{mask}"


@dataclass(frozen=True)
class PlanOp:
    kind: str  # alloc | aten | view | launch | release
    index: int  # region-local alloc / aten / view / kernel index; release: the value slot
    name: str  # the step's name, for printing
    sizes: int = -1  # >= 0: where this op's symbolic sizes start in the sizes array
    grid: tuple = ()  # launch: three Sources
    params: tuple = ()  # launch: one Source per non-constexpr parameter
    labels: tuple = ()  # launch: the kernel's name, then "name: type" per parameter (printing)

    def native(self) -> tuple:
        grid = [g.native() for g in self.grid]
        return (OP_KINDS[self.kind], self.index, self.sizes, grid, [p.native() for p in self.params])


@dataclass(frozen=True)
class ArenaEntry:
    """One buffer of a symbolic arena as the runtime places it (scm_runtime.h: ArenaBuffer)."""

    slot: int  # the value it becomes (printing)
    sizes_at: int  # >= 0: its allocation's sizes then strides start at sizes[this]; -1: fixed bytes
    rank: int
    itemsize: int
    nbytes: int  # fixed bytes (sizes_at < 0)
    below: tuple  # arena entries it is placed above

    def __str__(self) -> str:
        size = f"{self.nbytes} B" if self.sizes_at < 0 else f"span of sizes@{self.sizes_at} x {self.itemsize} B"
        above = f" above {', '.join(f'arena[{j}]' for j in self.below)}" if self.below else " at 0"
        return f"%{self.slot}: {size}{above}"


@dataclass
class HostPlan:
    ops: list[PlanOp]
    # the size program: what the host computes into the sizes array, in order (SizeExprs; ints
    # where a dynamic allocation's layout mixes them)
    sizes: list = field(default_factory=list)
    handle: int = -1  # region-local index of the registered table (the host program bakes it)
    handles: Optional["Handles"] = None  # the native indices its ops name
    arena: list = field(default_factory=list)  # Note [Symbolic arena]: ArenaEntry per buffer

    def native(self) -> list:
        return [op.native() for op in self.ops]


@dataclass
class Handles:
    """Region-local native indices of one specialization's entries (runtime state, not plan)."""

    allocs: dict = field(default_factory=dict)  # value slot -> allocation plan
    atens: dict = field(default_factory=dict)  # step name -> operator call
    views: dict = field(default_factory=dict)  # step name -> native view
    kernels: list = field(default_factory=list)  # per launch of the specialization -> kernel entry

    def record(self) -> list:
        """What a persisted host program baked in (Note [Persistent plans] checks it on restore)."""
        return [sorted(self.allocs.items()), sorted(self.atens.items()), sorted(self.views.items()), list(self.kernels)]


_view_entries: dict[tuple, int] = {}


class RegionTables:
    """Registers the native state of a region's specializations (Note [Host plans]); operator
    calls are shared by every specialization (their templates do not depend on one)."""

    def __init__(self, region_id: int, name: str):
        self.region_id = region_id
        self.name = name
        self.atens: dict[str, int] = {}  # step name -> region-local operator call

    def lower(self, scm: SCM, spec: Specialization) -> HostPlan:
        with native.TABLES_LOCK:  # Note [Recycled table slots]: nothing is recycled while entries are bound
            native.recycle_entries()
            return self._lower(scm, spec)

    def _lower(self, scm: SCM, spec: Specialization) -> HostPlan:
        bind = native.C.region_bind
        h = Handles()
        for plan in spec.allocs:
            h.allocs[plan.step.slot] = bind(self.region_id, "alloc", native.register_alloc(plan))
        for plan in spec.atens:
            if plan.step.name not in self.atens:
                self.atens[plan.step.name] = bind(self.region_id, "aten", native.register_aten(plan.step))
            h.atens[plan.step.name] = self.atens[plan.step.name]
        for name, view in spec.views.items():
            if view.pointer_only:
                continue  # never materialized: the host computes its address
            f, b = view.facts, view.base_facts
            # Note [Symbolic views]: a dynamic view reads its layout from its run of the sizes
            # array, after the operator's own size arguments (the fallback's)
            layout_at = len(aten_sizes(view.step)) if view.dynamic else -1
            args = (view.base.kind == "input", view.base.index, tuple(b.sizes), tuple(b.strides), tuple(f.sizes),
                    tuple(f.strides), view.offset_delta, view.step.outputs[0], self.atens[name], layout_at)
            entry = _view_entries.get(args)  # entries are immutable: equal ones are shared
            if entry is None:
                entry = native.shared(native.VIEW, _view_entries, args, native.C.add_view(*args))
            h.views[name] = bind(self.region_id, "view", entry)
        h.kernels = [bind(self.region_id, "kernel", native.register_launch(plan)) for plan in spec.launches]
        table = host_plan(scm, spec, h)
        arena = [(b.sizes_at, b.rank, b.itemsize, b.nbytes, list(b.below)) for b in table.arena]
        table.handle = bind(self.region_id, "plan", native.C.add_plan(f"{self.name}.{spec.index}", table.native(), arena))
        return table


def host_plan(scm: SCM, spec: Specialization, handles: Handles) -> HostPlan:
    """The table of `spec`'s steps, in program order, naming the native entries by `handles`."""
    sizes: list = []
    memo: dict = {}

    def size_index(expr: S.SizeExpr) -> int:
        key = str(expr.expr)
        if key not in memo:
            memo[key] = len(sizes)
            sizes.append(expr)
        return memo[key]

    def size_run(values) -> int:
        """Appends `values` as one contiguous run of the sizes array (what set_sizes hands a
        service); returns where it starts."""
        begin = len(sizes)
        sizes.extend(values)
        return begin

    address_only = {v.step.outputs[0]: v for v in spec.views.values() if v.pointer_only}

    def pointer(ref: ValueRef, aligned: bool) -> Source:
        if ref.kind == "input":
            return Source("input", ref.index)
        delta = 0
        slot = ref.index
        while slot in address_only:  # a view only kernels read: its base's pointer + the offset
            view = address_only[slot]
            delta += view.delta_bytes
            if view.base.kind == "input":
                return Source("address", -view.base.index - 1, delta, aligned)
            slot = view.base.index
        if delta:
            return Source("address", slot, delta, aligned)
        return Source("value", slot, 0, aligned)

    def param(p: Param, launch: LaunchPlan) -> Source:
        src = p.source
        if isinstance(src, ValueRef):
            return pointer(src, src.kind == "value" and src.index in launch.aligned_values)
        if isinstance(src, S.SizeExpr):  # an integer computed from sizes; its key is guarded
            width = int(p.ty[1:]) if p.ty[0] in "iu" and p.ty[1:].isdigit() else 64
            return Source("size", size_index(src), (1 << width) - 1 if width < 64 else -1)
        bits = slot_bits(p.ty, src)
        return Source("const", bits - (1 << 64) if bits >= 1 << 63 else bits)

    def grid_source(g) -> Source:
        return Source("size", size_index(g), -1) if isinstance(g, S.SizeExpr) else Source("const", int(g))

    ops: list[PlanOp] = []
    allocs = {plan.step.slot: plan for plan in spec.allocs}
    atens = iter(spec.atens)
    launches = iter(zip(spec.launches, handles.kernels))
    for step_index, step in enumerate(scm.program.steps):
        if isinstance(step, AllocStep):
            plan = allocs[step.slot]
            begin = size_run(tuple(plan.sizes_expr) + tuple(plan.strides_expr)) if plan.dynamic else -1
            ops.append(PlanOp("alloc", handles.allocs[step.slot], step.name, begin))
        elif isinstance(step, AtenStep):
            plan = next(atens)
            view = spec.views.get(step.name)
            if view is not None and view.pointer_only:
                pass  # only kernels read it: its address is computed where used
            elif view is not None and view.dynamic:  # Note [Symbolic views]
                bsizes, bstrides, vsizes, vstrides, delta = view.exprs
                run = tuple(aten_sizes(step)) + bsizes + bstrides + vsizes + vstrides + (delta,)
                ops.append(PlanOp("view", handles.views[step.name], step.name, size_run(run)))
            elif view is not None:  # its fallback operator reads its own size arguments, if any
                syms = aten_sizes(step)
                ops.append(PlanOp("view", handles.views[step.name], step.name, size_run(syms) if syms else -1))
            else:
                syms = aten_sizes(step)
                ops.append(PlanOp("aten", handles.atens[step.name], step.name, size_run(syms) if syms else -1))
        else:
            launch, kernel = next(launches)
            if len(launch.params) > MAX_PARAMS:
                raise ValueError(f"{step.name}: {len(launch.params)} kernel parameters; at most {MAX_PARAMS} are supported")
            grid = tuple(grid_source(g) for g in (launch.grid or launch.step.grid))
            params = tuple(param(p, launch) for p in launch.params)
            labels = (launch.step.kernel_name,) + tuple(f"{p.name}: {p.ty}" for p in launch.params)
            ops.append(PlanOp("launch", kernel, step.name, -1, grid, params, labels))
        for slot in spec.releases.get(step_index, ()):  # Note [Early release]
            ops.append(PlanOp("release", slot, scm.program.value_names[slot]))
    # Note [Symbolic arena]: each buffer's bytes come from its allocation's run of the sizes array
    # (sizes, then strides) when they depend on sizes
    runs = {op.name: op.sizes for op in ops if op.kind == "alloc"}
    alloc_runs = {plan.step.slot: runs.get(plan.step.name, -1) for plan in spec.allocs}
    arena = []
    for buf in spec.arena:
        f = spec.value_facts[buf.slot]
        at = alloc_runs[buf.slot] if buf.nbytes < 0 else -1
        if buf.nbytes < 0 and at < 0:
            raise ValueError(f"arena buffer %{buf.slot} is sized per call but its allocation computes no sizes")
        arena.append(ArenaEntry(buf.slot, at, len(f.sizes), f.dtype.itemsize, max(buf.nbytes, 0), buf.below))
    return HostPlan(ops, sizes, handles=handles, arena=arena)


def format_plan(plan: HostPlan, index: int = 0) -> str:
    """The table as text, one op per line (dumps and goldens)."""
    lines = [f"plan of specialization {index}: {len(plan.ops)} ops"]
    for k, e in enumerate(plan.sizes):
        lines.append(f"  sizes[{k}] = {e}")
    for k, e in enumerate(plan.arena):
        lines.append(f"  arena[{k}] = {e}")
    for op in plan.ops:
        sizes = f" sizes@{op.sizes}" if op.sizes >= 0 else ""
        if op.kind == "launch":
            grid = ", ".join(str(g) for g in op.grid)
            kernel, labels = op.labels[0], op.labels[1:]
            lines.append(f"  launch #{op.index} {kernel}[{grid}] ({op.name})")
            for label, p in zip(labels, op.params):
                value = hex(p.a & (2**64 - 1)) if p.kind == "const" and label.split(": ")[1].startswith(("fp", "bf")) else p
                lines.append(f"      {label} = {value}")
        elif op.kind == "release":
            lines.append(f"  release %{op.index} ({op.name})")
        else:
            lines.append(f"  {op.kind} #{op.index} {op.name}{sizes}")
    return "\n".join(lines)
