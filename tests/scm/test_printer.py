"""Goldens for the printed SCM IR."""

from __future__ import annotations

import expecttest
import torch

import trident
from tests.goldens import axpy_graph, mixed_graph, tuned_graph


class TestSCMText(expecttest.TestCase):
    def test_axpy(self):
        _, opt = axpy_graph()
        self.assertExpectedInline(trident.scm_text(opt), """\
scm region0(x, y) -> (empty_like)
  empty_like = aten.empty_like.default  # value 0
  launch axpy_kernel[8, 1, 1](x_ptr=x, y_ptr=y, out_ptr=empty_like, n=1000, alpha=2.5, BLOCK=128) writes(out_ptr)
  specialization 0:
    guards:
      x: f32[1000] strides=(1) cpu aligned16
      y: f32[1000] strides=(1) cpu aligned16
    plan:
      empty_like = alloc f32[1000] strides=(1) cpu
      launch axpy_kernel[8, 1, 1] key=(*fp32:D, *fp32:D, *fp32:D, i32, fp32, constexpr=128) num_warps=4 shared=0
        params: x_ptr=x:*fp32, y_ptr=y:*fp32, out_ptr=empty_like:*fp32, n=1000:i32, alpha=2.5:fp32
        runtime check: empty_like 16-byte aligned
""")

    def test_autotune_and_heuristics(self):
        _, opt = tuned_graph()
        self.assertExpectedInline(trident.scm_text(opt), """\
scm region0(x) -> (empty_like_1)
  empty_like = aten.empty_like.default  # value 0
  launch tuned_scale_kernel[autotune: 25, 1, 1 | 13, 1, 1 | 4, 1, 1](x_ptr=x, out_ptr=empty_like, n=777, factor=3.0) writes(out_ptr)
  empty_like_1 = aten.empty_like.default  # value 1
  launch heuristic_double_kernel[13, 1, 1](x_ptr=empty_like, out_ptr=empty_like_1, n=777, BLOCK=64, EVEN=False, WIDE=False) writes(out_ptr) heuristics(EVEN, WIDE)
  specialization 0:
    guards:
      x: f32[777] strides=(1) cpu aligned16
    plan:
      empty_like = alloc f32[777] strides=(1) cpu
      empty_like_1 = alloc f32[777] strides=(1) cpu
      launch tuned_scale_kernel[25, 1, 1] key=(*fp32:D, *fp32:D, i32, fp32, constexpr=32) num_warps=1 shared=0
        autotuned: config 1/3 (BLOCK=32, num_warps=1, num_ctas=1, num_stages=3); first config after pruning (no GPU to time on)
        params: x_ptr=x:*fp32, out_ptr=empty_like:*fp32, n=777:i32, factor=3.0:fp32
        runtime check: empty_like 16-byte aligned
      launch heuristic_double_kernel[13, 1, 1] key=(*fp32:D, *fp32:D, i32, constexpr=64, constexpr=False, constexpr=False) num_warps=4 shared=0
        params: x_ptr=empty_like:*fp32, out_ptr=empty_like_1:*fp32, n=777:i32
        runtime check: empty_like, empty_like_1 16-byte aligned
      after step 3: release empty_like
""")

    def test_mixed(self):
        _, opt = mixed_graph()
        self.assertExpectedInline(trident.scm_text(opt), """\
scm region0(x, y) -> (sin)
  empty_like = aten.empty_like.default  # value 0
  launch axpy_kernel[13, 1, 1](num_warps=2, num_ctas=1, num_stages=3, x_ptr=x, y_ptr=y, out_ptr=empty_like, n=777, alpha=0.5, BLOCK=64) writes(out_ptr)
  zeros_like = aten.zeros_like.default  # value 1
  launch axpy_kernel[4, 1, 1](x_ptr=empty_like, y_ptr=x, out_ptr=zeros_like, n=777, alpha=-1.0, BLOCK=256) writes(out_ptr)
  sin = aten.sin.default(zeros_like)
  specialization 0:
    guards:
      x: f32[777] strides=(1) cpu aligned16
      y: f32[777] strides=(1) cpu aligned16
    plan:
      empty_like = alloc f32[777] strides=(1) cpu
      zeros_like = alloc f32[777] strides=(1) cpu zeroed
      launch axpy_kernel[13, 1, 1] key=(*fp32:D, *fp32:D, *fp32:D, i32, fp32, constexpr=64) num_warps=2 shared=0
        params: x_ptr=x:*fp32, y_ptr=y:*fp32, out_ptr=empty_like:*fp32, n=777:i32, alpha=0.5:fp32
        runtime check: empty_like 16-byte aligned
      launch axpy_kernel[4, 1, 1] key=(*fp32:D, *fp32:D, *fp32:D, i32, fp32, constexpr=256) num_warps=4 shared=0
        params: x_ptr=empty_like:*fp32, y_ptr=x:*fp32, out_ptr=zeros_like:*fp32, n=777:i32, alpha=-1.0:fp32
        runtime check: empty_like, zeros_like 16-byte aligned
scm region1(python_scale!) -> (mul)
  launch inplace_mul_kernel[7, 1, 1](x_ptr=python_scale, n=777, factor=3.0, BLOCK=128) writes(x_ptr)
  mul = aten.mul.Tensor(python_scale, 1.0)
  specialization 0:
    guards:
      python_scale: f32[777] strides=(1) cpu aligned16
    plan:
      launch inplace_mul_kernel[7, 1, 1] key=(*fp32:D, i32, fp32, constexpr=128) num_warps=4 shared=0
        params: x_ptr=python_scale:*fp32, n=777:i32, factor=3.0:fp32
""")

    def test_second_specialization_after_misaligned_miss(self):
        _, opt = axpy_graph()
        x = torch.randn(1001)[1:]
        opt(x, torch.randn(1000))
        self.assertExpectedInline(trident.scm_text(opt), """\
scm region0(x, y) -> (empty_like)
  empty_like = aten.empty_like.default  # value 0
  launch axpy_kernel[8, 1, 1](x_ptr=x, y_ptr=y, out_ptr=empty_like, n=1000, alpha=2.5, BLOCK=128) writes(out_ptr)
  specialization 0:
    guards:
      x: f32[1000] strides=(1) cpu aligned16
      y: f32[1000] strides=(1) cpu aligned16
    plan:
      empty_like = alloc f32[1000] strides=(1) cpu
      launch axpy_kernel[8, 1, 1] key=(*fp32:D, *fp32:D, *fp32:D, i32, fp32, constexpr=128) num_warps=4 shared=0
        params: x_ptr=x:*fp32, y_ptr=y:*fp32, out_ptr=empty_like:*fp32, n=1000:i32, alpha=2.5:fp32
        runtime check: empty_like 16-byte aligned
  specialization 1:
    guards:
      x: f32[1000] strides=(1) cpu unaligned16
      y: f32[1000] strides=(1) cpu aligned16
    plan:
      empty_like = alloc f32[1000] strides=(1) cpu
      launch axpy_kernel[8, 1, 1] key=(*fp32, *fp32:D, *fp32:D, i32, fp32, constexpr=128) num_warps=4 shared=0
        params: x_ptr=x:*fp32, y_ptr=y:*fp32, out_ptr=empty_like:*fp32, n=1000:i32, alpha=2.5:fp32
        runtime check: empty_like 16-byte aligned
""")
