"""Stage 2 of the lowering, second half: SCM IR + the region in torch dialect -> the native host program.

The host program is two functions in the func/arith/cf/llvm dialects (ABI:
trident/csrc/scm_runtime.h, Note [Host ABI]): `scm_select(rt, ctx) -> i64`, the guard prologue,
and `scm_host(rt, ctx) -> i64`, which calls it and runs the plan. Together they
  1. load the input facts the native prologue wrote (data pointer, dtype/device code, rank,
     sizes, strides per input) and evaluate every specialization's guards on them, in order:
     the tensor guards as a constant table walked by a loop (Note [Guard tables]), the size
     guards (shape relations, facts tied to symbols, Triton's integer keys) as expressions;
  2. for the first specialization whose guards hold, compute its size program (grids, integer
     arguments, dynamic allocations' layouts and operators' size arguments as expressions of
     the input facts, Note [Symbolic sizes]) into an array, and call the runtime's `run_plan`
     with the specialization's step table (Note [Host plans], host_plan.py) and that array;
  3. return the specialization's index, -1 when no guard set holds (a miss), -2 when a
     runtime service failed.
"""

from __future__ import annotations

import numpy
import torch
from torch_mlir import ir
from torch_mlir.dialects import arith, cf, func, llvm

from ..runtime.native import scalar_type_code
from ..scm import sizes as S
from ..scm.ir import SCM, LaunchStep, Specialization

from .host_plan import HostPlan  # noqa: F401 - the plans it is given (annotations)
from .region_to_torch import LAUNCH_OP_NAME, op_step
from .sizes_to_torch import guard_function_name, import_size_program, size_function_name
from .torch_to_arith import lower_size_function

FACTS_FIXED = 3  # data_ptr, meta, ndim (scm_runtime.h: kFactsFixed)
RT_RUN_PLAN = 7  # RuntimeTable::run_plan (Note [Host plans]); 0..6: the services run_plan calls
_DYNAMIC_INDEX = -(2**31)  # llvm.getelementptr: this position takes a dynamic index


def _internal_linkage():
    return ir.Attribute.parse("#llvm.linkage<internal>")  # the bindings have no builder for LinkageAttr
HOST_SYMBOL = "scm_host"
SELECT_SYMBOL = "scm_select"  # guards and selection only: returns the index or -1

_DEVICE_TYPE = {"cpu": 0, "cuda": 1}


def dtype_code(dtype: torch.dtype) -> int:
    """c10::ScalarType value of a dtype, as the native prologue encodes it."""
    return scalar_type_code(dtype)


