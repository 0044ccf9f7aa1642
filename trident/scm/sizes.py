"""Size expressions: the integers of a plan that depend on the input sizes (Note [Symbolic sizes]).

Note [Symbolic sizes]
~~~~~~~~~~~~~~~~~~~~~
A region captured with symbolic sizes (make_fx's symbolic tracing: `trident.capture(...,
dynamic=True)`, or trident.compile once a size changes) has sympy expressions where a static
capture has ints: kernel grids (`(s0 + 63) // 64`), integer kernel arguments (`n = s0`),
allocation sizes and strides, size arguments of operators (`view(x, [s0, 128])`). The symbols
are the shape environment's, and each is bound to one fact of a region input (a size or a
stride of one dimension: `Binding`). The plan keeps those expressions as `SizeExpr`; the host
program loads the bound facts and evaluates them natively (`emit`), in the integer semantics of
Python (floor division and modulo round toward negative infinity, as torch's FloorDiv and
PythonMod do). What a specialization assumed about the sizes becomes guards evaluated the same
way (trident/scm/guards.py: SizeRelation, IntegerKey): the shape environment's guards, every
fact tied to a symbol bound elsewhere (two inputs of one size), and the Triton key of each
integer kernel argument (`== 1`, `% 16`, i32 or i64: Note [Integer keys]), so one
specialization serves every size Triton would run with the same binary. `evaluate` is the
Python reference the native code is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Union

import sympy
import torch
from torch.utils._sympy import functions as F
from torch_mlir import ir
from torch_mlir.dialects import arith

from ..errors import UnsupportedError


@dataclass(frozen=True)
class SizeExpr:
    """An integer (or, for guards, boolean) expression over bound size symbols."""

    expr: sympy.Basic

    def __str__(self) -> str:
        return str(self.expr)

    def __repr__(self) -> str:  # printed plans show the expression itself: n=s0, grid [((s0 + 63)//64), 1, 1]
        return str(self.expr)

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s.name for s in self.expr.free_symbols)

    def evaluate(self, env: Mapping[str, int]) -> int:
        return evaluate(self.expr, env)


@dataclass(frozen=True)
class Binding:
    """Where a symbol's value comes from: fact `kind` ("size" | "stride") of dimension `dim` of
    region input `input`."""

    input: int
    kind: str
    dim: int


Size = Union[int, SizeExpr]

# Triton's key of an integer argument as the host program encodes it (Note [Integer keys],
# trident/lowering/scm_to_llvm.py: emit_int_key computes it natively; IntegerKey guards compare it)
INT_KEY_CODES = {
    ("constexpr", 1): 0,
    ("i32", "D"): 1,
    ("i32", ""): 2,
    ("i64", "D"): 3,
    ("i64", ""): 4,
    ("i32", None): 5,
    ("i64", None): 6,
}



def size_of(value) -> Size:
    """An int, or the SizeExpr of a SymInt (a constant SymInt is its int)."""
    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        if isinstance(expr, sympy.Integer) or expr.is_number:
            return int(expr)
        return SizeExpr(expr)
    if isinstance(value, SizeExpr):
        return value
    return int(value)


def scaled(a: Size, k: int) -> Size:
    """a * k."""
    return a * k if isinstance(a, int) else SizeExpr(sympy.expand(a.expr * k))


def difference(a: Size, b: Size) -> Size:
    """a - b, an int when it does not depend on sizes."""
    ea = a.expr if isinstance(a, SizeExpr) else sympy.Integer(a)
    eb = b.expr if isinstance(b, SizeExpr) else sympy.Integer(b)
    d = sympy.expand(ea - eb)
    return int(d) if d.is_number else SizeExpr(d)


def is_symbolic(value) -> bool:
    return isinstance(value, SizeExpr)


def concrete(value, env: Mapping[str, int]):
    """`value` with every SizeExpr in it (also inside lists and tuples) evaluated in `env`."""
    if isinstance(value, SizeExpr):
        return value.evaluate(env)
    if isinstance(value, list):
        return [concrete(v, env) for v in value]
    if isinstance(value, tuple):
        return tuple(concrete(v, env) for v in value)
    return value


def expressions_in(value):
    """Every SizeExpr in `value`, through lists, tuples and dict values."""
    if isinstance(value, SizeExpr):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from expressions_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from expressions_in(v)


def has_symbols(value) -> bool:
    return next(expressions_in(value), None) is not None


# -- the Python reference ----------------------------------------------------------------------

def evaluate_size(expr: SizeExpr, names: tuple, *values) -> int:
    """`expr` for symbols `names` = `values`: what a region's own graph computes a size with
    (trident/passes/outline_regions.py), from the sizes it reads off its inputs."""
    return expr.evaluate(dict(zip(names, values)))


def _pyfloordiv(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("size expression divides by zero")
    return a // b


def evaluate(expr: sympy.Basic, env: Mapping[str, int]):
    """The value of `expr` with Python's integer semantics (bool for relations)."""
    e = expr
    if isinstance(e, sympy.Symbol):
        return int(env[e.name])
    if e is sympy.true:
        return True
    if e is sympy.false:
        return False
    if isinstance(e, sympy.Integer):
        return int(e)
    args = e.args
    ev = lambda a: evaluate(a, env)  # noqa: E731
    if isinstance(e, sympy.Add):
        return sum(ev(a) for a in args)
    if isinstance(e, sympy.Mul):
        out = 1
        for a in args:
            out *= ev(a)
        return out
    if isinstance(e, _POW):
        base, exp = args
        if not (isinstance(exp, sympy.Integer) and int(exp) >= 0):
            raise UnsupportedError(f"size expression {expr}: power with exponent {exp}")
        return ev(base) ** int(exp)
    if isinstance(e, (F.FloorDiv, F.CleanDiv)):
        return _pyfloordiv(ev(args[0]), ev(args[1]))
    if isinstance(e, F.CeilDiv):
        return -_pyfloordiv(-ev(args[0]), ev(args[1]))
    if isinstance(e, (F.PythonMod, sympy.Mod, F.Mod)):
        b = ev(args[1])
        if b == 0:
            raise ZeroDivisionError("size expression takes a modulo by zero")
        return ev(args[0]) % b
    if isinstance(e, F.ModularIndexing):
        return _pyfloordiv(ev(args[0]), ev(args[1])) % ev(args[2])
    if isinstance(e, _MAX):
        return max(ev(a) for a in args)
    if isinstance(e, _MIN):
        return min(ev(a) for a in args)
    if isinstance(e, F.Identity):
        return ev(args[0])
    if isinstance(e, sympy.Eq):
        return ev(args[0]) == ev(args[1])
    if isinstance(e, sympy.Ne):
        return ev(args[0]) != ev(args[1])
    if isinstance(e, sympy.StrictLessThan):
        return ev(args[0]) < ev(args[1])
    if isinstance(e, sympy.LessThan):
        return ev(args[0]) <= ev(args[1])
    if isinstance(e, sympy.StrictGreaterThan):
        return ev(args[0]) > ev(args[1])
    if isinstance(e, sympy.GreaterThan):
        return ev(args[0]) >= ev(args[1])
    if isinstance(e, sympy.And):
        return all(ev(a) for a in args)
    if isinstance(e, sympy.Or):
        return any(ev(a) for a in args)
    if isinstance(e, sympy.Not):
        return not ev(args[0])
    raise UnsupportedError(f"size expression {expr}: {type(e).__name__} has no native form")


