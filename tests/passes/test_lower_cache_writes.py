"""trident/passes/lower_copies.py on the other copies a decode step uses: aten.copy_ (a KV-cache
slice written in place), slice_scatter / select_scatter (functional), index_put_ / index_put with
one index tensor after Nones (`cache[:, :, pos] = v`). With TRIDENT_TRITON_COPIES="all" the CPU
runs the kernels through the interpreter launcher; results must be eager's bit for bit, in-place
writes must land in the caller's tensor, and what the pass does not handle stays an ATen call."""

from __future__ import annotations

import functools

import expecttest
import pytest
import torch

import trident
from tests.conftest import normalize
from tests.passes.test_lower_copies import _DTYPES, _assert_same, _optimize, _random_bits, _region_text
from trident import knobs
from trident.kernels import index_copy_kernel, strided_copy_kernel
from trident.passes.lower_copies import _broadcast_strides, _index_put_plan, _strided_plan, lower_copies

aten = torch.ops.aten


def _targets(gm, *ops):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in ops]


def _left_to_aten(fn, example, *ops):
    """The pass lowers nothing of `ops` in fn's graph (it may lower other copies)."""
    gm = trident.capture(fn, *[e.clone() if isinstance(e, torch.Tensor) else e for e in example])
    before = len(_targets(gm, *ops))
    assert before, gm.code
    with knobs.scope(triton_copies="all"):
        lower_copies(gm)
    assert len(_targets(gm, *ops)) == before, gm.code


def _check_in_place(fn, args, *, kernel="strided_copy_kernel", gone="aten.copy_"):
    """fn writes args[0] in place and returns it: the optimized call returns the caller's own
    tensor, written in place exactly as eager writes a copy of it."""
    opt = _optimize(fn, *args)
    text = _region_text(opt)
    assert gone not in text and f"launch {kernel}" in text, text
    want_args = [a.clone() for a in args]
    want = fn(*want_args)
    cache = args[0]
    ptr = cache.data_ptr()
    got = opt(*args)
    assert got is cache and cache.data_ptr() == ptr
    _assert_same(cache, want)
    _assert_same(cache, want_args[0])
    for a, w in zip(args[1:], want_args[1:]):
        _assert_same(a, w)  # the other inputs are not written


# ---- copy_ ---------------------------------------------------------------------------------


# The source is computed in the graph (a clone): a source that is itself a view of an input
# may alias the destination at run time, and stays with ATen (Note [Aliasing graph inputs]).
def _copy_into(dst, src=lambda v: v.clone()):
    def fn(c, v):
        dst(c).copy_(src(v))
        return c

    return fn


def _setitem(c, v):
    c[:, :, 6:7] = v.clone()
    return c


_COPIES = {
    # name: (cache shape, value shape, fn)
    "slice": ((2, 3, 8, 4), (2, 3, 2, 4), _copy_into(lambda c: c[:, :, 3:5])),
    "broadcast_dim": ((2, 3, 8, 4), (2, 3, 1, 4), _copy_into(lambda c: c[:, :, 2:7])),
    "broadcast_rank": ((2, 3, 8, 4), (4,), _copy_into(lambda c: c[1:, :, ::3])),
    "broadcast_0d": ((5, 6), (), _copy_into(lambda c: c[1:4, 2:])),
    "transposed_src": (
        (2, 8, 3, 4),
        (2, 3, 2, 4),
        _copy_into(lambda c: c[:, 4:6], lambda v: v.clone().transpose(1, 2)),
    ),
    "transposed_cache": ((4, 8, 3), (3, 2, 4), _copy_into(lambda c: c.transpose(0, 2)[:, 1:3])),
    "select": ((2, 3, 8, 4), (2, 3, 4), _copy_into(lambda c: c[:, :, 5])),
    "setitem_slice": ((2, 3, 8, 4), (2, 3, 1, 4), _setitem),
    "scalar": ((3, 4), (), _copy_into(lambda c: c[2, 1])),
    "whole": ((3, 4, 5), (5, 3, 4), _copy_into(lambda c: c, lambda v: v.clone().permute(1, 2, 0))),
    "six_dims": ((2, 3, 2, 3, 2, 4), (2, 3, 2, 3, 2, 2), _copy_into(lambda c: c[..., 1:3])),
}