def meta_code(dtype: torch.dtype, device: torch.device) -> int:
    """The prologue's meta fact for a tensor (scm_runtime.cpp: encode_meta)."""
    index = device.index if device.index is not None else (0 if device.type == "cuda" else -1)
    return dtype_code(dtype) | (_DEVICE_TYPE[device.type] << 8) | ((index + 1) << 16)


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
    def __init__(self, scm: SCM, specs: "list[Specialization]", plans: "list[HostPlan]", size_modules=None):
        self.scm = scm
        self.size_modules = size_modules or {}  # spec index -> its size program in torch dialect
        self.specs = specs  # the specializations this program holds, in selection order
        self.plans = plans  # their step tables (Note [Host plans]), registered
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

    def load_dynamic(self, base, index, ty):
        addr = llvm.GEPOp(self.ptr, base, [index], [_DYNAMIC_INDEX], ty, 0).result
        return llvm.LoadOp(ty, addr).result

    def eq(self, a, b):
        return arith.CmpIOp(arith.CmpIPredicate.eq, a, b).result

    def fact(self, input_index: int, offset: int):
        key = (input_index, offset)
        if key not in self.facts:
            with ir.InsertionPoint.at_block_terminator(self.entry) if self.entry_done else ir.InsertionPoint(self.entry):
                self.facts[key] = self.load_at(self.facts_ptr, input_index * self.stride + offset, self.i64)
        return self.facts[key]

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
            cur = self.fact_table_loop(module, spec, guard_blocks[i], nxt, region)
            with ir.InsertionPoint(cur):
                if spec.size_guards:  # Note [Sizes through the torch dialect]
                    held = lower_size_function(self.size_modules[spec.index],
                                               guard_function_name(self.scm.program, spec.index), self.input_fact)
                    ok = held[0]
                    for h in held[1:]:
                        ok = arith.AndIOp(ok, h).result
                    cf.CondBranchOp(ok, [], [], hit_blocks[i], nxt)
                else:
                    cf.BranchOp([], hit_blocks[i])
            with ir.InsertionPoint(hit_blocks[i]):
                func.ReturnOp([self.const(spec.index)])
        with ir.InsertionPoint(miss):
            func.ReturnOp([self.const(-1)])

    def fact_table_loop(self, module: ir.Module, spec: Specialization, block, fail, region):
        """Note [Guard tables]: the tensor guards of `spec` as a constant table of checks
        (fact index, mask, expected, want): `((facts[index] & mask) == expected) == want`, walked
        by a loop from `block`; branches to `fail` at the first that does not hold. Returns the
        block reached when all hold."""
        table = guard_table(self.scm, spec)
        if not table:
            return block
        n = len(table)
        name = f"scm_guards_{spec.index}"
        with ir.InsertionPoint(module.body):
            llvm.GlobalOp(
                ir.TypeAttr.get(llvm.ArrayType.get(self.i64, 4 * n)), name, _internal_linkage(), constant=True,
                value=ir.DenseIntElementsAttr.get(numpy.array(table, dtype=numpy.int64).reshape(-1)),
            )
        head = region.blocks.append(self.i64)
        body = region.blocks.append()
        done = region.blocks.append()
        with ir.InsertionPoint(block):
            base = llvm.AddressOfOp(self.ptr, name).result
            cf.BranchOp([self.const(0)], head)
        with ir.InsertionPoint(head):
            i = head.arguments[0]
            more = arith.CmpIOp(arith.CmpIPredicate.slt, i, self.const(4 * n)).result
            cf.CondBranchOp(more, [], [], body, done)
        with ir.InsertionPoint(body):
            row = [self.load_dynamic(base, arith.AddIOp(i, self.const(k)).result if k else i, self.i64) for k in range(4)]
            fact = self.load_dynamic(self.facts_ptr, row[0], self.i64)
            same = self.eq(arith.AndIOp(fact, row[1]).result, row[2])
            ok = self.eq(arith.ExtUIOp(self.i64, same).result, row[3])
            cf.CondBranchOp(ok, [arith.AddIOp(i, self.const(4)).result], [], head, fail)
        return done

    def emit_host(self, module: ir.Module) -> None:
        """`scm_host(rt, ctx) -> i64`: calls scm_select, computes the selected specialization's
        size program and runs its plan (Note [Host plans]); -1 on a miss, -2 when a runtime
        service failed."""
        region, (rt, ctx), dispatch_blocks, body_blocks, miss = self._begin(module, HOST_SYMBOL)
        specs = self.specs
        fail = region.blocks.append()
        with ir.InsertionPoint(self.entry):
            self.facts_ptr = llvm.LoadOp(self.ptr, ctx).result
            run_plan = self.load_at(rt, RT_RUN_PLAN, self.ptr)
            max_sizes = max([len(p.sizes) for p in self.plans] + [0])
            sizes_buf = llvm.AllocaOp(self.ptr, self.const(max(max_sizes, 1)), self.i64).result
            selected = func.CallOp([self.i64], SELECT_SYMBOL, [rt, ctx]).result
            cf.BranchOp([], dispatch_blocks[0] if specs else miss)
        self.entry_done = True
        for i, (spec, plan) in enumerate(zip(specs, self.plans)):
            nxt = dispatch_blocks[i + 1] if i + 1 < len(specs) else miss
            with ir.InsertionPoint(dispatch_blocks[i]):
                cf.CondBranchOp(self.eq(selected, self.const(spec.index)), [], [], body_blocks[i], nxt)
            done = region.blocks.append()
            with ir.InsertionPoint(body_blocks[i]):
                for k, v in enumerate(self.size_program(spec, plan)):  # Note [Sizes through the torch dialect]
                    addr = llvm.GEPOp(self.ptr, sizes_buf, [], [k], self.i64, 0).result
                    llvm.StoreOp(v, addr)
                r = llvm.CallOp(self.i64, [run_plan, ctx, self.const(plan.handle), sizes_buf], [], []).result
                cf.CondBranchOp(self.eq(r, self.const(0)), [], [], done, fail)
            with ir.InsertionPoint(done):
                func.ReturnOp([self.const(spec.index)])
        with ir.InsertionPoint(miss):
            func.ReturnOp([self.const(-1)])
        with ir.InsertionPoint(fail):
            func.ReturnOp([self.const(-2)])

    # -- Note [Symbolic sizes] ------------------------------------------------------------
    def size_program(self, spec: Specialization, plan: "HostPlan") -> list:
        """The i64 of each entry of `plan`'s size program, at the insertion point: lowered from
        its torch-dialect function (Note [Sizes through the torch dialect]) when one was
        imported for `spec`, as constants when every entry is one."""
        if not _symbolic(plan):
            return [self.const(int(v)) for v in plan.sizes]
        module = self.size_modules.get(spec.index)
        if module is None:
            raise TypeError(f"specialization {spec.index} has a symbolic size program but no torch-dialect import")
        name = size_function_name(self.scm.program, spec.index)
        return lower_size_function(module, name, self.input_fact)

    def input_fact(self, input_index: int, kind: str, dim: int):
        rank = len(self.scm.program.captured_inputs[input_index].sizes)
        dim = dim + rank if dim < 0 else dim
        return self.fact(input_index, FACTS_FIXED + dim if kind == "size" else FACTS_FIXED + self.scm.max_rank + dim)

