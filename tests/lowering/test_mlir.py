"""Goldens for the region in torch dialect and the generated host program; the repro path of a
failed pipeline."""

from __future__ import annotations

import os
import subprocess
import sys

import expecttest
import pytest
from torch_mlir import ir

from tests.goldens import axpy_graph
from trident.errors import LoweringError
from trident.lowering import compile_host
from trident.lowering.host_plan import format_plan
from trident.runtime import SCMRuntime


def _runtime(opt) -> SCMRuntime:
    (rid,) = opt.meta["trident_regions"]
    return SCMRuntime.get(rid)


class TestMLIR(expecttest.TestCase):
    def test_torch_dialect(self):
        _, opt = axpy_graph()
        self.assertExpectedInline(_runtime(opt).torch_mlir, """\
module {
  func.func @region0(%arg0: !torch.vtensor<[1000],f32>, %arg1: !torch.vtensor<[1000],f32>) -> !torch.vtensor<[1000],f32> {
    %none = torch.constant.none
    %none_0 = torch.constant.none
    %none_1 = torch.constant.none
    %false = torch.constant.bool false
    %none_2 = torch.constant.none
    %0 = torch.aten.empty_like %arg0, %none, %none_0, %none_1, %false, %none_2 : !torch.vtensor<[1000],f32>, !torch.none, !torch.none, !torch.none, !torch.bool, !torch.none -> !torch.vtensor<[1000],f32>
    %int0 = torch.constant.int 0
    %1 = torch.prim.ListConstruct %arg0, %arg1 : (!torch.vtensor<[1000],f32>, !torch.vtensor<[1000],f32>) -> !torch.list<vtensor>
    %2 = torch.prim.ListConstruct %0 : (!torch.vtensor<[1000],f32>) -> !torch.list<vtensor>
    %3 = torch.operator "torch.trident.triton_launch"(%int0, %1, %2) : (!torch.int, !torch.list<vtensor>, !torch.list<vtensor>) -> !torch.list<vtensor> 
    %4 = torch.prim.ListUnpack %3 : !torch.list<vtensor> -> !torch.vtensor<[1000],f32>
    return %4 : !torch.vtensor<[1000],f32>
  }
}
""")

    def test_host_program(self):
        _, opt = axpy_graph()
        self.assertExpectedInline(_runtime(opt).host_mlir, """\
module {
  func.func @scm_select(%arg0: !llvm.ptr, %arg1: !llvm.ptr) -> i64 {
    %0 = llvm.load %arg1 : !llvm.ptr -> !llvm.ptr
    cf.br ^bb1
  ^bb1:  // pred: ^bb0
    %1 = llvm.mlir.addressof @scm_guards_0 : !llvm.ptr
    %c0_i64 = arith.constant 0 : i64
    cf.br ^bb4(%c0_i64 : i64)
  ^bb2:  // pred: ^bb6
    %c0_i64_0 = arith.constant 0 : i64
    return %c0_i64_0 : i64
  ^bb3:  // pred: ^bb5
    %c-1_i64 = arith.constant -1 : i64
    return %c-1_i64 : i64
  ^bb4(%2: i64):  // 2 preds: ^bb1, ^bb5
    %c40_i64 = arith.constant 40 : i64
    %3 = arith.cmpi slt, %2, %c40_i64 : i64
    cf.cond_br %3, ^bb5, ^bb6
  ^bb5:  // pred: ^bb4
    %4 = llvm.getelementptr %1[%2] : (!llvm.ptr, i64) -> !llvm.ptr, i64
    %5 = llvm.load %4 : !llvm.ptr -> i64
    %c1_i64 = arith.constant 1 : i64
    %6 = arith.addi %2, %c1_i64 : i64
    %7 = llvm.getelementptr %1[%6] : (!llvm.ptr, i64) -> !llvm.ptr, i64
    %8 = llvm.load %7 : !llvm.ptr -> i64
    %c2_i64 = arith.constant 2 : i64
    %9 = arith.addi %2, %c2_i64 : i64
    %10 = llvm.getelementptr %1[%9] : (!llvm.ptr, i64) -> !llvm.ptr, i64
    %11 = llvm.load %10 : !llvm.ptr -> i64
    %c3_i64 = arith.constant 3 : i64
    %12 = arith.addi %2, %c3_i64 : i64
    %13 = llvm.getelementptr %1[%12] : (!llvm.ptr, i64) -> !llvm.ptr, i64
    %14 = llvm.load %13 : !llvm.ptr -> i64
    %15 = llvm.getelementptr %0[%5] : (!llvm.ptr, i64) -> !llvm.ptr, i64
    %16 = llvm.load %15 : !llvm.ptr -> i64
    %17 = arith.andi %16, %8 : i64
    %18 = arith.cmpi eq, %17, %11 : i64
    %19 = arith.extui %18 : i1 to i64
    %20 = arith.cmpi eq, %19, %14 : i64
    %c4_i64 = arith.constant 4 : i64
    %21 = arith.addi %2, %c4_i64 : i64
    cf.cond_br %20, ^bb4(%21 : i64), ^bb3
  ^bb6:  // pred: ^bb4
    cf.br ^bb2
  }
  llvm.mlir.global internal constant @scm_guards_0(dense<[1, -1, 6, 1, 2, -1, 1, 1, 3, -1, 1000, 1, 4, -1, 1, 1, 0, 15, 0, 1, 6, -1, 6, 1, 7, -1, 1, 1, 8, -1, 1000, 1, 9, -1, 1, 1, 5, 15, 0, 1]> : tensor<40xi64>) {addr_space = 0 : i32} : !llvm.array<40 x i64>
  func.func @scm_host(%arg0: !llvm.ptr, %arg1: !llvm.ptr) -> i64 {
    %0 = llvm.load %arg1 : !llvm.ptr -> !llvm.ptr
    %1 = llvm.getelementptr %arg0[7] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
    %2 = llvm.load %1 : !llvm.ptr -> !llvm.ptr
    %c1_i64 = arith.constant 1 : i64
    %3 = llvm.alloca %c1_i64 x i64 : (i64) -> !llvm.ptr
    %4 = call @scm_select(%arg0, %arg1) : (!llvm.ptr, !llvm.ptr) -> i64
    cf.br ^bb1
  ^bb1:  // pred: ^bb0
    %c0_i64 = arith.constant 0 : i64
    %5 = arith.cmpi eq, %4, %c0_i64 : i64
    cf.cond_br %5, ^bb2, ^bb3
  ^bb2:  // pred: ^bb1
    %c0_i64_0 = arith.constant 0 : i64
    %6 = llvm.call %2(%arg1, %c0_i64_0, %3) : !llvm.ptr, (!llvm.ptr, i64, !llvm.ptr) -> i64
    %c0_i64_1 = arith.constant 0 : i64
    %7 = arith.cmpi eq, %6, %c0_i64_1 : i64
    cf.cond_br %7, ^bb5, ^bb4
  ^bb3:  // pred: ^bb1
    %c-1_i64 = arith.constant -1 : i64
    return %c-1_i64 : i64
  ^bb4:  // pred: ^bb2
    %c-2_i64 = arith.constant -2 : i64
    return %c-2_i64 : i64
  ^bb5:  // pred: ^bb2
    %c0_i64_2 = arith.constant 0 : i64
    return %c0_i64_2 : i64
  }
}
""")

    def test_host_plan(self):
        _, opt = axpy_graph()
        rt = _runtime(opt)
        self.assertExpectedInline(format_plan(rt.host_plans[0]), """\
plan of specialization 0: 2 ops
  alloc #0 empty_like
  launch #0 axpy_kernel[8, 1, 1] (triton_kernel_wrapper_mutation_proxy)
      x_ptr: *fp32 = input0
      y_ptr: *fp32 = input1
      out_ptr: *fp32 = %0 aligned16
      n: i32 = 1000
      alpha: fp32 = 0x40200000""")


