"""Stage 2 of the lowering: SCM IR + the region in torch dialect -> the native host program.

The host program is two functions in the func/arith/cf/llvm dialects (ABI:
trident/csrc/scm_runtime.h, Note [Host ABI]): `scm_select(rt, ctx) -> i64`, the guard prologue,
and `scm_host(rt, ctx) -> i64`, which calls it and runs the plan. Together they
  1. load the input facts the native prologue wrote (data pointer, dtype/device code, rank,
     sizes, strides per input) and evaluate every specialization's guards on them, in order;
  2. for the first specialization whose guards hold, walks the region's steps in the order of
     the torch-dialect function: each allocation calls the runtime's `alloc` service (and
     checks the 16-byte alignment the kernels were specialized on), each
     `trident.triton_launch` packs the kernel's parameters into 64-bit slots and calls the
     runtime's `launch` service with the kernel's handle and grid;
  3. returns the specialization's index, -1 when no guard set holds (a miss), -2 when a
     runtime service failed.
Every constant a decision needs (expected codes, handles, grids, scalar bits) is baked in; in
a symbolic program (Note [Symbolic sizes]) grids, integer arguments and the sizes of dynamic
allocations and size arguments are computed from the input facts, and the size guards (shape
relations, facts tied to symbols, Triton's integer keys) join the tensor guards in scm_select.
"""

from __future__ import annotations

import struct

import torch
from torch_mlir import ir
from torch_mlir.dialects import arith, cf, func, llvm

from ..scm import sizes as S
from ..scm.sizes import INT_KEY_CODES
from ..scm.guards import FactEquals, IntegerKey, SizeRelation
from ..scm.ir import SCM, AllocStep, AtenStep, LaunchPlan, LaunchStep, Param, Specialization, ValueRef
from .region_to_torch import LAUNCH_OP_NAME, op_step

FACTS_FIXED = 3  # data_ptr, meta, ndim (scm_runtime.h: kFactsFixed)
RT_ALLOC, RT_LAUNCH, RT_ATEN, RT_VALUE_PTR, RT_VIEW, RT_RELEASE, RT_SET_SIZES = 0, 1, 2, 3, 4, 5, 6  # RuntimeTable
HOST_SYMBOL = "scm_host"
SELECT_SYMBOL = "scm_select"  # guards and selection only: returns the index or -1

_DEVICE_TYPE = {"cpu": 0, "cuda": 1}


def dtype_code(dtype: torch.dtype) -> int:
    """c10::ScalarType value of a dtype, as the native prologue encodes it."""
    from ..runtime.native import scalar_type_code

    return scalar_type_code(dtype)


def meta_code(dtype: torch.dtype, device: torch.device) -> int:
    """The prologue's meta fact for a tensor (scm_runtime.cpp: encode_meta)."""
    index = device.index if device.index is not None else (0 if device.type == "cuda" else -1)
    return dtype_code(dtype) | (_DEVICE_TYPE[device.type] << 8) | ((index + 1) << 16)


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


# Note [Integer keys]
# Triton keys an int argument (runtime/jit.py -> native_specialize_impl) as ('constexpr', 1)
# when specialized and equal to 1, else by type -- i32 for [-2**31, 2**31), i64 beyond -- with
# attribute 'D' when specialized and divisible by 16, '' when not, None when the parameter is
# do_not_specialize. Facts are int64, so u64 (>= 2**63) cannot occur. The host program encodes
# a key as one of these codes; tests check the emitted code against Triton on many values.
# the codes (trident/scm/sizes.py: INT_KEY_CODES, shared with the guard table)


def emit_int_key(value, specialize: bool):
    """MLIR computing the Note [Integer keys] code of the i64 `value` (at the insertion point)."""
    i64 = ir.IntegerType.get_signless(64)

    def c(v):
        return arith.constant(i64, v)

    def cmp(pred, a, b):
        return arith.CmpIOp(pred, a, b).result

    is32 = arith.AndIOp(
        cmp(arith.CmpIPredicate.sge, value, c(-(2**31))), cmp(arith.CmpIPredicate.sle, value, c(2**31 - 1))
    ).result
    if not specialize:
        return arith.SelectOp(is32, c(INT_KEY_CODES[("i32", None)]), c(INT_KEY_CODES[("i64", None)])).result
    div16 = cmp(arith.CmpIPredicate.eq, arith.AndIOp(value, c(15)).result, c(0))
    k32 = arith.SelectOp(div16, c(INT_KEY_CODES[("i32", "D")]), c(INT_KEY_CODES[("i32", "")])).result
    k64 = arith.SelectOp(div16, c(INT_KEY_CODES[("i64", "D")]), c(INT_KEY_CODES[("i64", "")])).result
    by_type = arith.SelectOp(is32, k32, k64).result
    is_one = cmp(arith.CmpIPredicate.eq, value, c(1))
    return arith.SelectOp(is_one, c(INT_KEY_CODES[("constexpr", 1)]), by_type).result


