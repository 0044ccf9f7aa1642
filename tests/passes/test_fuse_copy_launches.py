"""trident/passes/fuse_copy_launches.py: two independent lower_copies launches of one kernel
and one shape become one launch of strided_copy2_kernel / index_copy2_kernel. With
TRIDENT_TRITON_COPIES="all" the CPU runs the kernels through the interpreter launcher; fused
results must be the unfused ones bit for bit, and dependent launches stay apart."""

from __future__ import annotations

import functools
import sys

import torch

import trident
from tests.decode_model import Config, check_steps_against_reference, decode_step, make_caches, make_weights
from tests.passes.test_lower_copies import _assert_same
from tests import kernels as K
from trident import knobs
from trident.kernels import index_copy2_kernel, index_copy_kernel, strided_copy2_kernel, strided_copy_kernel
from trident.passes import decompose_functional_launches, drop_unused_projections, eliminate_common_subexpressions
from trident.passes.common import is_launch
from trident.passes.fuse_copy_launches import fuse_copy_launches
from trident.passes.lower_copies import lower_copies
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

_KERNELS = (strided_copy_kernel, index_copy_kernel, strided_copy2_kernel, index_copy2_kernel)


def _launch_counts(gm) -> dict:
    counts = {k.fn.__name__: 0 for k in _KERNELS}
    for n in gm.graph.nodes:
        if is_launch(n):
            kernel = kernel_side_table.get_kernel(n.kwargs["kernel_idx"])
            if kernel in _KERNELS:
                counts[kernel.fn.__name__] += 1
    return counts


def _lowered(fn, *example):
    """fn's graph as optimize has it when fuse_copy_launches runs."""
    gm = trident.capture(fn, *_clone_args(example))
    decompose_functional_launches(gm)
    drop_unused_projections(gm)
    eliminate_common_subexpressions(gm)
    with knobs.scope(triton_copies="all"):
        lower_copies(gm)
    return gm


def _fused_counts(fn, *example):
    gm = _lowered(fn, *example)
    before = _launch_counts(gm)
    merged = fuse_copy_launches(gm)
    return merged, before, _launch_counts(gm)


def _optimize(fn, *example, fuse=True, cache_writes=True, monkeypatch=None):
    """optimize; fuse=False leaves out fuse_copy_launches, cache_writes=False fuse_cache_writes
    (which otherwise takes small index-write pairs first: tests/passes/test_fuse_cache_writes.py)."""
    gm = trident.capture(fn, *_clone_args(example))
    with knobs.scope(triton_copies="all"):
        if fuse and cache_writes:
            return trident.optimize(gm)
        with monkeypatch.context() as m:
            if not fuse:
                m.setattr(sys.modules["trident.optimize"], "fuse_copy_launches", lambda gm: 0)
            if not cache_writes:
                m.setattr(sys.modules["trident.optimize"], "fuse_cache_writes", lambda gm: 0)
            return trident.optimize(gm)


# ---- the decode step -------------------------------------------------------------------------


def test_decode_step_merges_its_clone_pairs():
    cfg = Config(layers=2)
    weights, cos, sin = make_weights(cfg, "cpu")
    step = functools.partial(decode_step, cfg)
    example = (torch.randn(1, cfg.hidden), torch.tensor([0]), cos, sin, *make_caches(cfg, "cpu"), *weights)
    merged, before, after = _fused_counts(step, *example)
    # Per layer: the K and V expand-reshape clones merge; the K and V cache writes (in place into
    # two graph inputs, which a caller may alias) stay two launches.
    assert before == {
        "strided_copy_kernel": 4,
        "index_copy_kernel": 4,
        "strided_copy2_kernel": 0,
        "index_copy2_kernel": 0,
    }
    assert merged == 2
    assert after == {
        "strided_copy_kernel": 0,
        "index_copy_kernel": 4,
        "strided_copy2_kernel": 2,
        "index_copy2_kernel": 0,
    }

    with knobs.scope(triton_copies="all"):
        opt = trident.optimize(trident.capture(step, *example))
    text = trident.scm_text(opt)
    assert text.count("  launch strided_copy2_kernel[2, 2, 1](") == 2, text
    assert "writes(dst_ptr_0, dst_ptr_1)" in text, text
    check_steps_against_reference(cfg, opt, weights, cos, sin, [0, 1, 2, 5, 3, 31])


