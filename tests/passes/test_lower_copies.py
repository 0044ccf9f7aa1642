"""trident/passes/lower_copies.py: aten.clone / index_copy_ / index_copy become launches of
Trident's own Triton kernels (trident/kernels/copy.py). With TRIDENT_TRITON_COPIES="all" the CPU
runs them through the interpreter launcher; results must be eager's bit for bit, in-place writes
must land in the caller's tensor, and what the pass does not handle stays an ATen call."""

from __future__ import annotations

import functools
import math

import expecttest
import pytest
import torch

import trident
from tests.conftest import normalize
from tests.decode_model import Config, decode_step, decode_step_reference, make_caches, make_weights
from trident import knobs
from trident.kernels import index_copy_kernel, strided_copy_kernel
from trident.passes.lower_copies import _copy_plan, _index_copy_plan, lower_copies


def _optimize(fn, *example, mode="all"):
    gm = trident.capture(fn, *[e.clone() for e in example])
    with knobs.scope(triton_copies=mode):
        return trident.optimize(gm)


def _random_bits(shape, dtype, seed=0):
    """Every bit pattern of the dtype may appear (NaNs with payloads, infinities, ...); bools
    are 0/1 (what torch defines)."""
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    n = math.prod(shape) * dtype.itemsize
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(dtype).view(shape)


def _assert_same(got: torch.Tensor, want: torch.Tensor):
    """Same dtype, shape, strides and bits (torch.equal would fail on NaNs)."""
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    g, w = got.contiguous().reshape(-1), want.contiguous().reshape(-1)
    if got.dtype is torch.bool:
        assert torch.equal(g, w)
    else:
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))


def _region_text(opt) -> str:
    return trident.scm_text(opt)


# ---- clone -------------------------------------------------------------------------------

_CLONES = {
    # name: (input shape, fn)
    "expand": ((3, 1, 5), lambda x: x.expand(3, 4, 5).clone()),
    "expand_reshape": ((2, 3, 4, 5), lambda x: x[:, :, None].expand(2, 3, 2, 4, 5).reshape(2, 6, 4, 5)),
    "transpose_contiguous": ((3, 4, 5), lambda x: x.transpose(0, 2).contiguous()),
    "transpose_preserve": ((3, 4, 5), lambda x: x.transpose(0, 2).clone()),
    "permute_preserve": ((3, 4, 5), lambda x: x.permute(2, 0, 1).clone()),
    "slice": ((5, 9), lambda x: x[1:, ::2].clone()),
    "slice_transpose": ((6, 8), lambda x: x[1:5, 2:].t().clone()),
    "channels_last": ((2, 3, 4, 5), lambda x: x.clone(memory_format=torch.channels_last)),
    "six_dims_coalesced": ((2, 3, 2, 3, 2, 3), lambda x: x.transpose(0, 1).contiguous()),
    "scalar": ((), lambda x: x.clone()),
}

_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2,
]


def _check_clone(name, dtype):
    shape, fn = _CLONES[name]
    x = _random_bits(shape, dtype)
    opt = _optimize(fn, x)
    text = _region_text(opt)
    assert "aten.clone" not in text and "launch strided_copy_kernel" in text, text
    _assert_same(opt(x), fn(x))


@pytest.mark.parametrize("name", list(_CLONES))
def test_clone_layouts(name):
    _check_clone(name, torch.float32)


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("name", ["expand_reshape", "slice_transpose"])
def test_clone_dtypes(name, dtype):
    _check_clone(name, dtype)


def test_clone_follows_a_new_input_dtype():
    """The allocation is empty_like(src): a later call with another dtype (a miss) gets a clone
    of that dtype, as eager does."""
    fn = _CLONES["slice_transpose"][1]
    opt = _optimize(fn, torch.randn(6, 8))
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        x = _random_bits((6, 8), dtype, seed=1)
        _assert_same(opt(x), fn(x))


