"""A 2-layer decode step (own Triton kernels + ATen matmuls, attention, cache writes, views)
optimizes to exactly ONE trident.scm node; results and cache contents equal eager over several
positions; the caches are mutated in place, as eager mutates them."""

from __future__ import annotations

import functools

import expecttest
import pytest
import torch

import trident
from tests.conftest import normalize
from tests.decode_model import Config, check_steps_against_reference, decode_step, make_caches, make_weights


@pytest.mark.parametrize("batch", [1, 3])
def test_decode_step_is_one_region_and_matches_eager(device, batch):
    cfg = Config()
    weights, cos, sin = make_weights(cfg, device)
    step = functools.partial(decode_step, cfg)
    x0 = torch.randn(batch, cfg.hidden, device=device)
    pos0 = torch.tensor([0], device=device)
    gm = trident.capture(step, x0, pos0, cos, sin, *make_caches(cfg, device, batch=batch), *weights)
    opt = trident.optimize(gm)
    calls = [n for n in opt.graph.nodes if n.op == "call_function"]
    scm = [n for n in calls if n.target is torch.ops.trident.scm.default]
    assert len(scm) == 1, opt.code
    assert all(n.target is torch.ops.trident.scm.default or "getitem" in str(n.target) for n in calls), opt.code

    check_steps_against_reference(cfg, opt, weights, cos, sin, range(6), device, batch)
    (stats,) = trident.cache_info(opt).values()
    assert stats["misses"] == 0 and stats["hits"] == 6 and stats["specializations"] == 1