def _check_copy(name, dtype):
    cache_shape, v_shape, fn = _COPIES[name]
    _check_in_place(fn, [_random_bits(cache_shape, dtype), _random_bits(v_shape, dtype, seed=1)])


@pytest.mark.parametrize("name", list(_COPIES))
def test_copy_layouts(name):
    _check_copy(name, torch.float32)


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("name", ["broadcast_dim", "transposed_cache"])
def test_copy_dtypes(name, dtype):
    _check_copy(name, dtype)


def test_copy_into_a_fresh_tensor():
    """Destination computed in the graph, source an input: they cannot alias. The result keeps
    the destination's (transposed) layout."""

    def fn(x):
        out = torch.empty(3, 4).t()
        out.copy_(x)
        return out

    x = torch.randn(4, 3)
    opt = _optimize(fn, x)
    assert "aten.copy_" not in _region_text(opt)
    got = opt(x)
    _assert_same(got, x.t().contiguous().t())


def test_broadcast_strides():
    """Ranks aligned on the right; stride 0 where the source is missing a dim or has it as 1;
    None where eager refuses to broadcast (more source dims, a size other than 1)."""
    shape = (2, 3, 4, 4)
    meta = functools.partial(torch.empty, device="meta")
    assert _broadcast_strides(meta(3, 1, 4), shape) == [0, 4, 0, 1]
    assert _broadcast_strides(meta(3, 4, 4).transpose(1, 2), shape) == [0, 16, 1, 4]
    assert _broadcast_strides(meta(()), shape) == [0, 0, 0, 0]
    assert _broadcast_strides(meta(1, 2, 3, 4, 4), shape) is None
    assert _broadcast_strides(meta(2, 4), shape) is None


def test_copies_left_to_aten():
    cache = torch.randn(2, 3, 8, 4)
    v = torch.randn(2, 3, 1, 4)

    def both_inputs(c, v):  # v may be a view of c at run time
        c[:, :, 3:4].copy_(v)
        return c

    def same_storage(c):
        c[:, 1].copy_(c[:, 0])
        return c

    def converts(c, v):
        c[:, :, 3:4].copy_(v.clone().double())
        return c

    def negated(c, v):
        c[:, :, 3:4].copy_(torch._neg_view(v.clone()))
        return c

    cases = [
        (both_inputs, (cache, v)),
        (same_storage, (cache,)),
        (converts, (cache, v)),
        (negated, (cache, v)),
        (
            _copy_into(lambda c: c[:, 1:]),
            (torch.randn(3, 4, dtype=torch.complex64), torch.randn(3, 3, dtype=torch.complex64)),
        ),
        (_copy_into(lambda c: c[:, 4:]), (torch.randn(3, 4), torch.randn(3, 0))),
        # 6 dims that merge into none: more than the kernel's 5
        (
            _copy_into(lambda c: c.permute(5, 3, 1, 4, 2, 0)),
            (torch.randn(2, 3, 2, 3, 2, 3), torch.randn(3, 3, 3, 2, 2, 2)),
        ),
    ]
    for fn, example in cases:
        _left_to_aten(fn, example, aten.copy_.default)

    # both_inputs still runs (through ATen) and equals eager, also when the caller passes a
    # view of the cache as the source (captured so: sizes and strides are static)
    for src in (v, cache[:, :, 5:6]):
        example = cache.clone()
        with knobs.scope(triton_copies="all"):
            opt = trident.optimize(
                trident.capture(both_inputs, example, v.clone() if src is v else example[:, :, 5:6])
            )
        for _ in range(2):
            want = cache.clone()
            both_inputs(want, want[:, :, 5:6] if src is not v else v)
            opt(cache, src if src is v else cache[:, :, 5:6])
            _assert_same(cache, want)


# ---- slice_scatter / select_scatter -------------------------------------------------------

