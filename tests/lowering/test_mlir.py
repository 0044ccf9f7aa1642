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
    %1 = llvm.getelementptr %0[1] : (!llvm.ptr) -> !llvm.ptr, i64
    %2 = llvm.load %1 : !llvm.ptr -> i64
    %3 = llvm.getelementptr %0[2] : (!llvm.ptr) -> !llvm.ptr, i64
    %4 = llvm.load %3 : !llvm.ptr -> i64
    %5 = llvm.getelementptr %0[3] : (!llvm.ptr) -> !llvm.ptr, i64
    %6 = llvm.load %5 : !llvm.ptr -> i64
    %7 = llvm.getelementptr %0[4] : (!llvm.ptr) -> !llvm.ptr, i64
    %8 = llvm.load %7 : !llvm.ptr -> i64
    %9 = llvm.getelementptr %0[0] : (!llvm.ptr) -> !llvm.ptr, i64
    %10 = llvm.load %9 : !llvm.ptr -> i64
    %11 = llvm.getelementptr %0[6] : (!llvm.ptr) -> !llvm.ptr, i64
    %12 = llvm.load %11 : !llvm.ptr -> i64
    %13 = llvm.getelementptr %0[7] : (!llvm.ptr) -> !llvm.ptr, i64
    %14 = llvm.load %13 : !llvm.ptr -> i64
    %15 = llvm.getelementptr %0[8] : (!llvm.ptr) -> !llvm.ptr, i64
    %16 = llvm.load %15 : !llvm.ptr -> i64
    %17 = llvm.getelementptr %0[9] : (!llvm.ptr) -> !llvm.ptr, i64
    %18 = llvm.load %17 : !llvm.ptr -> i64
    %19 = llvm.getelementptr %0[5] : (!llvm.ptr) -> !llvm.ptr, i64
    %20 = llvm.load %19 : !llvm.ptr -> i64
    cf.br ^bb1
  ^bb1:  // pred: ^bb0
    %true = arith.constant true
    %c6_i64 = arith.constant 6 : i64
    %21 = arith.cmpi eq, %2, %c6_i64 : i64
    %22 = arith.andi %true, %21 : i1
    %c1_i64 = arith.constant 1 : i64
    %23 = arith.cmpi eq, %4, %c1_i64 : i64
    %24 = arith.andi %22, %23 : i1
    %c1000_i64 = arith.constant 1000 : i64
    %25 = arith.cmpi eq, %6, %c1000_i64 : i64
    %26 = arith.andi %24, %25 : i1
    %c1_i64_0 = arith.constant 1 : i64
    %27 = arith.cmpi eq, %8, %c1_i64_0 : i64
    %28 = arith.andi %26, %27 : i1
    %c15_i64 = arith.constant 15 : i64
    %29 = arith.andi %10, %c15_i64 : i64
    %c0_i64 = arith.constant 0 : i64
    %30 = arith.cmpi eq, %29, %c0_i64 : i64
    %true_1 = arith.constant true
    %31 = arith.cmpi eq, %30, %true_1 : i1
    %32 = arith.andi %28, %31 : i1
    %c6_i64_2 = arith.constant 6 : i64
    %33 = arith.cmpi eq, %12, %c6_i64_2 : i64
    %34 = arith.andi %32, %33 : i1
    %c1_i64_3 = arith.constant 1 : i64
    %35 = arith.cmpi eq, %14, %c1_i64_3 : i64
    %36 = arith.andi %34, %35 : i1
    %c1000_i64_4 = arith.constant 1000 : i64
    %37 = arith.cmpi eq, %16, %c1000_i64_4 : i64
    %38 = arith.andi %36, %37 : i1
    %c1_i64_5 = arith.constant 1 : i64
    %39 = arith.cmpi eq, %18, %c1_i64_5 : i64
    %40 = arith.andi %38, %39 : i1
    %c15_i64_6 = arith.constant 15 : i64
    %41 = arith.andi %20, %c15_i64_6 : i64
    %c0_i64_7 = arith.constant 0 : i64
    %42 = arith.cmpi eq, %41, %c0_i64_7 : i64
    %true_8 = arith.constant true
    %43 = arith.cmpi eq, %42, %true_8 : i1
    %44 = arith.andi %40, %43 : i1
    cf.cond_br %44, ^bb2, ^bb3
  ^bb2:  // pred: ^bb1
    %c0_i64_9 = arith.constant 0 : i64
    return %c0_i64_9 : i64
  ^bb3:  // pred: ^bb1
    %c-1_i64 = arith.constant -1 : i64
    return %c-1_i64 : i64
  }
  func.func @scm_host(%arg0: !llvm.ptr, %arg1: !llvm.ptr) -> i64 {
    %0 = llvm.load %arg1 : !llvm.ptr -> !llvm.ptr
    %1 = llvm.getelementptr %arg0[0] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
    %2 = llvm.load %1 : !llvm.ptr -> !llvm.ptr
    %3 = llvm.getelementptr %arg0[1] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
    %4 = llvm.load %3 : !llvm.ptr -> !llvm.ptr
    %5 = llvm.getelementptr %arg0[2] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
    %6 = llvm.load %5 : !llvm.ptr -> !llvm.ptr
    %7 = llvm.getelementptr %arg0[3] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
    %8 = llvm.load %7 : !llvm.ptr -> !llvm.ptr
    %9 = llvm.getelementptr %arg0[4] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
    %10 = llvm.load %9 : !llvm.ptr -> !llvm.ptr
    %11 = llvm.getelementptr %arg0[5] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr
    %12 = llvm.load %11 : !llvm.ptr -> !llvm.ptr
    %c5_i64 = arith.constant 5 : i64
    %13 = llvm.alloca %c5_i64 x i64 : (i64) -> !llvm.ptr
    %14 = call @scm_select(%arg0, %arg1) : (!llvm.ptr, !llvm.ptr) -> i64
    %15 = llvm.getelementptr %0[0] : (!llvm.ptr) -> !llvm.ptr, i64
    %16 = llvm.load %15 : !llvm.ptr -> i64
    %17 = llvm.getelementptr %0[5] : (!llvm.ptr) -> !llvm.ptr, i64
    %18 = llvm.load %17 : !llvm.ptr -> i64
    cf.br ^bb1
  ^bb1:  // pred: ^bb0
    %c0_i64 = arith.constant 0 : i64
    %19 = arith.cmpi eq, %14, %c0_i64 : i64
    cf.cond_br %19, ^bb2, ^bb3
  ^bb2:  // pred: ^bb1
    %c0_i64_0 = arith.constant 0 : i64
    %20 = llvm.call %2(%arg1, %c0_i64_0) : !llvm.ptr, (!llvm.ptr, i64) -> i64
    %c-1_i64 = arith.constant -1 : i64
    %21 = arith.cmpi ne, %20, %c-1_i64 : i64
    cf.cond_br %21, ^bb5, ^bb4
  ^bb3:  // pred: ^bb1
    %c-1_i64_1 = arith.constant -1 : i64
    return %c-1_i64_1 : i64
  ^bb4:  // 3 preds: ^bb2, ^bb5, ^bb6
    %c-2_i64 = arith.constant -2 : i64
    return %c-2_i64 : i64
  ^bb5:  // pred: ^bb2
    %22 = llvm.getelementptr %13[0] : (!llvm.ptr) -> !llvm.ptr, i64
    llvm.store %16, %22 : i64, !llvm.ptr
    %23 = llvm.getelementptr %13[1] : (!llvm.ptr) -> !llvm.ptr, i64
    llvm.store %18, %23 : i64, !llvm.ptr
    %24 = llvm.getelementptr %13[2] : (!llvm.ptr) -> !llvm.ptr, i64
    llvm.store %20, %24 : i64, !llvm.ptr
    %c15_i64 = arith.constant 15 : i64
    %25 = arith.andi %20, %c15_i64 : i64
    %c0_i64_2 = arith.constant 0 : i64
    %26 = arith.cmpi eq, %25, %c0_i64_2 : i64
    %c1000_i64 = arith.constant 1000 : i64
    %27 = llvm.getelementptr %13[3] : (!llvm.ptr) -> !llvm.ptr, i64
    llvm.store %c1000_i64, %27 : i64, !llvm.ptr
    %c1075838976_i64 = arith.constant 1075838976 : i64
    %28 = llvm.getelementptr %13[4] : (!llvm.ptr) -> !llvm.ptr, i64
    llvm.store %c1075838976_i64, %28 : i64, !llvm.ptr
    cf.cond_br %26, ^bb6, ^bb4
  ^bb6:  // pred: ^bb5
    %c0_i64_3 = arith.constant 0 : i64
    %c8_i64 = arith.constant 8 : i64
    %c1_i64 = arith.constant 1 : i64
    %c1_i64_4 = arith.constant 1 : i64
    %29 = llvm.call %4(%arg1, %c0_i64_3, %c8_i64, %c1_i64, %c1_i64_4, %13) : !llvm.ptr, (!llvm.ptr, i64, i64, i64, i64, !llvm.ptr) -> i64
    %c0_i64_5 = arith.constant 0 : i64
    %30 = arith.cmpi eq, %29, %c0_i64_5 : i64
    cf.cond_br %30, ^bb7, ^bb4
  ^bb7:  // pred: ^bb6
    %c0_i64_6 = arith.constant 0 : i64
    return %c0_i64_6 : i64
  }
}
""")


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
