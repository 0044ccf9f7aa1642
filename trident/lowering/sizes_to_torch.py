"""Stage 1 of the lowering, for sizes: a region's size arithmetic as torch-dialect integer ops.

Note [Sizes through the torch dialect]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A symbolic region (Note [Symbolic sizes]) computes integers from its inputs' sizes: operators'
size arguments (`view(x, [s0 // 16, 16])`), allocation sizes and strides, kernel grids and integer
arguments. The SCM IR keeps each as a `SizeExpr` over symbols bound to input facts. The torch
dialect is where those computations are carried into the host program:

  * the region function (region_to_torch.py) is imported with dynamic dimensions
    (`!torch.vtensor<[?,16],f32>`), and the sizes it passes to operators are computed inside it
    from `torch.aten.size.int` of its arguments (`expand` below turns each outlined
    `evaluate_size` node back into integer operators), not pinned to the example's values;
  * a specialization's size program -- every SizeExpr its host plan reads (Note [Host plans]) --
    is a function of the region's inputs imported the same way (`import_size_program`):
    `func @region0_sizes_1(%arg0: !torch.vtensor<[?],f32>) -> (!torch.int, ...)`, whose body is
    `torch.aten.size.int`/`stride.int` of its arguments and `torch.aten.add.int`, `sub.int`,
    `mul.int`, `floordiv.int`, `remainder.int`, `neg.int`, `torch.prim.max.int`/`min.int`;
  * its size guards (SizeRelation, FactEquals, IntegerKey: each a relation, `condition()`) are
    a second function, `@region0_guards_1(...) -> (!torch.bool, ...)`, one bool per guard, built
    with `torch.aten.eq.int`/`ne`/`lt`/`le`/`gt`/`ge` and `__and__.bool`/`__or__.bool`/`__not__`;
  * torch_to_arith.py lowers both into the host program: size reads become loads of the facts
    the native prologue wrote, the integer operators arith with Python's semantics, relations
    arith.cmpi. The size program runs in scm_host once its specialization is selected; the guard
    program in scm_select, after the specialization's tensor guards (Note [Guard tables]).

This is the only road from a SizeExpr to native code (the review of 2026-12-02: before, guards
were emitted to arith straight from sympy, a second lowering of the same expressions).

Both imports go through torch-mlir's own FX importer (its symbolic-op path maps `sym_size.int`
to `torch.aten.size.int`); expressions are written with the ATen/prim integer overloads, whose
semantics are Python's (floor division and modulo round toward negative infinity).
"""

from __future__ import annotations

from typing import Callable, Sequence

import sympy
import torch
from torch.utils._sympy import functions as F
from torch_mlir.dialects import torch as torch_d
from torch_mlir.extras.fx_importer import FxImporter

from ..errors import UnsupportedError
from ..scm import sizes as S

SIZE_FILE = "trident-size"  # the location of size arithmetic (plumbing: no SCM step)

# The integer operators a size program is made of, and the torch-dialect ops they import as.
INT_OPS = {
    "add": torch.ops.aten.add.int,
    "sub": torch.ops.aten.sub.int,
    "mul": torch.ops.aten.mul.int,
    "floordiv": torch.ops.aten.floordiv.int,
    "mod": torch.ops.aten.remainder.int,  # Python's %: the sign of the divisor
    "neg": torch.ops.aten.neg.int,
    "max": torch.ops.prim.max.int,
    "min": torch.ops.prim.min.int,
    "eq": torch.ops.aten.eq.int,  # relations and their connectives: a guard program's (!torch.bool)
    "ne": torch.ops.aten.ne.int,
    "lt": torch.ops.aten.lt.int,
    "le": torch.ops.aten.le.int,
    "gt": torch.ops.aten.gt.int,
    "ge": torch.ops.aten.ge.int,
    "and": torch.ops.aten.__and__.bool,
    "or": torch.ops.aten.__or__.bool,
    "not": torch.ops.aten.__not__.default,
}
_PY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "neg": lambda a: -a,
    "max": lambda a, b: torch.sym_max(a, b),
    "min": lambda a, b: torch.sym_min(a, b),
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "not": lambda a: torch.sym_not(a),
}
_RELATIONS = {
    sympy.Eq: "eq", sympy.Ne: "ne", sympy.StrictLessThan: "lt", sympy.LessThan: "le",
    sympy.StrictGreaterThan: "gt", sympy.GreaterThan: "ge",
}


def _located(node: torch.fx.Node) -> torch.fx.Node:
    node.meta["stack_trace"] = f'File "{SIZE_FILE}", line 0, in sizes\n'
    return node


def _val(x):
    return x.meta.get("val", 0) if isinstance(x, torch.fx.Node) else x


def _int_op(graph: torch.fx.Graph, name: str, *args):
    """`name` applied to ints, bools and nodes: a Python value when every operand is one, else a
    node of the ATen/prim overload, its value (a SymInt or SymBool when the operands have them)
    computed as Python would."""
    if not any(isinstance(a, torch.fx.Node) for a in args):
        try:
            return _PY[name](*args)
        except ZeroDivisionError:
            pass  # a node: natively a divisor of 0 is taken as 1 (torch_to_arith.py)
    node = graph.call_function(INT_OPS[name], tuple(args))
    try:
        node.meta["val"] = _PY[name](*[_val(a) for a in args])
    except (ZeroDivisionError, TypeError):
        node.meta["val"] = 0  # the importer needs only its type: !torch.int
    return _located(node)