_SCATTERS = {
    # name: (base shape, self = layout(base), src shape, fn(self, src))
    "slice": ((2, 3, 8, 4), None, (2, 3, 2, 4), lambda x, s: torch.slice_scatter(x, s, 2, 3, 5)),
    "slice_step": ((6, 5), None, (6, 2), lambda x, s: torch.slice_scatter(x, s, 1, 1, None, 2)),
    "slice_negative": ((6, 5), None, (2, 5), lambda x, s: torch.slice_scatter(x, s, 0, -3, -1)),
    "slice_default": ((6, 5), None, (6, 5), lambda x, s: torch.slice_scatter(x, s)),
    "slice_transposed_self": (
        (4, 6, 5),
        lambda t: t.transpose(0, 2),
        (5, 2, 4),
        lambda x, s: torch.slice_scatter(x, s, 1, 2, 4),
    ),
    "slice_channels_last": (
        (2, 4, 5, 3),
        lambda t: t.permute(0, 3, 1, 2),
        (2, 3, 1, 5),
        lambda x, s: torch.slice_scatter(x, s, 2, 1, 2),
    ),
    # self overlaps itself: ATen's result is a plain (contiguous) clone
    "slice_expanded_self": ((1, 6), None, (4, 2), lambda x, s: torch.slice_scatter(x.expand(4, 6), s, 1, 0, 2)),
    "slice_transposed_src": ((6, 5), None, (3, 6), lambda x, s: torch.slice_scatter(x, s.t(), 1, 0, 3)),
    "select": ((2, 3, 8, 4), None, (2, 3, 4), lambda x, s: torch.select_scatter(x, s, 2, 5)),
    "select_negative": ((2, 3, 8, 4), None, (2, 8, 4), lambda x, s: torch.select_scatter(x, s, 1, -1)),
    "select_to_0d": ((7,), None, (), lambda x, s: torch.select_scatter(x, s, 0, 3)),
}


def _check_scatter(name, dtype):
    base_shape, layout, src_shape, fn = _SCATTERS[name]
    x = _random_bits(base_shape, dtype)
    if layout is not None:
        x = layout(x)
    src = _random_bits(src_shape, dtype, seed=1)
    opt = _optimize(fn, x, src)
    text = _region_text(opt)
    why = f"{text}\n{opt.code}\n{trident.explain(opt)}"
    left = [n for n in opt.graph.nodes if n.target in (aten.slice_scatter.default, aten.select_scatter.default)]
    if left and name == "slice_expanded_self":
        # torch 2.11's meta for a self-overlapping self keeps self's strides (2.13: a plain clone);
        # the pass then follows its rule (Note [Scatter results]) and leaves the call to ATen.
        (node,) = left
        val, self_val = node.meta["val"], node.args[0].meta["val"]
        assert val.stride() != torch.empty(self_val.shape).stride(), why
    else:
        assert "aten.slice_scatter" not in text and "aten.select_scatter" not in text, why
        assert text.count("launch strided_copy_kernel") == 2 * 2, why  # the clone and the src copy; IR + plan
    before = x.clone()
    got = opt(x, src)
    _assert_same(got, fn(before, src))
    _assert_same(x, before)  # self is not written
    assert got.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("name", list(_SCATTERS))
def test_scatter_layouts(name):
    _check_scatter(name, torch.float32)


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_scatter_dtypes(dtype):
    _check_scatter("slice_transposed_self", dtype)
    _check_scatter("select", dtype)


def test_scatters_left_to_aten():
    """Note [Scatter results]: a self that is not dense at offset 0 gives a result that keeps its
    strides (a view of a copy of self's whole storage): left to ATen."""
    x = torch.randn(4, 6, 5)
    cases = [
        (lambda x, s: torch.slice_scatter(x[:, ::2], s, 1, 0, 1), (x, torch.randn(4, 1, 5))),  # not dense
        (lambda x, s: torch.slice_scatter(x[1:], s, 1, 0, 1), (x, torch.randn(3, 1, 5))),  # offset
        (lambda x, s: torch.select_scatter(x[:, 1:], s, 1, 0), (x, torch.randn(4, 5))),
        (lambda x, s: torch.slice_scatter(x, s.clone(), 1, 0, 0), (x, torch.randn(4, 0, 5))),  # no elements
        (lambda x, s: torch.slice_scatter(x, s.double(), 1, 0, 1), (x, torch.randn(4, 1, 5))),  # converts
    ]
    for fn, example in cases:
        _left_to_aten(fn, example, aten.slice_scatter.default, aten.select_scatter.default)
    # and they still equal eager

    def offset_self(x, s):
        return torch.slice_scatter(x[1:], s.clone(), 1, 0, 1)

    x, s = cases[1][1]
    opt = _optimize(offset_self, x, s)
    _assert_same(opt(x, s), offset_self(x, s))