# Note [Guard tables]
# ~~~~~~~~~~~~~~~~~~~
# A tensor guard compares facts with constants: the dtype/device code, the rank, the sizes and
# strides not left free, the data pointer's residue modulo 16 (or its 16-byte alignment). As
# unrolled code that is ~8 MLIR operations per fact and dominated the build of a large region
# (a 24-layer decode region: ~3,000 comparisons, most of LLVM's time); as a constant table of
# rows (fact index, mask, expected, want) walked by one loop it is data, and a check costs about
# what the unrolled compare did.
def guard_table(scm: SCM, spec: Specialization) -> list[tuple[int, int, int, int]]:
    """Rows (fact index, mask, expected, want) of `spec`'s tensor guards, in guard order."""
    stride = FACTS_FIXED + 2 * scm.max_rank
    rows = []
    for g in spec.guards:
        f = g.facts
        base = g.input * stride
        checks = [(1, meta_code(f.dtype, f.device)), (2, len(f.sizes))]
        checks += [(FACTS_FIXED + d, s) for d, s in enumerate(f.sizes) if d not in g.free_sizes]
        checks += [(FACTS_FIXED + scm.max_rank + d, s) for d, s in enumerate(f.strides) if d not in g.free_strides]
        rows += [(base + offset, -1, expected, 1) for offset, expected in checks]
        if g.residue16 is not None:
            rows.append((base, 15, g.residue16, 1))
        elif g.aligned16 is not None:
            rows.append((base, 15, 0, 1 if g.aligned16 else 0))
    return rows


def check_region_steps(scm: SCM, torch_module: ir.Module) -> None:
    """The torch-dialect function's steps are the SCM program's, in order (once per region: the
    same import serves every specialization)."""
    steps = region_steps(torch_module, scm.program.name)
    expected = program_steps(scm)
    assert [s[:2] if s[1] == "op" else s for s in steps] == expected, (
        f"torch dialect steps {steps} do not match the SCM program {expected}"
    )


def _symbolic(plan) -> bool:
    return any(isinstance(v, S.SizeExpr) for v in plan.sizes)


def import_size_programs(scm: SCM, context: ir.Context, specs, plans) -> dict:
    """Spec index -> the torch-dialect module of its size program and guard program, for each of
    `specs` whose plan computes a symbolic size or that has size guards (Note [Sizes through the
    torch dialect])."""
    return {
        spec.index: import_size_program(scm.program, plan.sizes if _symbolic(plan) else None, context, spec.index,
                                        [g.condition() for g in spec.size_guards])
        for spec, plan in zip(specs, plans)
        if _symbolic(plan) or spec.size_guards
    }


def emit_host_module(
    scm: SCM, torch_module: ir.Module, specs: "list[Specialization]", plans: "list[HostPlan]",
    size_modules: "dict | None" = None,
) -> ir.Module:
    """A new module, in the context of `torch_module` (checked by check_region_steps), holding the
    host program of `specs`, whose registered step tables are `plans` (the runtime compiles one
    per specialization: Note [One host program per specialization]). `size_modules`: their size
    programs in torch dialect (import_size_programs; imported here when not given)."""
    with torch_module.context, ir.Location.unknown():
        if size_modules is None:
            size_modules = import_size_programs(scm, torch_module.context, specs, plans)
        module = ir.Module.create()
        _Emitter(scm, specs, plans, size_modules).emit_select(module)
        _Emitter(scm, specs, plans, size_modules).emit_host(module)
    return module