def check_native(expr: sympy.Basic) -> None:
    """Raises UnsupportedError unless `emit` can evaluate `expr` natively."""
    for e in sympy.preorder_traversal(expr):
        if isinstance(e, (sympy.Symbol, sympy.Integer)) or e in (sympy.true, sympy.false):
            continue
        if isinstance(e, _POW) and not (isinstance(e.args[1], sympy.Integer) and int(e.args[1]) >= 0):
            raise UnsupportedError(f"size expression {expr}: power with exponent {e.args[1]}")
        if isinstance(e, sympy.Rational) or isinstance(e, sympy.Float):
            raise UnsupportedError(f"size expression {expr}: non-integer constant {e}")
        if not isinstance(e, _NATIVE):
            raise UnsupportedError(f"size expression {expr}: {type(e).__name__} has no native form")


_MAX = (sympy.Max, F.Max)
_MIN = (sympy.Min, F.Min)
_POW = (sympy.Pow, F.PowByNatural)
_NATIVE = _MAX + _MIN + _POW + (
    sympy.Add, sympy.Mul, F.FloorDiv, F.CleanDiv, F.CeilDiv, F.PythonMod, sympy.Mod, F.Mod,
    F.ModularIndexing, F.Identity, sympy.Eq, sympy.Ne, sympy.StrictLessThan,
    sympy.LessThan, sympy.StrictGreaterThan, sympy.GreaterThan, sympy.And, sympy.Or, sympy.Not,
)


# -- native code -------------------------------------------------------------------------------