def test_failed_pipeline_saves_input_and_repro(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIDENT_REPRO_DIR", str(tmp_path))
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = True
    with ctx, ir.Location.unknown():
        # An op no conversion knows: convert-to-llvm must fail on it.
        module = ir.Module.parse('func.func @scm_host() { "bogus.op"() : () -> () return }')
    with pytest.raises(LoweringError) as info:
        compile_host(module, "broken")
    msg = str(info.value)
    saved = tmp_path / "broken.mlir"
    assert saved.exists() and "bogus.op" in saved.read_text()
    assert f"-m trident.lowering.pipeline {saved}" in msg
    # The printed command reproduces the failure.
    proc = subprocess.run(
        [sys.executable, "-m", "trident.lowering.pipeline", str(saved)],
        capture_output=True, text=True, env={**os.environ, "TRIDENT_REPRO_DIR": str(tmp_path / "again")},
    )
    assert proc.returncode != 0 and "LoweringError" in proc.stderr


def test_symbolic_host_plan_reads_its_size_program():
    """Note [Host plans]: a symbolic region's operators, allocations and grids read the size
    program's array; the host program computes each entry (its symbols are loads of facts)."""
    import re

    import torch

    import trident
    from tests.capture.test_symbolic import reshaped_rowsum

    opt = trident.optimize(trident.capture(reshaped_rowsum, torch.randn(64), dynamic=True))
    rt = _runtime(opt)
    text = format_plan(rt.host_plans[0])
    (sym,) = set(re.findall(r"s\d+", text))
    # the view is native (Note [Symbolic views]): its run is the operator's size arguments (the
    # fallback's), then the base's sizes and strides, its own, and its offset from the base
    run = [f"({sym}//16)", sym, "1", f"({sym}//16)", "16", "16", "1", "0"]
    assert "".join(f"  sizes[{k}] = {e}\n" for k, e in enumerate(run)) in text, text
    assert "view #0 view sizes@0" in text and f"alloc #0 empty sizes@{len(run)}" in text
    assert re.search(r"launch #0 _rowsum_kernel\[sizes\[\d+\], 1, 1\]", text)
    assert "arith.floordivsi" in rt.host_mlir and "llvm.call" in rt.host_mlir