def expand(graph: torch.fx.Graph, expr: sympy.Basic, symbol: Callable[[str], object], memo: dict | None = None):
    """FX nodes computing `expr` -- an integer, or a relation (a bool) -- (an int or bool when it
    is constant), the value of each symbol given by `symbol(name)` (a node or an int); `memo`
    (subexpression -> node) shares what several calls compute. Raises UnsupportedError for what
    has no integer-operator form (non-integer constants, true division, functions)."""
    memo = {} if memo is None else memo

    def fold(name, args):
        out = go(args[0])
        for a in args[1:]:
            out = _int_op(graph, name, out, go(a))
        return out

    def go(e):
        if e in memo:
            return memo[e]
        args = e.args
        if isinstance(e, sympy.Symbol):
            out = symbol(e.name)
        elif isinstance(e, sympy.Integer):
            out = int(e)
        elif e is sympy.true or e is sympy.false:
            out = e is sympy.true
        elif isinstance(e, sympy.Add):
            out = fold("add", args)
        elif isinstance(e, sympy.Mul):
            out = fold("mul", args)
        elif isinstance(e, S._POW):
            if not (isinstance(args[1], sympy.Integer) and int(args[1]) >= 0):
                raise UnsupportedError(f"size expression {expr}: power with exponent {args[1]}")
            out = 1
            for _ in range(int(args[1])):
                out = _int_op(graph, "mul", out, go(args[0]))
        elif isinstance(e, (F.FloorDiv, F.CleanDiv)):
            out = _int_op(graph, "floordiv", go(args[0]), go(args[1]))
        elif isinstance(e, F.CeilDiv):  # -((-a) // b)
            out = _int_op(graph, "neg", _int_op(graph, "floordiv", _int_op(graph, "neg", go(args[0])), go(args[1])))
        elif isinstance(e, (F.PythonMod, sympy.Mod, F.Mod)):
            out = _int_op(graph, "mod", go(args[0]), go(args[1]))
        elif isinstance(e, F.ModularIndexing):
            out = _int_op(graph, "mod", _int_op(graph, "floordiv", go(args[0]), go(args[1])), go(args[2]))
        elif isinstance(e, S._MAX):
            out = fold("max", args)
        elif isinstance(e, S._MIN):
            out = fold("min", args)
        elif isinstance(e, F.Identity):
            out = go(args[0])
        elif type(e) in _RELATIONS:
            out = _int_op(graph, _RELATIONS[type(e)], go(args[0]), go(args[1]))
        elif isinstance(e, sympy.And):
            out = fold("and", args)
        elif isinstance(e, sympy.Or):
            out = fold("or", args)
        elif isinstance(e, sympy.Not):
            out = _int_op(graph, "not", go(args[0]))
        else:
            raise UnsupportedError(f"size expression {expr}: {type(e).__name__} has no integer-operator form")
        memo[e] = out
        return out

    return go(expr)


def size_graph(program, values: Sequence, bindings: dict | None = None) -> torch.fx.Graph:
    """The FX graph of a size program: placeholders for the region's inputs (their symbolic
    fake tensors), a size or stride read per symbol used (bound by the program, or by
    `bindings`), and `values` (ints and SizeExprs: integers, or relations for a guard program)
    computed from them, returned as a tuple."""
    symbols = {**program.symbols, **(bindings or {})}
    g = torch.fx.Graph()
    placeholders = [n for n in program.graph_module.graph.nodes if n.op == "placeholder"]
    args = []
    for n in placeholders:
        p = _located(g.placeholder(n.name))
        p.meta["val"] = n.meta["val"]
        args.append(p)
    reads: dict[str, torch.fx.Node] = {}

    def symbol(name: str):
        if name not in reads:
            b = symbols[name]
            op = torch.ops.aten.sym_size.int if b.kind == "size" else torch.ops.aten.sym_stride.int
            node = g.call_function(op, (args[b.input], b.dim))
            fake = args[b.input].meta["val"]
            node.meta["val"] = (fake.shape if b.kind == "size" else fake.stride())[b.dim]
            reads[name] = _located(node)
        return reads[name]

    memo: dict = {}
    outs = [expand(g, v.expr, symbol, memo) if isinstance(v, S.SizeExpr) else int(v) for v in values]
    _located(g.output(tuple(outs)))
    return g


def size_function_name(program, index: int) -> str:
    return f"{program.name}_sizes_{index}"


def guard_function_name(program, index: int) -> str:
    return f"{program.name}_guards_{index}"


def import_size_program(program, values: Sequence | None, context, index: int, guards: Sequence = ()):
    """A new torch-dialect module (in `context`) holding `size_function_name(program, index)`:
    the size program `values` of specialization `index` (when not None), and, when it has size
    guards, `guard_function_name(program, index)`: one bool per guard, `guards` given as their
    `condition()`s (Note [Sizes through the torch dialect])."""
    torch_d.register_dialect(context)
    importer = FxImporter(context=context)
    if values is not None:
        importer.import_stateless_graph(size_graph(program, values), func_name=size_function_name(program, index))
    if guards:
        bindings = {name: b for _, extra in guards for name, b in extra.items()}
        relations = [S.SizeExpr(relation) for relation, _ in guards]
        importer.import_stateless_graph(size_graph(program, relations, bindings),
                                        func_name=guard_function_name(program, index))
    return importer.module
