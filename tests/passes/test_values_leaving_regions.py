"""Note [Values leaving a region]: in-place results, views and aliasing outputs keep eager's
semantics (values, aliasing, mutation) after optimization."""

from __future__ import annotations

import torch

import trident
from tests import kernels as K


def _opt(fn, *example):
    return trident.optimize(trident.capture(fn, *[e.clone() for e in example]))


def _scm_count(opt):
    return sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes)


def test_inplace_result_is_the_input_itself():
    def fn(cache, k, pos):
        cache.index_copy_(0, pos, k)
        out = K.axpy(cache.view(-1), cache.view(-1))
        return cache, out

    cache, k, pos = torch.randn(8, 16), torch.randn(1, 16), torch.tensor([3])
    opt = _opt(fn, cache, k, pos)
    assert _scm_count(opt) == 1
    ref_cache = cache.clone()
    got_cache, got = opt(cache, k, pos)
    ref_cache.index_copy_(0, pos, k)
    assert got_cache is cache  # the same tensor object, as eager returns
    torch.testing.assert_close(cache, ref_cache)
    torch.testing.assert_close(got, K.axpy_ref(ref_cache.view(-1), ref_cache.view(-1)))


def test_view_of_input_leaves_as_a_real_view():
    def fn(x, y):
        return K.axpy(x, y), x.view(10, 100)

    x, y = torch.randn(1000), torch.randn(1000)
    opt = _opt(fn, x, y)
    out, v = opt(x, y)
    assert v.data_ptr() == x.data_ptr() and v.shape == (10, 100)
    x.add_(1)  # aliasing as in eager: the view sees writes to x
    torch.testing.assert_close(v.reshape(-1), x)


def test_outputs_aliasing_each_other():
    def fn(x, y):
        out = K.axpy(x, y)
        return out, out[:10], out.view(100, 10).t()

    x, y = torch.randn(1000), torch.randn(1000)
    opt = _opt(fn, x, y)
    assert _scm_count(opt) == 1
    a, b, c = opt(x, y)
    torch.testing.assert_close(a, K.axpy_ref(x, y))
    assert b.data_ptr() == a.data_ptr() and c.data_ptr() == a.data_ptr()
    a.zero_()
    assert b.abs().sum() == 0 and c.abs().sum() == 0


def test_same_tensor_passed_twice():
    opt = _opt(K.axpy, torch.randn(1000), torch.randn(1000))
    x = torch.randn(1000)
    torch.testing.assert_close(opt(x, x), K.axpy_ref(x, x))


def test_inplace_kernel_on_a_view_marks_the_input_written():
    def fn(x):
        K.inplace_mul_kernel[(4,)](x[100:612], 512, 3.0, BLOCK=128)
        return x.sum()

    x = torch.randn(1000)
    opt = _opt(fn, x)
    node = next(n for n in opt.graph.nodes if n.target is torch.ops.trident.scm.default)
    assert [a.name for a in node.args[1]] == ["x"]  # listed as written (Tensor(a!)[])
    # Only the kernel reads the slice: no tensor is made for it, the host adds 400 bytes.
    assert "slice_1 = address only: x +400 B" in trident.scm_text(opt)
    ref = x.clone()
    ref[100:612] *= 3.0
    got = opt(x)
    torch.testing.assert_close(x, ref)
    torch.testing.assert_close(got, ref.sum())


@torch.library.custom_op("trident_tests::scaled_with_count", mutates_args=())
def scaled_with_count(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    return x * 2, x.numel()


@scaled_with_count.register_fake
def _(x):
    return torch.empty_like(x), x.numel()


def test_operator_with_scalar_results_stays_in_the_region():
    """Like cuDNN/flash attention (max_q, max_k ints): scalar results are dropped, the tensor
    results flow on, and the region is not cut."""

    def fn(x, y):
        t, _count = scaled_with_count(K.axpy(x, y))
        return K.axpy(t, y)

    x, y = torch.randn(1000), torch.randn(1000)
    opt = _opt(fn, x, y)
    assert _scm_count(opt) == 1, opt.code
    torch.testing.assert_close(opt(x, y), K.axpy_ref(K.axpy_ref(x, y) * 2, y))


def test_constant_operator_calls_are_computed_once_unless_written():
    def fn(x):
        ramp = torch.arange(1000, dtype=torch.float32)  # read only: constant
        ones = torch.full((1000,), 1.0)  # written by a kernel below: not constant
        K.inplace_mul_kernel[(8,)](ones, 1000, 3.0, BLOCK=128)
        return K.axpy(x, ramp) + ones

    opt = _opt(fn, torch.randn(1000))
    text = trident.scm_text(opt)
    assert "arange = aten.arange.start_step" in text or "arange = aten.arange" in text
    assert [line for line in text.splitlines() if "= aten.arange" in line][0].endswith("computed once per device")
    assert not [line for line in text.splitlines() if "= aten.full" in line][0].endswith("computed once per device")
    for _ in range(3):
        x = torch.randn(1000)
        want = K.axpy_ref(x, torch.arange(1000, dtype=torch.float32)) + 3.0
        torch.testing.assert_close(opt(x), want)
