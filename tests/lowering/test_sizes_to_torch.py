"""Note [Sizes through the torch dialect]: size expressions -> torch-mlir's FX importer (dynamic
dimensions, torch.aten.size.int and integer operators) -> arith (torch_to_arith), checked against
Python's integer arithmetic on thousands of random sizes; the size program and the region
function of a symbolic capture as goldens."""

from __future__ import annotations

import ctypes
import random
import types

import expecttest
import pytest
import sympy
import torch
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._sympy import functions as F
from torch_mlir import ir
from torch_mlir.dialects import arith, func
from torch_mlir.execution_engine import ExecutionEngine

import trident
from tests.scm.test_sizes import BOUNDARY, CASES
from trident.errors import LoweringError
from trident.lowering import lower_to_llvm
from trident.lowering.sizes_to_torch import import_size_program, size_function_name
from trident.lowering.torch_to_arith import lower_size_function
from trident.scm.sizes import Binding, SizeExpr


def _program(rank: int = 3):
    """The parts of a RegionProgram a size program reads: one input of `rank` dynamic sizes,
    s0..s{rank-1} bound to them, s{rank}.. to its strides."""
    mode = FakeTensorMode(shape_env=ShapeEnv())
    fake = mode.from_tensor(torch.empty(*range(5, 5 + rank)),
                            symbolic_context=StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * rank))
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = fake
    g.output(x)
    symbols = {f"s{d}": Binding(0, "size", d) for d in range(rank)}
    symbols.update({f"t{d}": Binding(0, "stride", d) for d in range(rank)})
    return types.SimpleNamespace(name="region", graph_module=torch.fx.GraphModule(torch.nn.Module(), g), symbols=symbols)


def _compile(program, values):
    """A native `f(size0, size1, size2, stride0, stride1, stride2) -> values[k]` per value,
    lowered from the torch-dialect size program."""
    ctx = ir.Context()
    torch_module = import_size_program(program, values, ctx, 0)
    text = str(torch_module)
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        i64 = ir.IntegerType.get_signless(64)
        for k in range(len(values)):
            with ir.InsertionPoint(module.body):
                fn = func.FuncOp(f"f{k}", ir.FunctionType.get([i64] * 6, [i64]))
            block = fn.add_entry_block()
            with ir.InsertionPoint(block):
                facts = block.arguments
                outs = lower_size_function(torch_module, size_function_name(program, 0),
                                           lambda i, kind, d: facts[d if kind == "size" else 3 + d])
                out = outs[k] if outs[k].type == i64 else arith.ExtUIOp(i64, outs[k]).result  # a relation: 0/1
                func.ReturnOp([out])
        lower_to_llvm(module, "sizes")
        engine = ExecutionEngine(module, opt_level=0)

    def caller(k):
        packed = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(engine.raw_lookup(f"f{k}"))

        def call(*facts):
            args = [ctypes.c_int64(a) for a in facts]
            res = ctypes.c_int64(-99)
            ptrs = (ctypes.c_void_p * 7)(*[ctypes.addressof(x) for x in args], ctypes.addressof(res))
            packed(ptrs)
            return res.value

        return call

    return [caller(k) for k in range(len(values))], engine, text