# ---- index_put_ / index_put ----------------------------------------------------------------


def _put(d):
    """cache[:, ..., pos] = v with d leading full slices (captured as index_put_ with Nones)."""

    def fn(cache, pos, v):
        cache[(slice(None),) * d + (pos,)] = v
        return cache

    return fn


def _put_op(d):
    def fn(cache, pos, v):
        return aten.index_put_(cache, [None] * d + [pos], v)

    return fn


def _put_case(shape, d, n, v_shape=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randperm(shape[d], generator=g)[:n]
    if v_shape is None:
        v_shape = tuple(n if k == d else s for k, s in enumerate(shape))
    return _random_bits(shape, dtype, seed), pos, _random_bits(v_shape, dtype, seed + 1)


@pytest.mark.parametrize(
    "shape, d, n, v_shape",
    [
        ((2, 3, 8, 4), 2, 1, None),
        ((2, 3, 8, 4), 2, 3, None),
        ((2, 3, 8, 4), 0, 1, None),
        ((2, 3, 8, 4), 1, 2, None),
        ((2, 3, 8, 4), 3, 2, None),
        ((2, 3, 8, 4), 2, 2, (3, 1, 4)),  # broadcast over the batch and the positions
        ((2, 3, 8, 4), 2, 2, (4,)),
        ((2, 3, 8, 4), 2, 2, ()),
        ((9, 5), 0, 4, (4, 1)),
        ((2, 3, 2, 3, 2, 5), 4, 1, None),
    ],
)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float8_e4m3fn], ids=str
)
def test_index_put_in_place(shape, d, n, v_shape, dtype):
    cache, pos, v = _put_case(shape, d, n, v_shape, dtype)
    _check_in_place(_put(d), [cache, pos, v], kernel="index_copy_kernel", gone="aten.index_put")


@pytest.mark.parametrize("d", [1, 2])
def test_index_put_op_and_trailing_nones(d):
    cache, pos, v = _put_case((2, 3, 8, 4), d, 2)
    _check_in_place(_put_op(d), [cache, pos, v], kernel="index_copy_kernel", gone="aten.index_put")

    def trailing(cache, pos, v):
        return aten.index_put_(cache, [None] * d + [pos, None], v)

    _check_in_place(trailing, [cache, pos, v], kernel="index_copy_kernel", gone="aten.index_put")


def test_index_put_negative_and_int32_indices():
    """index_put_ wraps indices in [-size, 0) (index_copy_ does not) and takes int32 indices:
    so does the lowered call, for this and later calls."""
    cache, _, v = _put_case((2, 3, 8, 4), 2, 3)
    fn = _put(2)
    for captured in (torch.tensor([-1, 0, -8]), torch.tensor([-2, 5, 3], dtype=torch.int32)):
        opt = _optimize(fn, cache, captured, v)
        assert "aten.index_put" not in _region_text(opt)
        for pos in (captured, torch.tensor([7, -7, -3]), torch.tensor([-1, 2, 4], dtype=torch.int32)):
            want = fn(cache.clone(), pos, v)
            opt(cache, pos, v)
            _assert_same(cache, want)


def test_index_put_non_contiguous_cache():
    """The cache is a transposed input, or a slice of the input taken inside the function."""
    base = torch.randn(8, 3, 2, 6)
    t = base.permute(2, 1, 0, 3)  # (2, 3, 8, 6)
    pos = torch.tensor([6, 1])
    v = torch.randn(2, 3, 2, 6)
    _check_in_place(_put(2), [t, pos, v], kernel="index_copy_kernel", gone="aten.index_put")

    def sliced(base, pos, v):
        base[:, :, :, 1:5][:, :, pos] = v
        return base

    v = torch.randn(8, 3, 2, 4)
    pos = torch.tensor([0])
    _check_in_place(
        sliced,
        [torch.randn(8, 3, 4, 6), pos, v[:, :, :1].contiguous()],
        kernel="index_copy_kernel",
        gone="aten.index_put",
    )