def test_one_tensor_passed_as_both_caches_gives_eagers_result():
    """The K and V writes are not merged, so aliased caches behave as in eager: the second write wins."""

    def writes(k_cache, v_cache, pos, k, v):
        k_cache.index_copy_(1, pos, k)
        v_cache.index_copy_(1, pos, v)
        return K.axpy(k.flatten(), v.flatten())

    cache = torch.zeros(2, 8, 4)
    k, v, pos = torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.tensor([3])
    with knobs.scope(triton_copies="all"):
        opt = trident.optimize(trident.capture(writes, torch.zeros(2, 8, 4), torch.zeros(2, 8, 4), pos, k, v))
    assert "index_copy2_kernel" not in trident.scm_text(opt)
    want = cache.clone()
    want.index_copy_(1, pos, k)
    want.index_copy_(1, pos, v)
    opt(cache, cache, pos, k, v)
    assert torch.equal(cache, want)


# ---- mergeable pairs: bit-identical to the unfused graph ---------------------------------------


def _two_transposed_clones(x, y):
    return x.t().contiguous(), y[::2].t().contiguous()


def test_clone_pair_fused_bit_identical(monkeypatch):
    # Same iteration space, different source strides (x.t(): (1, 6); y[::2].t(): (1, 12)).
    args = (torch.randn(4, 6), torch.randn(8, 6))
    merged, before, after = _fused_counts(_two_transposed_clones, *args)
    assert merged == 1 and before["strided_copy_kernel"] == 2, before
    assert after["strided_copy_kernel"] == 0 and after["strided_copy2_kernel"] == 1, after
    fused = _optimize(_two_transposed_clones, *args)
    unfused = _optimize(_two_transposed_clones, *args, fuse=False, monkeypatch=monkeypatch)
    assert "strided_copy2_kernel" in trident.scm_text(fused)
    assert "strided_copy2_kernel" not in trident.scm_text(unfused)
    for got, plain, want in zip(fused(*args), unfused(*args), _two_transposed_clones(*args)):
        assert torch.equal(got, plain) and torch.equal(got, want)
        _assert_same(got, want)


def _kv_write(k, v, pos, a, b):
    # Sources the graph computes (a fresh result shares no storage with an input), both before
    # the writes: an ATen op between two launches keeps them apart.
    sa, sb = a * 2, b * 3
    k.index_copy_(2, pos, sa)
    v.index_copy_(2, pos, sb)
    return k.sum() + v.sum()


def _kv_put(k, v, pos, a, b):
    sa, sb = a * 2, b * 3
    k[:, :, pos] = sa
    v[:, :, pos] = sb
    return k.sum() + v.sum()


def _padded(t):
    """t's values in a view of a wider tensor (strides (192, 64, 8, 1) for t of (2, 3, 8, 4)):
    the same iteration space as a contiguous cache after coalescing, other strides."""
    return torch.zeros(*t.shape[:-1], 2 * t.shape[-1])[..., : t.shape[-1]].copy_(t)


def _kv_args():
    return (
        torch.randn(2, 3, 8, 4),
        _padded(torch.randn(2, 3, 8, 4)),
        torch.tensor([5, 1]),
        torch.randn(2, 3, 2, 4),
        torch.randn(2, 3, 2, 4),
    )


def _clone_args(args):
    """Copies of the tensors with their sizes, strides and storage offsets (clone would make
    a padded view dense)."""

    def copy(t):
        base = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype)
        return base.as_strided(t.shape, t.stride(), t.storage_offset()).copy_(t)

    return [copy(t) for t in args]