def emit(expr: sympy.Basic, load: Callable[[str], object], const: Callable[[int], object]):
    """MLIR (arith) computing `expr` at the insertion point: an i64 for an integer expression, an
    i1 for a relation. `load(name)` gives the i64 of a symbol, `const(v)` an i64 constant.
    A divisor of 0 is taken as 1 here (Python raises; the guards that select a specialization
    never divide by a size that can be 0 there: sizes 0 and 1 are specialized)."""
    i1 = ir.IntegerType.get_signless(1)
    memo: dict = {}

    def cmp(pred, a, b):
        return arith.CmpIOp(pred, a, b).result

    def safe(b):  # a divisor of 0 becomes 1 (see above)
        zero = cmp(arith.CmpIPredicate.eq, b, const(0))
        return arith.SelectOp(zero, const(1), b).result

    def fdiv(a, b):
        return arith.FloorDivSIOp(a, safe(b)).result

    def pmod(a, b):  # Python's modulo: a - (a // b) * b
        return arith.SubIOp(a, arith.MulIOp(fdiv(a, b), b).result).result

    def go(e):
        if e in memo:
            return memo[e]
        args = e.args
        if isinstance(e, sympy.Symbol):
            out = load(e.name)
        elif e is sympy.true or e is sympy.false:
            out = arith.constant(i1, 1 if e is sympy.true else 0)
        elif isinstance(e, sympy.Integer):
            out = const(int(e))
        elif isinstance(e, sympy.Add):
            out = go(args[0])
            for a in args[1:]:
                out = arith.AddIOp(out, go(a)).result
        elif isinstance(e, sympy.Mul):
            out = go(args[0])
            for a in args[1:]:
                out = arith.MulIOp(out, go(a)).result
        elif isinstance(e, _POW):
            base, out = go(args[0]), const(1)
            for _ in range(int(args[1])):
                out = arith.MulIOp(out, base).result
        elif isinstance(e, (F.FloorDiv, F.CleanDiv)):
            out = fdiv(go(args[0]), go(args[1]))
        elif isinstance(e, F.CeilDiv):
            out = arith.CeilDivSIOp(go(args[0]), safe(go(args[1]))).result
        elif isinstance(e, (F.PythonMod, sympy.Mod, F.Mod)):
            out = pmod(go(args[0]), go(args[1]))
        elif isinstance(e, F.ModularIndexing):
            out = pmod(fdiv(go(args[0]), go(args[1])), go(args[2]))
        elif isinstance(e, _MAX):
            out = go(args[0])
            for a in args[1:]:
                out = arith.MaxSIOp(out, go(a)).result
        elif isinstance(e, _MIN):
            out = go(args[0])
            for a in args[1:]:
                out = arith.MinSIOp(out, go(a)).result
        elif isinstance(e, F.Identity):
            out = go(args[0])
        elif isinstance(e, (sympy.Eq, sympy.Ne, sympy.StrictLessThan, sympy.LessThan, sympy.StrictGreaterThan,
                            sympy.GreaterThan)):
            pred = {
                sympy.Eq: arith.CmpIPredicate.eq, sympy.Ne: arith.CmpIPredicate.ne,
                sympy.StrictLessThan: arith.CmpIPredicate.slt, sympy.LessThan: arith.CmpIPredicate.sle,
                sympy.StrictGreaterThan: arith.CmpIPredicate.sgt, sympy.GreaterThan: arith.CmpIPredicate.sge,
            }[type(e)]
            out = cmp(pred, go(args[0]), go(args[1]))
        elif isinstance(e, sympy.And):
            out = go(args[0])
            for a in args[1:]:
                out = arith.AndIOp(out, go(a)).result
        elif isinstance(e, sympy.Or):
            out = go(args[0])
            for a in args[1:]:
                out = arith.OrIOp(out, go(a)).result
        elif isinstance(e, sympy.Not):
            out = arith.XOrIOp(go(args[0]), arith.constant(i1, 1)).result
        else:
            raise UnsupportedError(f"size expression {expr}: {type(e).__name__} has no native form")
        memo[e] = out
        return out

    return go(expr)


def to_text(value: SizeExpr) -> str:
    """The plain-text form of a SizeExpr for the plan records (trident/scm/serialize.py): sympy's
    srepr, which `from_text` reads back exactly (str() prints FloorDiv as `//`, which sympy
    would read as floor of a true division)."""
    return sympy.srepr(value.expr)


def from_text(text: str) -> SizeExpr:
    """The SizeExpr `to_text` wrote. Only sympy's and torch's expression classes are named."""
    names = {n: getattr(F, n) for n in (
        "FloorDiv", "CleanDiv", "CeilDiv", "PythonMod", "Mod", "ModularIndexing", "Identity", "Max", "Min",
        "PowByNatural")}
    for n in ("Symbol", "Integer", "Add", "Mul", "Pow", "Eq", "Ne", "StrictLessThan", "LessThan",
              "StrictGreaterThan", "GreaterThan", "Equality", "Unequality", "And", "Or", "Not", "true", "false"):
        names[n] = getattr(sympy, n)
    names["BooleanTrue"], names["BooleanFalse"] = (lambda: sympy.true), (lambda: sympy.false)
    try:
        expr = eval(text, {"__builtins__": {}}, names)  # noqa: S307 - names restricted to sympy classes
    except Exception as e:
        raise UnsupportedError(f"not a size expression record: {text[:80]!r} ({type(e).__name__}: {e})") from e
    if not isinstance(expr, sympy.Basic):
        raise UnsupportedError(f"not a size expression record: {text[:80]!r}")
    return SizeExpr(expr)