def test_index_put_out_of_range_index_writes_nothing_for_that_row():
    """Note [Out-of-range indices in index_copy_kernel]: eager raises (CPU) or asserts on the
    device (CUDA) for an index outside [-size, size); the kernel skips that row and writes the
    others."""
    cache, pos, v = _put_case((4, 5), 0, 2)
    fn = _put(0)
    opt = _optimize(fn, cache, pos, v)
    for bad in ([1, 4], [-5, 2], [7, -1]):
        bad = torch.tensor(bad)
        with pytest.raises(IndexError):
            fn(cache.clone(), bad, v)
        before = cache.clone()
        opt(cache, bad, v)
        want = before.clone()
        for row, i in enumerate(bad.tolist()):
            if -4 <= i < 4:
                want[i] = v[row]
        _assert_same(cache, want)


def test_index_put_scalar_value():
    """`cache[:, pos] = 0.0`: the value is a lifted 0-d constant, broadcast with stride 0."""

    def fn(cache, pos):
        cache[:, pos] = 0.5
        return cache

    cache, pos = torch.randn(3, 6, 2), torch.tensor([4, 1])
    opt = _optimize(fn, cache, pos)
    assert "aten.index_put" not in _region_text(opt)
    want = fn(cache.clone(), pos)
    assert opt(cache, pos) is cache
    _assert_same(cache, want)


def test_index_put_functional():
    x, pos, v = _put_case((3, 6, 4), 1, 2, (2, 1))

    def fn(x, pos, v):
        return aten.index_put(x, [None, pos], v)

    for self_ in (x, x.transpose(0, 2).contiguous().transpose(0, 2)):
        opt = _optimize(fn, self_, pos, v)
        text = _region_text(opt)
        assert "aten.index_put" not in text and "strided_copy_kernel" in text and "index_copy_kernel" in text, text
        before = self_.clone()
        got = opt(self_, pos, v)
        _assert_same(got, fn(before, pos, v))
        _assert_same(self_, before)
        assert got.data_ptr() != self_.data_ptr()


def test_index_puts_left_to_aten():
    cache, pos, v = _put_case((4, 5, 3), 1, 2)
    ops = (aten.index_put_.default, aten.index_put.default)

    def accumulate(c, pos, v):
        return aten.index_put_(c, [None, pos], v, True)

    def two_indices(c, pos, v):
        c[pos, pos] = v[0]
        return c

    def mask(c, m, v):
        c[:, m] = 1.0
        return c

    def index_2d(c, pos, v):
        c[:, pos[None]] = v[:, None]
        return c

    def index_0d(c, pos, v):
        return aten.index_put_(c, [None, pos], v[:, 0])

    def shares_storage(c, pos):
        c[:2][:, pos] = c[2:, :2]
        return c

    cases = [
        (accumulate, (cache, pos, v)),
        (two_indices, (cache, pos, torch.randn(2, 3))),
        (mask, (cache, torch.tensor([True, False, True, False, False]), v)),
        (index_2d, (cache, pos, v)),
        (index_0d, (cache, pos[0], v)),
        (shares_storage, (cache, pos)),
        (lambda c, pos, v: _put(1)(c, pos.short(), v), (cache, pos, v)),  # int16 index
        (
            lambda c, pos, v: _put(1)(c, pos, v.clone()),
            (torch.randn(4, 5, 3, dtype=torch.complex64), pos, torch.randn(4, 2, 3, dtype=torch.complex64)),
        ),
        (
            lambda c, pos, v: _put(1)(c.expand(2, 4, 5, 3), pos, v),
            (torch.randn(4, 5, 3), pos, v),
        ),  # self overlaps itself
        (lambda c, pos, v: _put(1)(c, pos[:0], v[:, :0]), (cache, pos, v)),  # no elements
    ]
    for fn, example in cases:
        _left_to_aten(fn, example, *ops)

    # shares_storage still runs (through ATen) and equals eager
    opt = _optimize(shares_storage, cache, pos)
    want = cache.clone()
    shares_storage(want, pos)
    opt(cache, pos)
    _assert_same(cache, want)


