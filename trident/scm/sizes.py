"""Size expressions: the integers of a plan that depend on the input sizes (Note [Symbolic sizes]).

Note [Symbolic sizes]
~~~~~~~~~~~~~~~~~~~~~
A region captured with symbolic sizes (make_fx's symbolic tracing: `trident.capture(...,
dynamic=True)`, or trident.compile once a size changes) has sympy expressions where a static
capture has ints: kernel grids (`(s0 + 63) // 64`), integer kernel arguments (`n = s0`),
allocation sizes and strides, size arguments of operators (`view(x, [s0, 128])`). The symbols
are the shape environment's, and each is bound to one fact of a region input (a size or a
stride of one dimension: `Binding`). The plan keeps those expressions as `SizeExpr`; the host
program loads the bound facts and evaluates them natively, in the integer semantics of Python
(floor division and modulo round toward negative infinity, as torch's FloorDiv and PythonMod
do). What a specialization assumed about the sizes becomes guards evaluated the same way
(trident/scm/guards.py: SizeRelation, FactEquals, IntegerKey, each a relation: `condition()`):
the shape environment's guards, every fact tied to a symbol bound elsewhere (two inputs of one
size), and the Triton key of each integer kernel argument (`== 1`, `% 16`, i32 or i64: Note
[Integer keys], `int_key_condition`), so one specialization serves every size Triton would run
with the same binary. Sizes and guards take one road to native code: a torch-dialect function of
the region's inputs, lowered to arith (Note [Sizes through the torch dialect]). `evaluate` is
the Python reference the native code is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

import sympy
import torch
from torch.utils._sympy import functions as F

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

# Note [Integer keys]
# Triton keys an int argument (runtime/jit.py -> native_specialize_impl) as ('constexpr', 1)
# when specialized and equal to 1, else by type -- i32 for [-2**31, 2**31), i64 beyond -- with
# attribute 'D' when specialized and divisible by 16, '' when not, None when the parameter is
# do_not_specialize. Facts are int64, so u64 (>= 2**63) cannot occur. An IntegerKey guard names
# a key by its code here and the host program checks it as the relation `int_key_condition`
# gives; tests check that relation against Triton's specializer on many values.
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


def int_key_condition(expr: sympy.Basic, code: int, specialize: bool) -> sympy.Basic:
    """The relation "Triton's key of the integer `expr` is `code`" (INT_KEY_CODES): with
    specialization, 1 is the constexpr 1, other values are i32 or i64 by range and divisible
    by 16 or not; without it, only the range counts (Triton's specialize_impl, as
    IntegerKey.key_of restates it)."""
    ty, attr = next((k for k, c in INT_KEY_CODES.items() if c == code), (None, None))
    is32 = sympy.And(expr >= -(2**31), expr <= 2**31 - 1)
    in_range = is32 if ty == "i32" else sympy.Not(is32)
    if not specialize:
        return in_range if ty in ("i32", "i64") and attr is None else sympy.false
    if ty == "constexpr":
        return sympy.Eq(expr, 1)
    if ty is None or attr is None:
        return sympy.false
    div16 = sympy.Eq(F.PythonMod(expr, 16), 0)
    return sympy.And(sympy.Ne(expr, 1), in_range, div16 if attr == "D" else sympy.Not(div16))


def check_native(expr: sympy.Basic) -> None:
    """Raises UnsupportedError unless the host program can evaluate `expr` natively: the classes
    trident/lowering/sizes_to_torch.py's `expand` writes as integer operators."""
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