def test_offsets_go_64_bit_past_int32():
    """OFFSETS_64 is set when the element count, or an offset any lane computes, passes int32
    (planned on meta tensors); the 64-bit path itself equals eager on a small copy."""
    big = torch.empty(2**31 + 5, device="meta")
    assert _copy_plan(big, torch.empty_like(big))[1]["OFFSETS_64"]
    wide = torch.empty(3, 2**30, device="meta")[:, :8]  # 24 elements, offsets past 2**31
    assert _copy_plan(wide, torch.empty(3, 8, device="meta"))[1]["OFFSETS_64"]
    small = torch.empty(3, 2**20, device="meta")[:, :8]
    assert not _copy_plan(small, torch.empty(3, 8, device="meta"))[1]["OFFSETS_64"]

    x = torch.randn(6, 8)[1:5, 2:].t()
    grid, kwargs = _copy_plan(x, torch.empty(x.shape))
    kwargs = {**kwargs, "OFFSETS_64": True}

    def fn(x):
        out = torch.empty(x.shape)
        strided_copy_kernel[grid](x, out, **kwargs)
        return out

    opt = trident.optimize(trident.capture(fn, x))  # x itself: _optimize's clone would change its strides
    _assert_same(opt(x), x.contiguous())


@pytest.mark.parametrize(
    "fn, example",
    [
        (lambda x: x.clone(), torch.randn(3, 4, dtype=torch.complex64)),  # complex
        (lambda x: x.clone(), torch.randn(0, 4)),  # no elements
        (lambda x: x.clone(), torch.arange(12).to(torch.uint16)),  # no torch-mlir type
        (lambda x: torch._neg_view(x).clone(), torch.randn(3, 4)),  # the copy must negate
        # 6 dims that merge into none: more than the kernel's 5
        (lambda x: x.permute(5, 3, 1, 4, 2, 0).contiguous(), torch.randn(2, 3, 2, 3, 2, 3)),
    ],
    ids=["complex", "empty", "uint16", "neg_view", "six_dims"],
)
def test_clones_left_to_aten(fn, example):
    gm = trident.capture(fn, example.clone())
    with knobs.scope(triton_copies="all"):
        assert lower_copies(gm) == 0
    assert any(n.target is torch.ops.aten.clone.default for n in gm.graph.nodes)


# ---- index_copy_ ---------------------------------------------------------------------------