def test_index_put_left_to_aten_under_deterministic_algorithms():
    cache, pos, v = _put_case((4, 5), 0, 2)
    gm = trident.capture(_put(0), cache, pos, v)
    torch.use_deterministic_algorithms(True)
    try:
        with knobs.scope(triton_copies="all"):
            assert lower_copies(gm) == 0
    finally:
        torch.use_deterministic_algorithms(False)


# ---- a decode-style cache write -----------------------------------------------------------


def _decode_write(k_cache, v_cache, pos, x, wk, wv, wq):
    """One decode step's cache writes and the attention scores that read them back."""
    B, H, S, D = k_cache.shape
    k = (x @ wk).view(B, H, 1, D)
    v = (x @ wv).view(B, H, 1, D)
    q = (x @ wq).view(B, H, D, 1)
    k_cache[:, :, pos] = k
    aten.index_put_(v_cache, [None, None, pos], v)
    scores = (k_cache @ q).view(B, H, S)
    return scores, v_cache[:, :, : S // 2].contiguous()


def test_decode_cache_write_matches_eager(device):
    B, H, S, D = 2, 4, 16, 8
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(H * D, H * D, generator=g).to(device) for _ in range(3)]

    def caches():
        return torch.zeros(B, H, S, D, device=device), torch.zeros(B, H, S, D, device=device)

    example = (*caches(), torch.tensor([0], device=device), torch.randn(B, H * D, device=device), *weights)
    with knobs.scope(decode_matmuls="", fuse_glue=""):  # bits as eager's: the products stay cuBLAS's
        opt = _optimize(_decode_write, *example)
    assert sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes) == 1, opt.code
    text = _region_text(opt)
    # both writes share `pos`: one cache_write_kernel launch (trident/passes/fuse_cache_writes.py),
    # listed in the program and in the plan
    assert "aten.index_put" not in text and "launch index_copy_kernel" not in text, text
    assert text.count("launch cache_write_kernel") == 2, text

    got_caches, want_caches = caches(), caches()
    for p in (0, 1, 2, 7, S - 1, -3):  # -3 wraps, as eager's index_put_ does
        x = torch.randn(B, H * D, generator=g).to(device)
        pos = torch.tensor([p], device=device)
        got = opt(*got_caches, pos, x, *weights)
        want = _decode_write(*want_caches, pos, x, *weights)
        for a, b in zip(got, want):
            _assert_same(a, b)
        for a, b in zip(got_caches, want_caches):
            _assert_same(a, b)
    (stats,) = trident.cache_info(opt).values()
    assert stats["misses"] == 0


# ---- compiled kernels on CUDA --------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize(
    "dtype", [torch.bool, torch.int8, torch.int64, torch.bfloat16, torch.float32, torch.float8_e5m2], ids=str
)
def test_compiled_cache_writes_equal_aten_on_cuda(dtype):
    """The compiled kernels, launched directly with the pass's plans, give ATen's CUDA results
    bit for bit: copy_ into a cache slice (broadcast source), index_put_ with negative indices
    and a broadcast value; an out-of-range index skips its row (eager would assert)."""

    def bits(shape, seed):
        return _random_bits(shape, dtype, seed).cuda()

    cache = bits((2, 8, 300, 64), 0)
    for dst_view, src in [
        (lambda c: c[:, :, 17:40], bits((2, 8, 23, 64), 1)),
        (lambda c: c[:, :, 100:164], bits((8, 1, 64), 2)),
        (lambda c: c.transpose(1, 2)[:, 5:9], bits((4, 2, 8, 64), 3).transpose(0, 1)),
    ]:
        got, want = cache.clone(), cache.clone()
        dst = dst_view(got)
        grid, kwargs = _strided_plan(dst.shape, _broadcast_strides(src, dst.shape), dst.stride())
        strided_copy_kernel[grid](src, dst, **kwargs)
        dst_view(want).copy_(src)
        _assert_same(got, want)
    for pos, v in [
        (torch.tensor([3, -1, 298, -300], device="cuda"), bits((2, 8, 4, 64), 4)),  # no duplicates: ATen's
        # order of duplicate writes on CUDA is unspecified
        (torch.tensor([7, -2], device="cuda", dtype=torch.int32), bits((8, 1, 64), 5)),
    ]:
        got = cache.clone()
        _, grid, kwargs = _index_put_plan(got, [None, None, pos], v, False)
        index_copy_kernel[grid](v, got, pos, **kwargs)
        want = cache.clone()
        aten.index_put_(want, [None, None, pos], v)
        _assert_same(got, want)
    got = cache.clone()
    pos = torch.tensor([1, 300, -301, -1], device="cuda")
    v = bits((2, 8, 4, 64), 6)
    _, grid, kwargs = _index_put_plan(got, [None, None, pos], v, False)
    index_copy_kernel[grid](v, got, pos, **kwargs)
    want = cache.clone()
    want[:, :, 1] = v[:, :, 0]
    want[:, :, -1] = v[:, :, 3]
    _assert_same(got, want)