class TestDecodeGoldens(expecttest.TestCase):
    """Goldens of the optimized graph and the SCM IR of a one-layer decode step."""

    def _opt(self):
        cfg = Config(layers=1)
        weights, cos, sin = make_weights(cfg, "cpu")
        gm = trident.capture(
            functools.partial(decode_step, cfg),
            torch.randn(1, cfg.hidden), torch.tensor([0]), cos, sin, *make_caches(cfg, "cpu"), *weights,
        )
        return trident.optimize(gm)

    def test_operator_call_mix(self):
        """Most operator calls of a layer avoid the boxed dispatcher path (views, constants,
        typed entries), the attention backend included: nothing stays boxed."""
        (line,) = [x for x in trident.explain(self._opt()).splitlines() if "operator calls" in x]
        self.assertExpectedInline(line.strip(), """operator calls: 35 = 0 address-only views + 17 native views + 3 constants + 15 typed calls + 0 boxed calls""")

    def test_optimized_graph(self):
        self.assertExpectedInline(normalize(self._opt().code.strip()), """\
def forward(self, x, pos, cos_table, sin_table, caches_and_weights_0, caches_and_weights_1, caches_and_weights_2, caches_and_weights_3, caches_and_weights_4, caches_and_weights_5, caches_and_weights_6, caches_and_weights_7, caches_and_weights_8, caches_and_weights_9):
    scm_default = torch.ops.trident.scm.default(REGION, [caches_and_weights_0, caches_and_weights_1], [cos_table, pos, sin_table, x, caches_and_weights_2, caches_and_weights_3, caches_and_weights_4, caches_and_weights_5, caches_and_weights_6, caches_and_weights_7, caches_and_weights_8, caches_and_weights_9]);  caches_and_weights_0 = caches_and_weights_1 = cos_table = pos = sin_table = x = caches_and_weights_2 = caches_and_weights_3 = caches_and_weights_4 = caches_and_weights_5 = caches_and_weights_6 = caches_and_weights_7 = caches_and_weights_8 = caches_and_weights_9 = None
    getitem_2 = scm_default[0];  scm_default = None
    return getitem_2""")

    def test_scm_ir(self):
        self.assertExpectedInline(trident.scm_text(self._opt()), """\
scm region0(caches_and_weights_0!, caches_and_weights_1!, cos_table, pos, sin_table, x, caches_and_weights_2, caches_and_weights_3, caches_and_weights_4, caches_and_weights_5, caches_and_weights_6, caches_and_weights_7, caches_and_weights_8, caches_and_weights_9) -> (empty_like_3)
  index_select = aten.index_select.default(cos_table, 0, pos)
  index_select_1 = aten.index_select.default(sin_table, 0, pos)
  arange = aten.arange.default(32, DEFAULT, DEFAULT, device(type='cpu'), False)  # constant: computed once per device
  le = aten.le.Tensor(arange, pos)
  view = aten.view.default(le, [1, 1, 1, 32])
  empty_like = aten.empty_like.default  # value 5
  launch rmsnorm_kernel[1, 1, 1](x_ptr=x, w_ptr=caches_and_weights_2, out_ptr=empty_like, n=64, eps=1e-05, BLOCK=64) writes(out_ptr)
  t = aten.t.default(caches_and_weights_3)
  mm = aten.mm.default(empty_like, t)
  t_1 = aten.t.default(caches_and_weights_4)
  mm_1 = aten.mm.default(empty_like, t_1)
  t_2 = aten.t.default(caches_and_weights_5)
  mm_2 = aten.mm.default(empty_like, t_2)
  launch rotary_kernel[4, 1, 1](x_ptr=mm, cos_ptr=index_select, sin_ptr=index_select_1, HALF=8) writes(x_ptr)
  launch rotary_kernel[2, 1, 1](x_ptr=mm_1, cos_ptr=index_select, sin_ptr=index_select_1, HALF=8) writes(x_ptr)
  view_1 = aten.view.default(mm_1, [1, 2, 1, 16])
  index_copy_ = aten.index_copy_.default(caches_and_weights_0, 2, pos, view_1)
  view_2 = aten.view.default(mm_2, [1, 2, 1, 16])
  index_copy__1 = aten.index_copy_.default(caches_and_weights_1, 2, pos, view_2)
  unsqueeze = aten.unsqueeze.default(index_copy_, 2)
  expand = aten.expand.default(unsqueeze, [1, 2, 2, 32, 16], DEFAULT)
  clone = aten.clone.default(expand, torch.contiguous_format)
  _unsafe_view = aten._unsafe_view.default(clone, [1, 4, 32, 16])
  unsqueeze_1 = aten.unsqueeze.default(index_copy__1, 2)
  expand_1 = aten.expand.default(unsqueeze_1, [1, 2, 2, 32, 16], DEFAULT)
  clone_1 = aten.clone.default(expand_1, torch.contiguous_format)
  _unsafe_view_1 = aten._unsafe_view.default(clone_1, [1, 4, 32, 16])
  view_3 = aten.view.default(mm, [1, 4, 1, 16])
  scalar_tensor = aten.scalar_tensor.default(-inf, torch.float32, DEFAULT, device(type='cpu'), DEFAULT)  # constant: computed once per device
  scalar_tensor_1 = aten.scalar_tensor.default(0.0, torch.float32, torch.strided, device(type='cpu'), DEFAULT)  # constant: computed once per device
  where = aten.where.self(view, scalar_tensor_1, scalar_tensor)
  _scaled_dot_product_flash_attention_for_cpu[0], _scaled_dot_product_flash_attention_for_cpu[1] = aten._scaled_dot_product_flash_attention_for_cpu.default(view_3, _unsafe_view, _unsafe_view_1, DEFAULT, DEFAULT, where, DEFAULT)
  view_4 = aten.view.default(_scaled_dot_product_flash_attention_for_cpu[0], [1, 64])
  t_3 = aten.t.default(caches_and_weights_6)
  mm_3 = aten.mm.default(view_4, t_3)
  empty_like_1 = aten.empty_like.default  # value 33
  launch residual_add_kernel[1, 1, 1](x_ptr=x, y_ptr=mm_3, out_ptr=empty_like_1, n=64, BLOCK=256) writes(out_ptr)
  empty_like_2 = aten.empty_like.default  # value 34
  launch rmsnorm_kernel[1, 1, 1](x_ptr=empty_like_1, w_ptr=caches_and_weights_7, out_ptr=empty_like_2, n=64, eps=1e-05, BLOCK=64) writes(out_ptr)
  t_4 = aten.t.default(caches_and_weights_8)
  mm_4 = aten.mm.default(empty_like_2, t_4)
  empty = aten.empty.memory_format  # value 37
  launch silu_mul_kernel[1, 1, 1](gu_ptr=mm_4, out_ptr=empty, n=128, BLOCK=128) writes(out_ptr)
  t_5 = aten.t.default(caches_and_weights_9)
  mm_5 = aten.mm.default(empty, t_5)
  empty_like_3 = aten.empty_like.default  # value 40
  launch residual_add_kernel[1, 1, 1](x_ptr=empty_like_1, y_ptr=mm_5, out_ptr=empty_like_3, n=64, BLOCK=256) writes(out_ptr)
  specialization 0:
    guards:
      caches_and_weights_0: f32[1, 2, 32, 16] strides=(1024, 512, 16, 1) cpu
      caches_and_weights_1: f32[1, 2, 32, 16] strides=(1024, 512, 16, 1) cpu
      cos_table: f32[32, 8] strides=(8, 1) cpu
      pos: i64[1] strides=(1) cpu
      sin_table: f32[32, 8] strides=(8, 1) cpu
      x: f32[1, 64] strides=(64, 1) cpu aligned16
      caches_and_weights_2: f32[64] strides=(1) cpu aligned16
      caches_and_weights_3: f32[64, 64] strides=(64, 1) cpu
      caches_and_weights_4: f32[32, 64] strides=(64, 1) cpu
      caches_and_weights_5: f32[32, 64] strides=(64, 1) cpu
      caches_and_weights_6: f32[64, 64] strides=(64, 1) cpu
      caches_and_weights_7: f32[64] strides=(1) cpu aligned16
      caches_and_weights_8: f32[256, 64] strides=(64, 1) cpu
      caches_and_weights_9: f32[64, 128] strides=(128, 1) cpu
    plan:
      empty_like = alloc f32[1, 64] strides=(64, 1) cpu
      empty_like_1 = alloc f32[1, 64] strides=(64, 1) cpu
      empty_like_2 = alloc f32[1, 64] strides=(64, 1) cpu
      empty = alloc f32[1, 128] strides=(128, 1) cpu
      empty_like_3 = alloc f32[1, 64] strides=(64, 1) cpu
      view = native view: le +0 B, b8[1, 1, 1, 32] strides=(32, 32, 32, 1) cpu
      t = native view: caches_and_weights_3 +0 B, f32[64, 64] strides=(1, 64) cpu
      t_1 = native view: caches_and_weights_4 +0 B, f32[64, 32] strides=(1, 64) cpu
      t_2 = native view: caches_and_weights_5 +0 B, f32[64, 32] strides=(1, 64) cpu
      view_1 = native view: mm_1 +0 B, f32[1, 2, 1, 16] strides=(32, 16, 16, 1) cpu
      view_2 = native view: mm_2 +0 B, f32[1, 2, 1, 16] strides=(32, 16, 16, 1) cpu
      unsqueeze = native view: index_copy_ +0 B, f32[1, 2, 1, 32, 16] strides=(1024, 512, 512, 16, 1) cpu
      expand = native view: unsqueeze +0 B, f32[1, 2, 2, 32, 16] strides=(1024, 512, 0, 16, 1) cpu
      _unsafe_view = native view: clone +0 B, f32[1, 4, 32, 16] strides=(2048, 512, 16, 1) cpu
      unsqueeze_1 = native view: index_copy__1 +0 B, f32[1, 2, 1, 32, 16] strides=(1024, 512, 512, 16, 1) cpu
      expand_1 = native view: unsqueeze_1 +0 B, f32[1, 2, 2, 32, 16] strides=(1024, 512, 0, 16, 1) cpu
      _unsafe_view_1 = native view: clone_1 +0 B, f32[1, 4, 32, 16] strides=(2048, 512, 16, 1) cpu
      view_3 = native view: mm +0 B, f32[1, 4, 1, 16] strides=(64, 16, 16, 1) cpu
      view_4 = native view: _scaled_dot_product_flash_attention_for_cpu[0] +0 B, f32[1, 64] strides=(64, 1) cpu
      t_3 = native view: caches_and_weights_6 +0 B, f32[64, 64] strides=(1, 64) cpu
      t_4 = native view: caches_and_weights_8 +0 B, f32[64, 256] strides=(1, 64) cpu
      t_5 = native view: caches_and_weights_9 +0 B, f32[128, 64] strides=(1, 128) cpu
      launch rmsnorm_kernel[1, 1, 1] key=(*fp32:D, *fp32:D, *fp32:D, i32:D, fp32, constexpr=64) num_warps=4 shared=8
        params: x_ptr=x:*fp32, w_ptr=caches_and_weights_2:*fp32, out_ptr=empty_like:*fp32, n=64:i32, eps=1e-05:fp32
        runtime check: empty_like 16-byte aligned
      launch rotary_kernel[4, 1, 1] key=(*fp32:D, *fp32:D, *fp32:D, constexpr=8) num_warps=4 shared=0
        params: x_ptr=mm:*fp32, cos_ptr=index_select:*fp32, sin_ptr=index_select_1:*fp32
        runtime check: index_select, index_select_1, mm 16-byte aligned
      launch rotary_kernel[2, 1, 1] key=(*fp32:D, *fp32:D, *fp32:D, constexpr=8) num_warps=4 shared=0
        params: x_ptr=mm_1:*fp32, cos_ptr=index_select:*fp32, sin_ptr=index_select_1:*fp32
        runtime check: index_select, index_select_1, mm_1 16-byte aligned
      launch residual_add_kernel[1, 1, 1] key=(*fp32:D, *fp32:D, *fp32:D, i32:D, constexpr=256) num_warps=4 shared=0
        params: x_ptr=x:*fp32, y_ptr=mm_3:*fp32, out_ptr=empty_like_1:*fp32, n=64:i32
        runtime check: mm_3, empty_like_1 16-byte aligned
      launch rmsnorm_kernel[1, 1, 1] key=(*fp32:D, *fp32:D, *fp32:D, i32:D, fp32, constexpr=64) num_warps=4 shared=8
        params: x_ptr=empty_like_1:*fp32, w_ptr=caches_and_weights_7:*fp32, out_ptr=empty_like_2:*fp32, n=64:i32, eps=1e-05:fp32
        runtime check: empty_like_1, empty_like_2 16-byte aligned
      launch silu_mul_kernel[1, 1, 1] key=(*fp32:D, *fp32:D, i32:D, constexpr=128) num_warps=4 shared=0
        params: gu_ptr=mm_4:*fp32, out_ptr=empty:*fp32, n=128:i32
        runtime check: mm_4, empty 16-byte aligned
      launch residual_add_kernel[1, 1, 1] key=(*fp32:D, *fp32:D, *fp32:D, i32:D, constexpr=256) num_warps=4 shared=0
        params: x_ptr=empty_like_1:*fp32, y_ptr=mm_5:*fp32, out_ptr=empty_like_3:*fp32, n=64:i32
        runtime check: empty_like_1, mm_5, empty_like_3 16-byte aligned
      after step 3: release arange
      after step 14: release index_select, index_select_1
      after step 16: release mm_1, view_1
      after step 18: release mm_2, view_2
      after step 30: release le, view, scalar_tensor, scalar_tensor_1
      after step 31: release mm, clone, _unsafe_view, clone_1, _unsafe_view_1, view_3, where, _scaled_dot_product_flash_attention_for_cpu[1]
      after step 34: release _scaled_dot_product_flash_attention_for_cpu[0], view_4
      after step 36: release mm_3
      after step 42: release mm_4
      after step 46: release mm_5
""")


def test_native_paths_can_be_switched_off_for_ab_measurements():
    """TRIDENT_NATIVE_PATHS='' makes every operator call boxed; results stay eager's."""
    from trident import knobs

    cfg = Config(layers=1)
    weights, cos, sin = make_weights(cfg, "cpu")
    with knobs.scope(native_paths=""):
        opt = trident.optimize(
            trident.capture(
                functools.partial(decode_step, cfg),
                torch.randn(1, cfg.hidden), torch.tensor([0]), cos, sin, *make_caches(cfg, "cpu"), *weights,
            )
        )
    (line,) = [x for x in trident.explain(opt).splitlines() if "operator calls" in x]
    assert line.strip() == "operator calls: 35 = 0 address-only views + 0 native views + 0 constants + 0 typed calls + 35 boxed calls"
    check_steps_against_reference(cfg, opt, weights, cos, sin, range(3))