def test_size_programs_through_the_torch_dialect_equal_python_on_random_sizes():
    program = _program()
    t0, t1 = sympy.symbols("t0 t1", integer=True, positive=True)
    s0, s1, s2 = sympy.symbols("s0 s1 s2", integer=True, positive=True)
    cases = CASES + [
        (F.FloorDiv(t0, t1) + s2, lambda a, b, c, u, v, w: u // v + c),  # strides too
        (F.CeilDiv(s0 * t1, 64), lambda a, b, c, u, v, w: -(-(a * v) // 64)),
        (F.Max(s0, 5) * F.Min(s1, s2, 8), lambda a, b, c, u, v, w: max(a, 5) * min(b, c, 8)),
    ]
    values = [SizeExpr(e) for e, _ in cases] + [7]  # and a constant entry
    fns, engine, text = _compile(program, values)
    assert "torch.aten.size.int" in text and "torch.aten.stride.int" in text and "!torch.vtensor<[?,?,?],f32>" in text
    rng = random.Random(1)
    checked = 0
    for _ in range(800):
        facts = [rng.choice(BOUNDARY) if rng.random() < 0.3 else rng.randrange(1, 1 << rng.choice((4, 12, 20, 31)))
                 for _ in range(6)]
        facts[4] = max(facts[4], 1)  # the divisor t1 (sizes.evaluate raises on 0; native code takes it as 1)
        for (expr, py), native in zip(cases, fns):
            want = py(*facts) if py.__code__.co_argcount == 6 else py(*facts[:3])
            if not -(2**63) <= int(want) < 2**63:
                continue
            assert native(*facts) == int(want), (expr, facts)
            checked += 1
        assert fns[-1](*facts) == 7
    assert checked >= 10000
    del engine


def test_what_has_no_integer_form_is_named():
    with pytest.raises(trident.errors.UnsupportedError, match="no integer-operator form"):
        import_size_program(_program(), [SizeExpr(F.IntTrueDiv(sympy.Symbol("s0"), 3))], ir.Context(), 0)


def test_an_unknown_op_in_a_size_program_is_a_lowering_error():
    ctx = ir.Context()
    from torch_mlir.dialects import torch as torch_d

    torch_d.register_dialect(ctx)
    with ctx:
        module = ir.Module.parse("""
func.func @region_sizes_0(%arg0: !torch.vtensor<[?],f32>) -> !torch.float {
  %0 = torch.constant.float 1.5
  return %0 : !torch.float
}""")
    with ctx, ir.Location.unknown(), ir.InsertionPoint(ir.Module.create().body):
        with pytest.raises(LoweringError, match="torch.constant.float has no lowering to arith"):
            lower_size_function(module, "region_sizes_0", lambda *a: None)


class TestSymbolicRegionGoldens(expecttest.TestCase):
    def test_region_and_size_program_compute_sizes_from_their_inputs(self):
        from tests.capture.test_symbolic import reshaped_rowsum
        from trident.runtime import SCMRuntime

        opt = trident.optimize(trident.capture(reshaped_rowsum, torch.randn(64), dynamic=True))
        (rid,) = opt.meta["trident_regions"]
        rt = SCMRuntime.get(rid)
        import re

        norm = lambda t: re.sub(r"\bs\d+\b", "s", t)  # noqa: E731
        region = rt.torch_mlir.split("torch.aten.mul.Scalar")[0]
        self.assertExpectedInline(norm(region), """\
module {
  func.func @region0(%arg0: !torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32> {
    %int0 = torch.constant.int 0
    %0 = torch.aten.size.int %arg0, %int0 : !torch.vtensor<[?],f32>, !torch.int -> !torch.int
    %int16 = torch.constant.int 16
    %1 = torch.aten.floordiv.int %0, %int16 : !torch.int, !torch.int -> !torch.int
    %int16_0 = torch.constant.int 16
    %2 = torch.prim.ListConstruct %1, %int16_0 : (!torch.int, !torch.int) -> !torch.list<int>
    %3 = torch.aten.view %arg0, %2 : !torch.vtensor<[?],f32>, !torch.list<int> -> !torch.vtensor<[?,16],f32>
    %float2.000000e00 = torch.constant.float 2.000000e+00
    %4 = """)
        (sizes,) = rt.size_mlirs
        self.assertExpectedInline(norm(sizes), """\
module {
  func.func @region0_sizes_0(%arg0: !torch.vtensor<[?],f32>) -> (!torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.int) {
    %int0 = torch.constant.int 0
    %0 = torch.aten.size.int %arg0, %int0 : !torch.vtensor<[?],f32>, !torch.int -> !torch.int
    %int16 = torch.constant.int 16
    %1 = torch.aten.floordiv.int %0, %int16 : !torch.int, !torch.int -> !torch.int
    %int1 = torch.constant.int 1
    %int16_0 = torch.constant.int 16
    %int16_1 = torch.constant.int 16
    %int1_2 = torch.constant.int 1
    %int0_3 = torch.constant.int 0
    %int1_4 = torch.constant.int 1
    return %1, %0, %int1, %1, %int16_0, %int16_1, %int1_2, %int0_3, %1, %int1_4, %1 : !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.int, !torch.int
  }
  func.func @region0_guards_0(%arg0: !torch.vtensor<[?],f32>) -> (!torch.bool, !torch.bool, !torch.bool, !torch.bool, !torch.bool) {
    %int0 = torch.constant.int 0
    %0 = torch.aten.size.int %arg0, %int0 : !torch.vtensor<[?],f32>, !torch.int -> !torch.int
    %int16 = torch.constant.int 16
    %1 = torch.aten.floordiv.int %0, %int16 : !torch.int, !torch.int -> !torch.int
    %int16_0 = torch.constant.int 16
    %2 = torch.aten.mul.int %int16_0, %1 : !torch.int, !torch.int -> !torch.int
    %3 = torch.aten.eq.int %0, %2 : !torch.int, !torch.int -> !torch.bool
    %int2 = torch.constant.int 2
    %4 = torch.aten.ge.int %2, %int2 : !torch.int, !torch.int -> !torch.bool
    %int1 = torch.constant.int 1
    %5 = torch.aten.ne.int %1, %int1 : !torch.int, !torch.int -> !torch.bool
    %int2_1 = torch.constant.int 2
    %6 = torch.aten.ge.int %1, %int2_1 : !torch.int, !torch.int -> !torch.bool
    %int32 = torch.constant.int 32
    %7 = torch.aten.ge.int %0, %int32 : !torch.int, !torch.int -> !torch.bool
    return %3, %4, %5, %6, %7 : !torch.bool, !torch.bool, !torch.bool, !torch.bool, !torch.bool
  }
}
""")
        for n in (64, 160, 4096):
            x = torch.randn(n)
            torch.testing.assert_close(opt(x), (x.reshape(-1, 16) * 2.0).sum(1) + 1.0)