# ---- golden --------------------------------------------------------------------------------


class TestLoweredCacheWrites(expecttest.TestCase):
    def test_index_put_and_slice_scatter(self):
        """`cache[:, pos] = k` with k broadcast over the batch (src_stride 0, negative indices
        wrapped), and a slice_scatter (allocation, clone, slice view of the result, copy)."""

        def fn(cache, pos, k):
            cache[:, pos] = k
            return torch.slice_scatter(cache, k.expand(2, 1, 3), 1, 0, 1)

        gm = trident.capture(fn, torch.zeros(2, 4, 3), torch.tensor([1]), torch.randn(1, 3))
        with knobs.scope(triton_copies="all"):
            self.assertEqual(lower_copies(gm), 2)
        self.assertExpectedInline(
            normalize(gm.code.strip()),
            """\
def forward(self, cache, pos, k):
    view = torch.ops.aten.view.default(k, [3])
    triton_kernel_wrapper_mutation = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(1, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'src_ptr': view, 'dst_ptr': cache, 'index_ptr': pos, 'size0': 1, 'size1': 1, 'size2': 1, 'size3': 2, 'size4': 3, 'src_stride0': 0, 'src_stride1': 1, 'src_stride2': 1, 'src_stride3': 0, 'src_stride4': 1, 'dst_stride0': 3, 'dst_stride1': 1, 'dst_stride2': 1, 'dst_stride3': 12, 'dst_stride4': 1, 'index_stride': 1, 'dim_size': 4, 'numel': 6, 'ATEN_RULES': False, 'WRAP_NEGATIVE': True, 'OFFSETS_64': False, 'BLOCK': 16});  view = pos = triton_kernel_wrapper_mutation = None
    expand = torch.ops.aten.expand.default(k, [2, 1, 3]);  k = None
    empty_like_default = torch.ops.aten.empty_like.default(cache, memory_format = torch.preserve_format)
    triton_kernel_wrapper_mutation_1 = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(1, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'src_ptr': cache, 'dst_ptr': empty_like_default, 'size0': 1, 'size1': 1, 'size2': 1, 'size3': 1, 'size4': 24, 'src_stride0': 1, 'src_stride1': 1, 'src_stride2': 1, 'src_stride3': 1, 'src_stride4': 1, 'dst_stride0': 1, 'dst_stride1': 1, 'dst_stride2': 1, 'dst_stride3': 1, 'dst_stride4': 1, 'numel': 24, 'DST_CONTIGUOUS': True, 'OFFSETS_64': False, 'BLOCK': 32});  cache = triton_kernel_wrapper_mutation_1 = None
    slice_tensor = torch.ops.aten.slice.Tensor(empty_like_default, 1, 0, 1, 1)
    triton_kernel_wrapper_mutation_2 = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(1, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'src_ptr': expand, 'dst_ptr': slice_tensor, 'size0': 1, 'size1': 1, 'size2': 1, 'size3': 2, 'size4': 3, 'src_stride0': 1, 'src_stride1': 1, 'src_stride2': 1, 'src_stride3': 0, 'src_stride4': 1, 'dst_stride0': 1, 'dst_stride1': 1, 'dst_stride2': 1, 'dst_stride3': 12, 'dst_stride4': 1, 'numel': 6, 'DST_CONTIGUOUS': False, 'OFFSETS_64': False, 'BLOCK': 16});  expand = slice_tensor = triton_kernel_wrapper_mutation_2 = None
    return empty_like_default""",
        )
