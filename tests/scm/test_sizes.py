"""Size expressions (Note [Symbolic sizes]): the native code `sizes.emit` generates against the
Python reference `sizes.evaluate` and against plain Python arithmetic (what a grid lambda
computes), on thousands of random sizes including 0, 1, 15, 16, 2**31 - 1 and 2**31."""

from __future__ import annotations

import ctypes
import random

import pytest
import sympy
from torch.utils._sympy import functions as F
from torch_mlir import ir
from torch_mlir.dialects import arith, func
from torch_mlir.execution_engine import ExecutionEngine

from trident.errors import UnsupportedError
from trident.lowering import lower_to_llvm
from trident.scm import sizes

s0, s1, s2 = sympy.symbols("s0 s1 s2", integer=True, positive=True)
SYMS = ("s0", "s1", "s2")


def cdiv(a, b):
    return (a + b - 1) // b


# (sympy expression, what Python computes for it)
CASES = [
    (F.FloorDiv(s0 + 63, 64), lambda a, b, c: cdiv(a, 64)),
    (F.FloorDiv(s0 * s1 + 1023, 1024), lambda a, b, c: cdiv(a * b, 1024)),
    (F.CeilDiv(s0, 128), lambda a, b, c: cdiv(a, 128)),
    (s0 * s1 * s2, lambda a, b, c: a * b * c),
    (F.PythonMod(s0, 16), lambda a, b, c: a % 16),
    (F.ModularIndexing(s0, 4, 8), lambda a, b, c: (a // 4) % 8),
    (F.Max(s0, s1), lambda a, b, c: max(a, b)),
    (F.Min(s0, 2 * s1 + 1), lambda a, b, c: min(a, 2 * b + 1)),
    (F.FloorDiv(F.Min(s0, 4096) + 255, 256) * s2, lambda a, b, c: cdiv(min(a, 4096), 256) * c),
    (s0 - 3 * s1, lambda a, b, c: a - 3 * b),
    (F.FloorDiv(s0 - 3 * s1, 7), lambda a, b, c: (a - 3 * b) // 7),  # negative numerators: floor
    (F.PythonMod(s0 - 3 * s1, 7), lambda a, b, c: (a - 3 * b) % 7),
    (sympy.Eq(F.PythonMod(s0, 16), 0), lambda a, b, c: a % 16 == 0),
    (sympy.Ne(s0, 1), lambda a, b, c: a != 1),
    (sympy.And(s0 >= 2, s1 < s0), lambda a, b, c: a >= 2 and b < a),
    (sympy.Or(sympy.Eq(s0, s1), s2 > 16), lambda a, b, c: a == b or c > 16),
    (F.PowByNatural(s0, 2) + s1, lambda a, b, c: a * a + b),
]

BOUNDARY = [0, 1, 2, 15, 16, 17, 63, 64, 1000, 2**31 - 1, 2**31, 2**31 + 15]


def _compile(exprs):
    ctx = ir.Context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        i64 = ir.IntegerType.get_signless(64)
        for k, e in enumerate(exprs):
            with ir.InsertionPoint(module.body):
                fn = func.FuncOp(f"f{k}", ir.FunctionType.get([i64] * 3, [i64]))
                fn.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
            block = fn.add_entry_block()
            with ir.InsertionPoint(block):
                env = dict(zip(SYMS, block.arguments))
                out = sizes.emit(e, env.__getitem__, lambda v: arith.constant(i64, v))
                if out.type != i64:  # a relation: i1 -> 0/1
                    out = arith.ExtUIOp(i64, out).result
                func.ReturnOp([out])
        lower_to_llvm(module, "sizes")
        engine = ExecutionEngine(module, opt_level=0)
    fns = []
    for k in range(len(exprs)):
        packed = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(engine.raw_lookup(f"f{k}"))

        def call(a, b, c, packed=packed):
            args = [ctypes.c_int64(a), ctypes.c_int64(b), ctypes.c_int64(c)]
            res = ctypes.c_int64(-99)
            ptrs = (ctypes.c_void_p * 4)(*[ctypes.addressof(x) for x in args], ctypes.addressof(res))
            packed(ptrs)
            return res.value

        fns.append(call)
    return fns, engine


def test_native_size_expressions_equal_python_on_random_sizes():
    fns, engine = _compile([e for e, _ in CASES])
    rng = random.Random(0)
    checked = 0
    for _ in range(700):
        a, b, c = (rng.choice(BOUNDARY) if rng.random() < 0.3 else rng.randrange(1, 1 << rng.choice((4, 12, 20, 31)))
                   for _ in range(3))
        env = {"s0": a, "s1": b, "s2": c}
        for (expr, py), native in zip(CASES, fns):
            want = py(a, b, c)
            assert sizes.evaluate(expr, env) == want, (expr, env)
            if not -(2**63) <= int(want) < 2**63:
                continue  # sizes are int64 in torch: no tensor has these
            got = native(a, b, c)
            assert got == int(want), (expr, env, got, want)
            checked += 1
    assert checked >= 10000
    del engine


def test_records_name_only_expression_classes():
    with pytest.raises(UnsupportedError, match="not a size expression"):
        sizes.from_text("__import__('os').system('true')")


def test_unsupported_expressions_are_named():
    with pytest.raises(UnsupportedError, match="no native form"):
        sizes.check_native(F.IntTrueDiv(s0, 3))
    with pytest.raises(UnsupportedError, match="no native form"):
        sizes.evaluate(sympy.sin(s0), {"s0": 1})


def test_text_round_trip():
    for expr, _ in CASES:
        back = sizes.from_text(sizes.to_text(sizes.SizeExpr(expr))).expr
        assert back == expr
        env = {"s0": 37, "s1": 5, "s2": 19}
        assert sizes.evaluate(back, env) == sizes.evaluate(expr, env), expr