def _index_copy_case(shape, dim, n, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    size = shape[dim]
    idx = torch.randperm(size, generator=g)[:n]
    src_shape = list(shape)
    src_shape[dim] = n
    return _random_bits(shape, dtype, seed), idx, _random_bits(tuple(src_shape), dtype, seed + 1)


def _index_copy_fn(dim):
    def fn(cache, idx, src):
        return cache.index_copy_(dim, idx, src)

    return fn


@pytest.mark.parametrize(
    "shape, dim, n",
    [((5, 3, 4), 0, 2), ((3, 6, 4), 1, 3), ((3, 4, 7), 2, 2), ((4, 2, 3, 5), 0, 1), ((2, 3, 6, 4), 1, 2),
     ((2, 3, 6, 4), 2, 1), ((2, 3, 6, 4), -1, 4)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_index_copy_in_place(shape, dim, n, dtype):
    cache, idx, src = _index_copy_case(shape, dim, n, dtype)
    fn = _index_copy_fn(dim)
    opt = _optimize(fn, cache, idx, src)
    text = _region_text(opt)
    assert "aten.index_copy" not in text and "launch index_copy_kernel" in text, text
    want = fn(cache.clone(), idx, src)
    ptr = cache.data_ptr()
    got = opt(cache, idx, src)
    assert got is cache and cache.data_ptr() == ptr  # written in place; index_copy_ returns self
    _assert_same(cache, want)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_index_copy_non_contiguous_self(dim):
    """Self is a transposed input, or a strided slice of the input taken inside the function."""
    g = torch.Generator().manual_seed(dim)
    base = torch.randn(6, 5, 8)

    def case(self_shape):
        idx = torch.randperm(self_shape[dim], generator=g)[:2]
        src = torch.randn([2 if k == dim else s for k, s in enumerate(self_shape)], generator=g)
        return idx, src

    t = base.transpose(0, 2)  # (8, 5, 6), strides (1, 8, 40)
    idx, src = case(t.shape)
    fn = _index_copy_fn(dim)
    opt = _optimize(fn, t, idx, src)
    assert "aten.index_copy" not in _region_text(opt)
    want = fn(t.clone(), idx, src)
    opt(t, idx, src)
    _assert_same(t, want)

    def sliced(base, idx, src):
        return base[:, 1:, ::2].index_copy_(dim, idx, src)

    idx, src = case(base[:, 1:, ::2].shape)
    opt = _optimize(sliced, base, idx, src)
    assert "aten.index_copy" not in _region_text(opt)
    want_base = base.clone()
    sliced(want_base, idx, src)
    opt(base, idx, src)
    _assert_same(base, want_base)


def test_index_copy_out_of_range_index_writes_nothing_for_that_row():
    """Note [Out-of-range indices in index_copy_kernel]: eager raises (CPU) or asserts on the
    device (CUDA); the kernel skips the out-of-range rows and writes the others."""
    cache, idx, src = _index_copy_case((4, 5), 0, 2)
    opt = _optimize(_index_copy_fn(0), cache, idx, src)
    for bad in ([1, 4], [-1, 2], [7, -5]):
        bad = torch.tensor(bad)
        with pytest.raises(IndexError):
            cache.clone().index_copy_(0, bad, src)
        before = cache.clone()
        opt(cache, bad, src)
        want = before.clone()
        for row, i in enumerate(bad.tolist()):
            if 0 <= i < cache.shape[0]:
                want[i] = src[row]
        _assert_same(cache, want)


def test_index_copy_functional():
    x, idx, src = _index_copy_case((3, 6, 4), 1, 2)

    def fn(x, idx, src):
        return torch.index_copy(x, 1, idx, src)

    opt = _optimize(fn, x, idx, src)
    text = _region_text(opt)
    assert "aten.index_copy" not in text and "strided_copy_kernel" in text and "index_copy_kernel" in text, text
    before = x.clone()
    got = opt(x, idx, src)
    _assert_same(got, fn(before, idx, src))
    _assert_same(x, before)  # not written
    assert got.data_ptr() != x.data_ptr()


def test_index_copy_kernel_takes_int32_indices():
    """The kernel reads int32 as well as int64 indices (ATen's index_copy_ takes int64 only, so
    the pass launches it with ATEN_RULES)."""
    cache, idx, src = _index_copy_case((2, 7, 3), 1, 3)
    _, grid, kwargs = _index_copy_plan(cache, 1, idx, src)
    kwargs = {**kwargs, "ATEN_RULES": False}

    def fn(cache, idx, src):
        index_copy_kernel[grid](src, cache, idx, **kwargs)
        return cache

    want = cache.clone().index_copy_(1, idx, src)
    for index in (idx, idx.int()):
        got = cache.clone()
        opt = _optimize(fn, got, index, src, mode="")
        opt(got, index, src)
        _assert_same(got, want)


def test_index_copy_new_index_dtype_fails_as_eager_fails():
    """A later call with an int32 index, or a source of another dtype, is refused when the
    kernel is specialized for it (eager raises too)."""
    cache, idx, src = _index_copy_case((4, 5), 0, 2)
    opt = _optimize(_index_copy_fn(0), cache, idx, src)
    with pytest.raises(RuntimeError):
        cache.clone().index_copy_(0, idx.int(), src)
    with pytest.raises(trident.errors.TridentError):
        opt(cache, idx.int(), src)
    with pytest.raises(trident.errors.TridentError):
        opt(cache, idx, src.double())


def _index_copy_targets(gm):
    return [n for n in gm.graph.nodes if n.target in (torch.ops.aten.index_copy_.default, torch.ops.aten.index_copy.default)]


def test_index_copies_left_to_aten():
    cache, idx, src = _index_copy_case((4, 5), 0, 2)

    def shares_storage(cache, idx):  # source is a view of self's storage (eager allows it here)
        return cache[:2].index_copy_(0, idx, cache[2:4])

    def overlapping_self(x, idx, src):  # eager refuses; the pass leaves that to ATen
        return x.expand(4, 5).index_copy_(0, idx, src)

    cases = [
        (_index_copy_fn(0), (cache, idx.int(), src)),  # int32 index: eager refuses
        (_index_copy_fn(0), (cache, idx[0], src[:1])),  # 0-d index
        (shares_storage, (cache, torch.tensor([1, 0]))),
        (overlapping_self, (torch.randn(1, 5), idx, src)),
    ]
    for fn, example in cases:
        gm = trident.capture(fn, *[e.clone() for e in example])
        with knobs.scope(triton_copies="all"):
            assert lower_copies(gm) == 0, fn
        assert _index_copy_targets(gm), gm.code

    # shares_storage still runs (through ATen) and equals eager
    opt = _optimize(shares_storage, cache, torch.tensor([1, 0]))
    want = cache.clone()
    shares_storage(want, torch.tensor([1, 0]))
    opt(cache, torch.tensor([1, 0]))
    _assert_same(cache, want)


def test_index_copy_left_to_aten_under_deterministic_algorithms():
    cache, idx, src = _index_copy_case((4, 5), 0, 2)
    gm = trident.capture(_index_copy_fn(0), cache, idx, src)
    torch.use_deterministic_algorithms(True)
    try:
        with knobs.scope(triton_copies="all"):
            assert lower_copies(gm) == 0
    finally:
        torch.use_deterministic_algorithms(False)


# ---- the knob ------------------------------------------------------------------------------


def test_knob_default_lowers_cuda_only(device):
    """By default ("cuda"), CPU graphs keep their ATen copies; CUDA graphs get the kernels.
    Either way the results are eager's."""
    cache, idx, src = (t.to(device) for t in _index_copy_case((2, 3, 6, 4), 2, 1))

    def fn(cache, idx, src):
        cache.index_copy_(2, idx, src)
        return cache[:, :, None].expand(2, 3, 2, 6, 4).reshape(2, 6, 6, 4)

    gm = trident.capture(fn, cache.clone(), idx, src)
    opt = trident.optimize(gm)
    text = _region_text(opt)
    if device == "cpu":  # the region keeps its ATen copies (a region of operator calls alone)
        assert "aten.clone" in text and "aten.index_copy_" in text, text
        assert "launch" not in text, text
    else:
        assert "aten.clone" not in text and "aten.index_copy_" not in text, text
    want_cache = cache.clone()
    want = fn(want_cache, idx, src)
    _assert_same(opt(cache, idx, src), want)
    _assert_same(cache, want_cache)


def test_knob_off_and_bad_values():
    x = torch.randn(3, 4)
    gm = trident.capture(lambda x: x.t().contiguous(), x)
    for off in ("", "0", "off"):
        with knobs.scope(triton_copies=off):
            assert lower_copies(gm) == 0
    with knobs.scope(triton_copies="gpu"), pytest.raises(ValueError):
        lower_copies(gm)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.int64, torch.bfloat16, torch.float32, torch.float8_e5m2], ids=str)
def test_compiled_kernels_equal_aten_on_cuda(dtype):
    """The compiled kernels (not the interpreter), launched directly with the pass's plans, give
    ATen's CUDA results bit for bit; an out-of-range index skips its row (eager would assert)."""

    def bits(shape, seed):
        return _random_bits(shape, dtype, seed).cuda()

    y = bits((64, 128, 33), 1)
    for x, fmt in [
        (bits((2, 8, 512, 64), 0)[:, :, None].expand(2, 8, 4, 512, 64), torch.contiguous_format),
        (y.transpose(0, 2), torch.contiguous_format),
        (y.permute(2, 0, 1), torch.preserve_format),
        (y[3:, ::3, 1:30], torch.preserve_format),
    ]:
        out = torch.empty_like(x, memory_format=fmt)
        grid, kwargs = _copy_plan(x, out)
        strided_copy_kernel[grid](x, out, **kwargs)
        _assert_same(out, x.clone(memory_format=fmt))
    if dtype.is_floating_point and dtype.itemsize == 1:
        return  # ATen has no float8 index_copy_
    z = bits((4, 3000, 16), 2)
    for dim in (0, 1, 2):
        idx = torch.randperm(z.shape[dim], device="cuda")[:3]
        src = bits(tuple(3 if k == dim else s for k, s in enumerate(z.shape)), 3)
        got = z.clone()
        _, grid, kwargs = _index_copy_plan(got, dim, idx, src)
        index_copy_kernel[grid](src, got, idx, **kwargs)
        _assert_same(got, z.clone().index_copy_(dim, idx, src))
    got = z.clone()
    idx = torch.tensor([1, 3000, -1], device="cuda")
    src = bits((4, 3, 16), 4)
    _, grid, kwargs = _index_copy_plan(got, 1, idx, src)
    index_copy_kernel[grid](src, got, idx, **kwargs)
    want = z.clone()
    want[:, 1] = src[:, 0]
    _assert_same(got, want)


# ---- the decode step -----------------------------------------------------------------------


def test_decode_step_with_triton_copies_matches_reference_and_aten_copies():
    """Config(layers=2) with every clone and index_copy_ lowered: one region with none of them
    left; over several positions the result and the caches equal the reference (as in
    test_decode_step) and, bit for bit, the same step optimized with ATen copies."""
    cfg = Config(layers=2)
    weights, cos, sin = make_weights(cfg, "cpu")
    step = functools.partial(decode_step, cfg)
    example = (torch.randn(1, cfg.hidden), torch.tensor([0]), cos, sin, *make_caches(cfg, "cpu"), *weights)
    gm = trident.capture(step, *example)
    with knobs.scope(triton_copies="all"):
        lowered = trident.optimize(gm)
    with knobs.scope(triton_copies=""):
        plain = trident.optimize(gm)
    assert sum(n.target is torch.ops.trident.scm.default for n in lowered.graph.nodes) == 1
    text = _region_text(lowered)
    assert "aten.clone" not in text and "aten.index_copy" not in text, text
    # Per layer the K and V clones run as one launch (trident/passes/fuse_copy_launches.py); the
    # K and V cache writes stay two (writes into graph inputs, which may alias, are never merged).
    assert "launch strided_copy_kernel" not in text, text
    assert text.count("launch strided_copy2_kernel") == 2 * cfg.layers  # IR line + plan line
    assert text.count("launch index_copy_kernel") == 2 * 2 * cfg.layers

    caches, plain_caches, ref_caches = (make_caches(cfg, "cpu") for _ in range(3))
    for p in range(5):
        x = torch.randn(1, cfg.hidden)
        pos = torch.tensor([p])
        got = lowered(x, pos, cos, sin, *caches, *weights)
        want = decode_step_reference(cfg, x.clone(), pos, cos, sin, *ref_caches, *weights)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for c, r in zip(caches, ref_caches):
            torch.testing.assert_close(c, r, rtol=1e-4, atol=1e-4)
        _assert_same(got, plain(x, pos, cos, sin, *plain_caches, *weights))
        for c, r in zip(caches, plain_caches):
            _assert_same(c, r)
    (stats,) = trident.cache_info(lowered).values()
    assert stats["misses"] == 0 and stats["specializations"] == 1


# ---- golden --------------------------------------------------------------------------------


class TestLoweredGraph(expecttest.TestCase):
    def test_cache_write_and_repeat(self):
        """A KV-cache write and the expand/reshape of attention's key repeat, after the pass."""

        def fn(cache, idx, k):
            cache.index_copy_(1, idx, k)
            return cache[:, None].expand(2, 2, 4, 3).reshape(4, 4, 3)

        gm = trident.capture(fn, torch.zeros(2, 4, 3), torch.tensor([1]), torch.randn(2, 1, 3))
        with knobs.scope(triton_copies="all"):
            self.assertEqual(lower_copies(gm), 2)
        self.assertExpectedInline(normalize(gm.code.strip()), """\
def forward(self, cache, idx, k):
    triton_kernel_wrapper_mutation = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(1, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'src_ptr': k, 'dst_ptr': cache, 'index_ptr': idx, 'size0': 1, 'size1': 1, 'size2': 1, 'size3': 2, 'size4': 3, 'src_stride0': 3, 'src_stride1': 1, 'src_stride2': 1, 'src_stride3': 3, 'src_stride4': 1, 'dst_stride0': 3, 'dst_stride1': 1, 'dst_stride2': 1, 'dst_stride3': 12, 'dst_stride4': 1, 'index_stride': 1, 'dim_size': 4, 'numel': 6, 'ATEN_RULES': True, 'WRAP_NEGATIVE': False, 'OFFSETS_64': False, 'BLOCK': 16});  k = idx = triton_kernel_wrapper_mutation = None
    unsqueeze = torch.ops.aten.unsqueeze.default(cache, 1);  cache = None
    expand = torch.ops.aten.expand.default(unsqueeze, [2, 2, 4, 3]);  unsqueeze = None
    empty_like_default = torch.ops.aten.empty_like.default(expand, memory_format = torch.contiguous_format)
    triton_kernel_wrapper_mutation_1 = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(1, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'src_ptr': expand, 'dst_ptr': empty_like_default, 'size0': 1, 'size1': 1, 'size2': 2, 'size3': 2, 'size4': 12, 'src_stride0': 1, 'src_stride1': 1, 'src_stride2': 12, 'src_stride3': 0, 'src_stride4': 1, 'dst_stride0': 1, 'dst_stride1': 1, 'dst_stride2': 1, 'dst_stride3': 1, 'dst_stride4': 1, 'numel': 48, 'DST_CONTIGUOUS': True, 'OFFSETS_64': False, 'BLOCK': 64});  expand = triton_kernel_wrapper_mutation_1 = None
    _unsafe_view = torch.ops.aten._unsafe_view.default(empty_like_default, [4, 4, 3]);  empty_like_default = None
    return _unsafe_view""")