def _kv_write_fresh(k, v, pos, a, b):
    # Writes into tensors the graph made (clones): they cannot alias, so both pairs merge.
    k2, v2 = k.clone(), v.clone()
    k2.index_copy_(2, pos, a)
    v2.index_copy_(2, pos, b)
    return k2, v2


def test_index_write_pairs_into_inputs_stay_apart_and_match_eager():
    for fn in (_kv_write, _kv_put):
        args = _kv_args()
        merged, before, after = _fused_counts(fn, *args)
        assert merged == 0 and after["index_copy_kernel"] == before["index_copy_kernel"] == 2, (fn, after)
        opt = _optimize(fn, *args)
        a, e = _clone_args(args), _clone_args(args)
        out, out_e = opt(*a), fn(*e)
        assert torch.equal(out, out_e) and torch.equal(a[0], e[0]) and torch.equal(a[1], e[1])


def test_index_write_pairs_into_fresh_tensors_fused_bit_identical(monkeypatch):
    args = _kv_args()
    merged, before, after = _fused_counts(_kv_write_fresh, *args)
    assert merged >= 1 and after["index_copy2_kernel"] == 1 and after["index_copy_kernel"] == 0, after
    fused = _optimize(_kv_write_fresh, *args, cache_writes=False, monkeypatch=monkeypatch)
    unfused = _optimize(_kv_write_fresh, *args, fuse=False, cache_writes=False, monkeypatch=monkeypatch)
    assert "index_copy2_kernel" in trident.scm_text(fused)
    got, plain, want = fused(*_clone_args(args)), unfused(*_clone_args(args)), _kv_write_fresh(*_clone_args(args))
    for g, p, w in zip(got, plain, want):
        assert torch.equal(g, p) and torch.equal(g, w)
        _assert_same(g, w)


# ---- dependent or possibly aliasing pairs stay apart -------------------------------------------


def _clone_of_clone(x):
    return x.clone().t().clone()  # the second reads what the first wrote


def _write_then_overwrite_source(k, a, b, pos):
    k.index_copy_(0, pos, a)  # reads a ...
    a.index_copy_(0, pos, b)  # ... which the second writes
    return k.sum() + a.sum()


def _write_then_read_it(k, v, a, pos):
    k.index_copy_(0, pos, a)
    v.index_copy_(0, pos, k)  # reads what the first wrote
    return k.sum() + v.sum()


def _input_sources(k, v, pos, a, b):
    # b may be a view of k at run time: the second would then read what the first wrote.
    k.index_copy_(2, pos, a)
    v.index_copy_(2, pos, b)
    return k.sum() + v.sum()


def test_dependent_pairs_not_fused():
    perm = torch.tensor([3, 2, 1, 0])
    cases = [
        (_clone_of_clone, (torch.randn(4, 4),), "strided_copy_kernel"),
        (
            _write_then_overwrite_source,
            (torch.randn(4, 3), torch.randn(4, 3), torch.randn(4, 3), perm),
            "index_copy_kernel",
        ),
        (_write_then_read_it, (torch.randn(4, 3), torch.randn(4, 3), torch.randn(4, 3), perm), "index_copy_kernel"),
        (_input_sources, _kv_args(), "index_copy_kernel"),
    ]
    for fn, args, kernel in cases:
        merged, before, after = _fused_counts(fn, *args)
        assert before[kernel] == 2, (fn.__name__, before)
        assert merged == 0 and after == before, (fn.__name__, after)
        # and the optimized graph still computes eager's result
        opt = _optimize(fn, *args)
        a, e = _clone_args(args), _clone_args(args)
        got, want = opt(*a), fn(*e)
        for g, w in zip([got, *a], [want, *e]):
            _assert_same(g, w)


def test_user_launches_not_fused():
    """Launches without lower_copies' mark (a user's own launch of the same kernel) stay."""
    gm = _lowered(_two_transposed_clones, torch.randn(4, 6), torch.randn(8, 6))
    for n in gm.graph.nodes:
        n.meta.pop("trident_lowered_copy", None)
    assert fuse_copy_launches(gm) == 0
    assert _launch_counts(gm)["strided_copy_kernel"] == 2
