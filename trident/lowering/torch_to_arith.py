"""Stage 2 of the lowering, for sizes: a torch-dialect size or guard program -> arith in the host
program.

Note [Sizes through the torch dialect] (sizes_to_torch.py) says what the function holds. This
lowering walks its single block at the host program's insertion point:
  * `torch.aten.size.int` / `torch.aten.stride.int` of argument k with a constant dimension
    become the fact the native prologue wrote for region input k (`fact(k, kind, dim)`);
  * `torch.constant.int` becomes an i64 constant, `torch.constant.bool` an i1;
  * relations (`eq.int`, `ne.int`, `lt.int`, `le.int`, `gt.int`, `ge.int`) become signed
    arith.cmpi (an i1), `__and__.bool`/`__or__.bool`/`__not__` andi/ori/xori of i1s;
  * the integer operators become arith with Python's semantics: `floordiv.int` floors
    (arith.floordivsi), `remainder.int` takes the divisor's sign (a - (a // b) * b), `max`/`min`
    are signed. A divisor of 0 is taken as 1 (Python raises; the guards that
    select a specialization never let a size that divides be 0 there);
  * `func.return` gives the values, one i64 (an integer) or i1 (a relation) per result.
Any other op is a LoweringError naming it: the size program is closed under these.
"""

from __future__ import annotations

from typing import Callable

from torch_mlir import ir
from torch_mlir.dialects import arith

from ..errors import LoweringError

_BINARY = {
    "torch.aten.add.int": arith.AddIOp,
    "torch.aten.sub.int": arith.SubIOp,
    "torch.aten.mul.int": arith.MulIOp,
    "torch.prim.max.int": arith.MaxSIOp,
    "torch.prim.min.int": arith.MinSIOp,
    "torch.aten.__and__.bool": arith.AndIOp,
    "torch.aten.__or__.bool": arith.OrIOp,
}
_RELATIONS = {
    "torch.aten.eq.int": arith.CmpIPredicate.eq,
    "torch.aten.ne.int": arith.CmpIPredicate.ne,
    "torch.aten.lt.int": arith.CmpIPredicate.slt,
    "torch.aten.le.int": arith.CmpIPredicate.sle,
    "torch.aten.gt.int": arith.CmpIPredicate.sgt,
    "torch.aten.ge.int": arith.CmpIPredicate.sge,
}


def _function(module: ir.Module, name: str):
    for op in module.body.operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    raise LoweringError(f"size program {name} not found in its torch-dialect module")


def lower_size_function(module: ir.Module, name: str, fact: Callable[[int, str, int], object]) -> list:
    """The values (i64 for an integer, i1 for a relation) the torch-dialect function `name` of
    `module` returns, computed by arith ops at the current insertion point. `fact(input, kind, dim)` gives the i64 of a size ("size") or
    stride ("stride") of region input `input` (a negative `dim` counts from the last)."""
    fn = _function(module, name)
    block = fn.regions[0].blocks[0]
    args = {block.arguments[k]: k for k in range(len(block.arguments))}
    i64 = ir.IntegerType.get_signless(64)
    i1 = ir.IntegerType.get_signless(1)
    env: dict = {}
    consts: dict = {}
    known: dict = {}  # the i64 constants made here -> their ints

    def const(v: int):
        if v not in consts:
            consts[v] = arith.constant(i64, v)
            known[consts[v]] = v
        return consts[v]

    def value(v):
        try:
            return env[v]
        except KeyError:
            raise LoweringError(f"size program {name}: operand {v} is not an integer it computed") from None


    def nonzero(b):
        if known.get(b, 0) != 0:  # a constant divisor other than 0
            return b
        zero = arith.CmpIOp(arith.CmpIPredicate.eq, b, const(0)).result
        return arith.SelectOp(zero, const(1), b).result

    def fdiv(a, b):
        return arith.FloorDivSIOp(a, nonzero(b)).result

    for op in block.operations:
        opname = op.operation.name
        if opname == "torch.operator":
            opname = ir.StringAttr(op.attributes["name"]).value  # an op the dialect does not define
            opname = opname if opname.startswith("torch.") else "torch." + opname
        operands = list(op.operands)
        if opname == "torch.constant.int":
            out = const(ir.IntegerAttr(op.attributes["value"]).value)
        elif opname == "torch.constant.bool":
            out = arith.constant(i1, int(ir.BoolAttr(op.attributes["value"]).value))
        elif opname in ("torch.aten.size.int", "torch.aten.stride.int"):
            tensor, dim = operands
            if tensor not in args:
                raise LoweringError(f"size program {name}: {opname} of a value that is no region input")
            out = fact(args[tensor], "size" if opname.endswith("size.int") else "stride", _constant_of(dim, name))
        elif opname in _BINARY:
            out = _BINARY[opname](value(operands[0]), value(operands[1])).result
        elif opname == "torch.aten.floordiv.int":
            out = fdiv(value(operands[0]), value(operands[1]))
        elif opname == "torch.aten.remainder.int":
            a, b = value(operands[0]), value(operands[1])
            out = arith.SubIOp(a, arith.MulIOp(fdiv(a, b), b).result).result
        elif opname == "torch.aten.neg.int":
            out = arith.SubIOp(const(0), value(operands[0])).result
        elif opname in _RELATIONS:
            out = arith.CmpIOp(_RELATIONS[opname], value(operands[0]), value(operands[1])).result
        elif opname == "torch.aten.__not__":
            out = arith.XOrIOp(value(operands[0]), arith.constant(i1, 1)).result
        elif opname == "func.return":
            return [value(v) for v in operands]
        else:
            raise LoweringError(f"size program {name}: {opname} has no lowering to arith (expected only integer size ops and relations)")
        env[op.results[0]] = out
    raise LoweringError(f"size program {name} has no return")


def _constant_of(v, name: str) -> int:
    owner = v.owner
    if owner.name != "torch.constant.int":
        raise LoweringError(f"size program {name}: a dimension that is not a constant")
    return ir.IntegerAttr(owner.attributes["value"]).value