def emit_int_key_module(context: ir.Context) -> ir.Module:
    """`int_key(i64) -> i64` and `int_key_nospec(i64) -> i64`: the integer-key code alone, for
    checking it against Triton's specializer."""
    with context, ir.Location.unknown():
        module = ir.Module.create()
        i64 = ir.IntegerType.get_signless(64)
        for name, specialize in (("int_key", True), ("int_key_nospec", False)):
            with ir.InsertionPoint(module.body):
                fn = func.FuncOp(name, ir.FunctionType.get([i64], [i64]))
            block = fn.add_entry_block()
            with ir.InsertionPoint(block):
                func.ReturnOp([emit_int_key(block.arguments[0], specialize)])
    return module


def region_steps(torch_module: ir.Module, name: str) -> list[tuple]:
    """The region's steps in the order of its torch-dialect function, one per SCM step the ops
    belong to (Note [Steps by location]): (step index, "launch", j) for the placeholder of
    launch j, (step index, "op", opname) for an operator -- the op the node became, after the
    importer's argument conversions."""
    fn = None
    for op in torch_module.body.operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            fn = op
    assert fn is not None, f"function {name} not found in the imported region"
    steps: list[tuple] = []
    for op in fn.regions[0].blocks[0].operations:
        index = op_step(op.operation)
        if index is None:
            continue
        opname = op.operation.name
        if opname == "torch.operator":
            opname = ir.StringAttr(op.attributes["name"]).value
        if opname == LAUNCH_OP_NAME:
            launch_id = op.operands[0].owner
            step = (index, "launch", ir.IntegerAttr(launch_id.attributes["value"]).value)
        else:
            step = (index, "op", opname)
        if steps and steps[-1][0] == index:
            steps[-1] = step  # a conversion of the node's arguments came first
        else:
            steps.append(step)
    return steps


def program_steps(scm: SCM) -> list[tuple]:
    """The sequence region_steps must give, from the SCM program: (step index, "launch", j) or
    (step index, "op") for an allocation or an operator call."""
    out = []
    launch = 0
    for i, step in enumerate(scm.program.steps):
        if isinstance(step, LaunchStep):
            out.append((i, "launch", launch))
            launch += 1
        else:
            out.append((i, "op"))
    return out


