"""Size expressions (Note [Symbolic sizes]): the Python reference `sizes.evaluate` against plain
Python arithmetic (what a grid lambda computes) on thousands of random sizes including 0, 1, 15,
16, 2**31 - 1 and 2**31; the native code is checked on the same CASES where it is made
(tests/lowering/test_sizes_to_torch.py, Note [Sizes through the torch dialect])."""

from __future__ import annotations

import random

import pytest
import sympy
from torch.utils._sympy import functions as F
from trident.errors import UnsupportedError
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
    (sympy.Not(sympy.And(s0 > 3, s1 <= 5)), lambda a, b, c: not (a > 3 and b <= 5)),
    (sympy.Or(s0 < s1, sympy.Eq(F.FloorDiv(s2, 16), 2)), lambda a, b, c: a < b or c // 16 == 2),
]

BOUNDARY = [0, 1, 2, 15, 16, 17, 63, 64, 1000, 2**31 - 1, 2**31, 2**31 + 15]


def test_evaluate_equals_python_on_random_sizes():
    rng = random.Random(0)
    checked = 0
    for _ in range(700):
        a, b, c = (rng.choice(BOUNDARY) if rng.random() < 0.3 else rng.randrange(1, 1 << rng.choice((4, 12, 20, 31)))
                   for _ in range(3))
        env = {"s0": a, "s1": b, "s2": c}
        for expr, py in CASES:
            assert sizes.evaluate(expr, env) == py(a, b, c), (expr, env)
            checked += 1
    assert checked >= 10000


def test_every_case_is_native():
    for expr, _ in CASES:
        sizes.check_native(expr)


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