class _Emitter:
    def __init__(self, scm: SCM, specs: "list[Specialization]"):
        self.scm = scm
        self.specs = specs  # the specializations this program holds, in selection order
        self.i64 = ir.IntegerType.get_signless(64)
        self.i1 = ir.IntegerType.get_signless(1)
        self.ptr = ir.Type.parse("!llvm.ptr")
        self.stride = FACTS_FIXED + 2 * scm.max_rank

    # -- small builders -------------------------------------------------------------------
    def const(self, v: int):
        if v >= 1 << 63:
            v -= 1 << 64
        return arith.constant(self.i64, v)

    def load_at(self, base, index: int, ty):
        addr = llvm.GEPOp(self.ptr, base, [], [index], ty, 0).result
        return llvm.LoadOp(ty, addr).result

    def eq(self, a, b):
        return arith.CmpIOp(arith.CmpIPredicate.eq, a, b).result

    def ne(self, a, b):
        return arith.CmpIOp(arith.CmpIPredicate.ne, a, b).result

    def fact(self, input_index: int, offset: int):
        key = (input_index, offset)
        if key not in self.facts:
            with ir.InsertionPoint.at_block_terminator(self.entry) if self.entry_done else ir.InsertionPoint(self.entry):
                self.facts[key] = self.load_at(self.facts_ptr, input_index * self.stride + offset, self.i64)
        return self.facts[key]

    def aligned16(self, value):
        low = arith.AndIOp(value, self.const(15)).result
        return self.eq(low, self.const(0))

    # -- the program ----------------------------------------------------------------------
    def _begin(self, module: ir.Module, name: str):
        """A `(rt, ctx) -> i64` function with two blocks per specialization and a miss block."""
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp(name, ir.FunctionType.get([self.ptr, self.ptr], [self.i64]))
        self.entry = fn.add_entry_block()
        self.entry_done = False
        self.facts: dict = {}
        region = fn.regions[0]
        n = len(self.specs)
        first = [region.blocks.append() for _ in range(n)]
        second = [region.blocks.append() for _ in range(n)]
        return region, tuple(self.entry.arguments), first, second, region.blocks.append()

    def emit_select(self, module: ir.Module) -> None:
        """`scm_select(rt, ctx) -> i64`: the prologue. Evaluates every specialization's guards on
        the input facts, in order; returns the first that holds, or -1."""
        region, (_, ctx), guard_blocks, hit_blocks, miss = self._begin(module, SELECT_SYMBOL)
        specs = self.specs
        with ir.InsertionPoint(self.entry):
            self.facts_ptr = llvm.LoadOp(self.ptr, ctx).result
            cf.BranchOp([], guard_blocks[0] if specs else miss)
        self.entry_done = True
        for i, spec in enumerate(specs):
            nxt = guard_blocks[i + 1] if i + 1 < len(specs) else miss
            with ir.InsertionPoint(guard_blocks[i]):
                cf.CondBranchOp(self.guards(spec), [], [], hit_blocks[i], nxt)
            with ir.InsertionPoint(hit_blocks[i]):
                func.ReturnOp([self.const(spec.index)])
        with ir.InsertionPoint(miss):
            func.ReturnOp([self.const(-1)])

    def emit_host(self, module: ir.Module) -> None:
        """`scm_host(rt, ctx) -> i64`: calls scm_select, then runs the selected
        specialization's plan; -1 on a miss, -2 when a runtime service failed."""
        region, (rt, ctx), dispatch_blocks, body_blocks, miss = self._begin(module, HOST_SYMBOL)
        self.ctx = ctx
        specs = self.specs
        fail = region.blocks.append()
        with ir.InsertionPoint(self.entry):
            self.facts_ptr = llvm.LoadOp(self.ptr, ctx).result
            self.alloc_fn = self.load_at(rt, RT_ALLOC, self.ptr)
            self.launch_fn = self.load_at(rt, RT_LAUNCH, self.ptr)
            self.aten_fn = self.load_at(rt, RT_ATEN, self.ptr)
            self.value_ptr_fn = self.load_at(rt, RT_VALUE_PTR, self.ptr)
            self.view_fn = self.load_at(rt, RT_VIEW, self.ptr)
            self.release_fn = self.load_at(rt, RT_RELEASE, self.ptr)
            max_params = max([len(lp.params) for s in specs for lp in s.launches] + [1])
            self.slots = llvm.AllocaOp(self.ptr, self.const(max_params), self.i64).result
            if self.scm.program.symbolic:  # Note [Symbolic sizes]: sizes handed to alloc / aten
                from ..runtime.native import aten_sizes

                self.set_sizes_fn = self.load_at(rt, RT_SET_SIZES, self.ptr)
                max_sizes = max(
                    [2 * len(a.sizes_expr) for s in specs for a in s.allocs if a.dynamic]
                    + [len(aten_sizes(st)) for st in self.scm.program.atens] + [1]
                )
                self.sizes_buf = llvm.AllocaOp(self.ptr, self.const(max_sizes), self.i64).result
            selected = func.CallOp([self.i64], SELECT_SYMBOL, [rt, ctx]).result
            cf.BranchOp([], dispatch_blocks[0] if specs else miss)
        self.entry_done = True
        for i, spec in enumerate(specs):
            nxt = dispatch_blocks[i + 1] if i + 1 < len(specs) else miss
            with ir.InsertionPoint(dispatch_blocks[i]):
                cf.CondBranchOp(self.eq(selected, self.const(spec.index)), [], [], body_blocks[i], nxt)
            self.body(spec, body_blocks[i], fail, region)
        with ir.InsertionPoint(miss):
            func.ReturnOp([self.const(-1)])
        with ir.InsertionPoint(fail):
            func.ReturnOp([self.const(-2)])

    def guards(self, spec: Specialization):
        ok = arith.constant(self.i1, 1)
        for g in spec.guards:
            f = g.facts
            checks = [
                (1, meta_code(f.dtype, f.device)),
                (2, len(f.sizes)),
            ]
            checks += [(FACTS_FIXED + d, s) for d, s in enumerate(f.sizes) if d not in g.free_sizes]
            checks += [
                (FACTS_FIXED + self.scm.max_rank + d, s) for d, s in enumerate(f.strides) if d not in g.free_strides
            ]
            for offset, expected in checks:
                ok = arith.AndIOp(ok, self.eq(self.fact(g.input, offset), self.const(expected))).result
            if g.residue16 is not None:
                low = arith.AndIOp(self.fact(g.input, 0), self.const(15)).result
                ok = arith.AndIOp(ok, self.eq(low, self.const(g.residue16))).result
            elif g.aligned16 is not None:
                is_aligned = self.aligned16(self.fact(g.input, 0))
                want = arith.constant(self.i1, 1 if g.aligned16 else 0)
                ok = arith.AndIOp(ok, self.eq(is_aligned, want)).result
        for g in spec.size_guards:
            ok = arith.AndIOp(ok, self.size_guard(g)).result
        return ok

    # -- Note [Symbolic sizes] ------------------------------------------------------------
    def symbol(self, name: str):
        b = self.scm.program.symbols[name]
        offset = FACTS_FIXED + b.dim if b.kind == "size" else FACTS_FIXED + self.scm.max_rank + b.dim
        return self.fact(b.input, offset)

    def size(self, value):
        """An i64 for an int or a SizeExpr."""
        if isinstance(value, S.SizeExpr):
            return S.emit(value.expr, self.symbol, self.const)
        return self.const(int(value))

    def size_guard(self, g):
        if isinstance(g, SizeRelation):
            return S.emit(g.expr.expr, self.symbol, self.const)
        if isinstance(g, FactEquals):
            offset = FACTS_FIXED + g.dim if g.kind == "size" else FACTS_FIXED + self.scm.max_rank + g.dim
            return self.eq(self.fact(g.input, offset), self.size(g.expr))
        if isinstance(g, IntegerKey):
            return self.eq(emit_int_key(self.size(g.expr), g.specialize), self.const(g.code))
        raise TypeError(f"no native form for guard {g!r}")

    def set_sizes(self, values) -> None:
        """Stores the i64s `values` in the sizes buffer and hands it to the runtime (set_sizes)."""
        for k, v in enumerate(values):
            addr = llvm.GEPOp(self.ptr, self.sizes_buf, [], [k], self.i64, 0).result
            llvm.StoreOp(v, addr)
        llvm.CallOp(self.i64, [self.set_sizes_fn, self.ctx, self.sizes_buf], [], [])

    def _continue(self, cond_ok, fail, region):
        """Branch to `fail` unless cond_ok; returns the block to keep emitting into."""
        nxt = region.blocks.append()
        cf.CondBranchOp(cond_ok, [], [], nxt, fail)
        return nxt

    def body(self, spec: Specialization, block, fail, region) -> None:
        self.values: dict[int, ir.Value] = {}  # value slot -> its data pointer, once known
        self.address_only = {v.step.outputs[0]: v for v in spec.views.values() if v.pointer_only}
        allocs = {plan.step.slot: plan for plan in spec.allocs}
        atens = iter(spec.atens)
        launches = iter(spec.launches)
        cur = block
        for step_index, step in enumerate(self.scm.program.steps):
            cur = self.step(spec, step, allocs, atens, launches, cur, fail, region)
            with ir.InsertionPoint(cur):  # Note [Early release]: cannot fail
                for slot in spec.releases.get(step_index, ()):
                    llvm.CallOp(self.i64, [self.release_fn, self.ctx, self.const(slot)], [], [])
        with ir.InsertionPoint(cur):
            func.ReturnOp([self.const(spec.index)])

    def step(self, spec: Specialization, step, allocs, atens, launches, cur, fail, region):
        """Emits one program step into block `cur`; returns the block to continue in."""
        with ir.InsertionPoint(cur):
            if isinstance(step, AllocStep):
                plan = allocs[step.slot]
                if plan.dynamic:
                    self.set_sizes([self.size(v) for v in tuple(plan.sizes_expr) + tuple(plan.strides_expr)])
                p = llvm.CallOp(self.i64, [self.alloc_fn, self.ctx, self.const(plan.handle)], [], []).result
                self.values[step.slot] = p
                return self._continue(self.ne(p, self.const(-1)), fail, region)
            if isinstance(step, AtenStep):
                plan = next(atens)
                view = spec.views.get(step.name)
                if view is not None and view.pointer_only:
                    return cur  # only kernels read it: its address is computed where used
                if view is not None:
                    r = llvm.CallOp(self.i64, [self.view_fn, self.ctx, self.const(view.handle)], [], []).result
                else:
                    from ..runtime.native import aten_sizes

                    syms = aten_sizes(step)
                    if syms:
                        self.set_sizes([self.size(v) for v in syms])
                    r = llvm.CallOp(self.i64, [self.aten_fn, self.ctx, self.const(plan.handle)], [], []).result
                return self._continue(self.eq(r, self.const(0)), fail, region)
            launch = next(launches)
            ok = self.store_params(launch)
            gx, gy, gz = launch.grid or launch.step.grid
            if ok is not None:  # pointers the kernel was specialized as 16-byte aligned
                cur = self._continue(ok, fail, region)
        with ir.InsertionPoint(cur):
            r = llvm.CallOp(
                self.i64,
                [self.launch_fn, self.ctx, self.const(launch.handle), self.size(gx), self.size(gy),
                 self.size(gz), self.slots],
                [],
                [],
            ).result
            return self._continue(self.eq(r, self.const(0)), fail, region)

    def value_pointer(self, slot: int):
        if slot not in self.values:
            view = self.address_only.get(slot)
            if view is not None:  # base address + the planned offset, no tensor
                base = self.fact(view.base.index, 0) if view.base.kind == "input" else self.value_pointer(view.base.index)
                self.values[slot] = arith.AddIOp(base, self.const(view.delta_bytes)).result
            else:
                self.values[slot] = llvm.CallOp(self.i64, [self.value_ptr_fn, self.ctx, self.const(slot)], [], []).result
        return self.values[slot]

    def param_value(self, p: Param):
        src = p.source
        if isinstance(src, ValueRef):
            return self.fact(src.index, 0) if src.kind == "input" else self.value_pointer(src.index)
        if isinstance(src, S.SizeExpr):  # an integer computed from sizes; its key is guarded
            value = self.size(src)
            width = int(p.ty[1:]) if p.ty[0] in "iu" and p.ty[1:].isdigit() else 64
            if width < 64:  # the slot holds the raw bits zero-extended (Note [Host ABI])
                value = arith.AndIOp(value, self.const((1 << width) - 1)).result
            return value
        return self.const(slot_bits(p.ty, src))

    def store_params(self, launch: LaunchPlan):
        """Packs the parameters into the slots; returns the i1 'aligned values are aligned'
        condition, or None when the launch assumes no value's alignment."""
        ok = None
        for i, p in enumerate(launch.params):
            value = self.param_value(p)
            addr = llvm.GEPOp(self.ptr, self.slots, [], [i], self.i64, 0).result
            llvm.StoreOp(value, addr)
            if isinstance(p.source, ValueRef) and p.source.kind == "value" and p.source.index in launch.aligned_values:
                cond = self.aligned16(value)
                ok = cond if ok is None else arith.AndIOp(ok, cond).result
        return ok


def emit_host_module(scm: SCM, torch_module: ir.Module, specs: "list[Specialization]") -> ir.Module:
    """A new module, in the context of `torch_module`, holding the host program of `specs` (the
    runtime compiles one per specialization: Note [One host program per specialization])."""
    steps = region_steps(torch_module, scm.program.name)
    expected = program_steps(scm)
    assert [s[:2] if s[1] == "op" else s for s in steps] == expected, (
        f"torch dialect steps {steps} do not match the SCM program {expected}"
    )
    with torch_module.context, ir.Location.unknown():
        module = ir.Module.create()
        _Emitter(scm, specs).emit_select(module)
        _Emitter(scm, specs).emit_host(module)
    return module
