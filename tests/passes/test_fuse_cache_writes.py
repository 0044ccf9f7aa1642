"""trident/passes/fuse_cache_writes.py: Hugging Face StaticCache's per-layer update
(pos = arange(n) + counter; counter.add_(n); K and V index_copy_ at pos) becomes one launch of
cache_write_kernel, which keeps eager's order (Note [Cache writes in one program]). With
TRIDENT_TRITON_COPIES="all" the CPU runs it through the interpreter launcher: caches and
counters must be eager's bit for bit, also when K and V are one tensor, and what the pass cannot
prove stays apart."""

from __future__ import annotations

import expecttest
import pytest
import torch

import trident
from tests.conftest import normalize
from tests.passes.test_lower_copies import _assert_same
from trident import knobs
from trident.errors import TridentError
from trident.passes import decompose_functional_launches, eliminate_common_subexpressions
from trident.passes.fuse_cache_writes import FUSE_MAX_NUMEL, fuse_cache_writes
from trident.passes.lower_copies import lower_copies
from trident.runtime import SCMRuntime

aten = torch.ops.aten


def _static_update(keys, values, counter, k, v):
    """StaticCache.update (transformers 5.x): the position from the device counter, bumped in place."""
    n = k.shape[-2]
    pos = torch.arange(n, device=keys.device) + counter
    counter.add_(n)
    keys.index_copy_(2, pos, k)
    values.index_copy_(2, pos, v)
    return keys, values


def _layer(keys, values, counter, x, wk, wv):
    b, s, _ = x.shape
    h, d = keys.shape[1], keys.shape[3]
    k = (x @ wk).view(b, s, h, d).transpose(1, 2)
    v = (x @ wv).view(b, s, h, d).transpose(1, 2)
    keys, values = _static_update(keys, values, counter, k, v)
    return (keys * values).sum(-1)


def _args(b=2, h=2, s=1, d=8, cache_len=16, counter_shape=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.zeros(b, h, cache_len, d), torch.zeros(b, h, cache_len, d)
    counter = torch.zeros(counter_shape, dtype=torch.int64)
    x = torch.randn(b, s, h * d, generator=g)
    wk, wv = torch.randn(h * d, h * d, generator=g), torch.randn(h * d, h * d, generator=g)
    return keys, values, counter, x, wk, wv


def _clone(args):
    return [a.clone() for a in args]


def _optimize(fn, args):
    with knobs.scope(triton_copies="all"):
        return trident.optimize(trident.capture(fn, *_clone(args)))


def _launches(opt) -> dict:
    """Launches per kernel in the regions' programs."""
    names = [s.kernel_name for rid in opt.meta["trident_regions"] for s in SCMRuntime.get(rid).program.launches]
    return {k: names.count(k) for k in ("cache_write_kernel", "index_copy_kernel", "index_copy2_kernel")}


def _run_steps(fn, opt, args, steps, alias=False):
    """`steps` calls of the optimized and the eager fn on the same inputs (K and V one tensor
    when `alias`); every output, cache and counter equal after each."""
    got, want = _clone(args), _clone(args)
    if alias:
        got[1], want[1] = got[0], want[0]
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(args[3].shape, generator=g)
        got[3], want[3] = x, x.clone()
        _assert_same(opt(*got), fn(*want))
        for a, b in zip(got[:3], want[:3]):
            _assert_same(a, b)
    return got


@pytest.mark.parametrize("counter_shape", [(), (1,)], ids=["0-dim", "1-elem"])
def test_static_cache_update_is_one_launch_equal_to_eager(counter_shape):
    args = _args(counter_shape=counter_shape)
    opt = _optimize(_layer, args)
    text = trident.scm_text(opt)
    assert _launches(opt) == {"cache_write_kernel": 1, "index_copy_kernel": 0, "index_copy2_kernel": 0}, text
    assert "aten.add" not in text, text  # the position and the bump are inside the launch
    got = _run_steps(_layer, opt, args, steps=12)
    assert int(got[2].reshape(-1)[0]) == 12
    (stats,) = trident.cache_info(opt).values()
    assert stats["misses"] == 0


def test_prefill_length_update():
    """n = 5 rows per call: pos = counter + 0..4, the counter bumped by 5."""
    args = _args(s=5)
    opt = _optimize(_layer, args)
    assert _launches(opt)["cache_write_kernel"] == 1
    got = _run_steps(_layer, opt, args, steps=3)
    assert int(got[2]) == 15


def test_one_tensor_as_keys_and_values_keeps_eagers_order():
    """K and V the same tensor at run time (captured apart): V's rows land last, as in eager."""
    args = _args()
    opt = _optimize(_layer, args)
    _run_steps(_layer, opt, args, steps=4, alias=True)


def test_counter_past_the_cache_writes_nothing():
    """A counter past the cache end: eager's CPU index_copy_ raises, the kernel skips the rows
    (Note [Out-of-range indices in index_copy_kernel]) and still bumps the counter."""
    args = _args(cache_len=4)
    opt = _optimize(_layer, args)
    got = _clone(args)
    got[2].fill_(4)
    opt(*got)
    assert int(got[2]) == 5 and not got[0].any() and not got[1].any()


def test_index_tensor_pair_is_one_launch():
    """Writes through one cache_position tensor the caller passes: one launch, no counter."""

    def fn(keys, values, pos, k, v):
        k, v = k * 2, v * 3
        keys.index_copy_(2, pos, k)
        values.index_copy_(2, pos, v)
        return keys.sum() + values.sum()

    args = [torch.zeros(2, 2, 8, 4), torch.zeros(2, 2, 8, 4), torch.tensor([3]), torch.randn(2, 2, 1, 4),
            torch.randn(2, 2, 1, 4)]  # fmt: skip
    opt = _optimize(fn, args)
    assert _launches(opt) == {"cache_write_kernel": 1, "index_copy_kernel": 0, "index_copy2_kernel": 0}
    for p in (0, 7, 3):
        got, want = _clone(args), _clone(args)
        got[2] = torch.tensor([p])
        want[2] = torch.tensor([p])
        _assert_same(opt(*got), fn(*want))
        for a, b in zip(got, want):
            _assert_same(a, b)
    # one tensor as both caches: the second write wins, as in eager
    cache, want_cache = torch.zeros(2, 2, 8, 4), torch.zeros(2, 2, 8, 4)
    _assert_same(opt(cache, cache, args[2], args[3], args[4]), fn(want_cache, want_cache, *args[2:]))
    _assert_same(cache, want_cache)


def test_source_overlapping_its_cache_is_refused_as_in_eager():
    """What eager's index_copy_ refuses within one call (the source overlapping self) is refused."""

    def fn(keys, values, pos, k, v):
        keys.index_copy_(0, pos, k)
        values.index_copy_(0, pos, v)
        return keys.sum() + values.sum()

    args = [torch.zeros(8, 4), torch.zeros(8, 4), torch.tensor([2]), torch.randn(1, 4), torch.randn(1, 4)]
    opt = _optimize(fn, args)
    assert _launches(opt)["cache_write_kernel"] == 1
    keys = torch.zeros(8, 4)
    with pytest.raises(RuntimeError, match="single memory location"):
        scratch = torch.zeros(8, 4)
        scratch.index_copy_(0, args[2], scratch[5:6])  # eager refuses a source inside self
    with pytest.raises((RuntimeError, TridentError), match="single memory location|overlap"):
        opt(keys, torch.zeros(8, 4), args[2], keys[5:6], args[4])


def _lowered(fn, args):
    gm = trident.capture(fn, *_clone(args))
    decompose_functional_launches(gm)
    eliminate_common_subexpressions(gm)
    with knobs.scope(triton_copies="all"):
        lower_copies(gm)
    return gm


def _read_counter_between(keys, values, counter, k, v):
    pos = torch.arange(1) + counter
    counter.add_(1)
    seen = counter * 10  # reads the bumped counter before the writes
    keys.index_copy_(2, pos, k)
    values.index_copy_(2, pos, v)
    return seen


def _bump_after_first_write(keys, values, counter, k, v):
    pos = torch.arange(1) + counter
    keys.index_copy_(2, pos, k)
    counter.add_(1)
    values.index_copy_(2, pos, v)
    return keys.sum()


def _shared_position(keys, values, counter, k, v, w):
    """The model's cache_position and layer 0's pos are one node (CSE): pos has other users
    and the layer's work lies between it and the bump."""
    pos = torch.arange(1) + counter
    k = (k * pos.float()) @ w  # reads pos, writes only fresh tensors
    counter.add_(1)
    keys.index_copy_(2, pos, k)
    values.index_copy_(2, pos, v)
    return keys.sum() + pos.float().sum()


def _input_written_before_bump(keys, values, counter, k, v, w):
    pos = torch.arange(1) + counter
    w.mul_(2)  # a graph input written: at run time it may be the counter's storage
    counter.add_(1)
    keys.index_copy_(2, pos, k)
    values.index_copy_(2, pos, v)
    return keys.sum()


@pytest.mark.parametrize("fn", [_shared_position, _input_written_before_bump], ids=lambda f: f.__name__)
def test_position_with_work_before_the_bump(fn):
    args = [torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4), torch.tensor(2), torch.randn(1, 2, 1, 4),
            torch.randn(1, 2, 1, 4), torch.randn(4, 4)]  # fmt: skip
    gm = _lowered(fn, args)
    assert fuse_cache_writes(gm) == (1 if fn is _shared_position else 0), gm.code
    opt = _optimize(fn, args)
    for _ in range(3):
        got, want = _clone(args), _clone(args)
        _assert_same(opt(*got), fn(*want))
        for a, b in zip(got, want):
            _assert_same(a, b)


@pytest.mark.parametrize("fn", [_read_counter_between, _bump_after_first_write], ids=lambda f: f.__name__)
def test_unprovable_orders_stay_apart_and_equal_eager(fn):
    args = [torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4), torch.tensor(2), torch.randn(1, 2, 1, 4),
            torch.randn(1, 2, 1, 4)]  # fmt: skip
    gm = _lowered(fn, args)
    assert fuse_cache_writes(gm) == 0, gm.code
    opt = _optimize(fn, args)
    for _ in range(3):
        got, want = _clone(args), _clone(args)
        _assert_same(opt(*got), fn(*want))
        for a, b in zip(got, want):
            _assert_same(a, b)


def test_long_writes_keep_their_parallel_launches():
    """More than FUSE_MAX_NUMEL elements per write: one program would be slow; left apart."""
    h, d = 4, 64
    s = FUSE_MAX_NUMEL // (h * d) + 1
    args = [torch.zeros(1, h, s + 2, d), torch.zeros(1, h, s + 2, d), torch.tensor(0), torch.randn(1, h, s, d),
            torch.randn(1, h, s, d)]  # fmt: skip
    gm = _lowered(_static_update, args)
    assert fuse_cache_writes(gm) == 0


class TestFusedCacheWriteGraph(expecttest.TestCase):
    def test_golden(self):
        args = [torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 4), torch.tensor(0), torch.randn(1, 2, 1, 4),
                torch.randn(1, 2, 1, 4)]  # fmt: skip
        gm = _lowered(_static_update, args)
        assert fuse_cache_writes(gm) == 1
        self.assertExpectedInline(
            normalize(gm.code.strip()),
            """\
def forward(self, keys, values, counter, k, v):
    triton_kernel_wrapper_mutation_2 = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(1, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'src_ptr_0': k, 'dst_ptr_0': keys, 'src_ptr_1': v, 'dst_ptr_1': values, 'index_ptr': counter, 'size0': 1, 'size1': 1, 'size2': 1, 'size3': 2, 'size4': 4, 'src_stride0_0': 4, 'src_stride1_0': 1, 'src_stride2_0': 1, 'src_stride3_0': 4, 'src_stride4_0': 1, 'dst_stride0_0': 4, 'dst_stride1_0': 1, 'dst_stride2_0': 1, 'dst_stride3_0': 32, 'dst_stride4_0': 1, 'src_stride0_1': 4, 'src_stride1_1': 1, 'src_stride2_1': 1, 'src_stride3_1': 4, 'src_stride4_1': 1, 'dst_stride0_1': 4, 'dst_stride1_1': 1, 'dst_stride2_1': 1, 'dst_stride3_1': 32, 'dst_stride4_1': 1, 'index_stride': 1, 'dim_size': 8, 'numel': 8, 'increment': 1, 'PAIRS': 2, 'INDEX_OFFSET': True, 'INCREMENT': True, 'ATEN_RULES': True, 'WRAP_NEGATIVE': False, 'OFFSETS_64': False, 'BLOCK': 16, 'ITERS': 1});  k = v = counter = triton_kernel_wrapper_mutation_2 = None
    return (keys, values)""",
        )


def _update_and_read(keys, values, counter, k, v):
    keys, values = _static_update(keys, values, counter, k, v)
    return keys[:, :, :4].clone(), values[:, :, :4].clone()


@pytest.mark.cuda
@pytest.mark.parametrize(
    "b,h,s,d,dtype", [(1, 8, 1, 64, torch.bfloat16), (2, 4, 16, 64, torch.float32), (1, 2, 3, 5, torch.int64)]
)
@pytest.mark.parametrize("alias", [False, True])
def test_compiled_cache_write_equals_eager_on_cuda(b, h, s, d, dtype, alias):
    """The compiled kernel (CTA barriers between the phases; 8 blocks of rows per pair for the
    (2, 4, 16, 64) update) under the default TRIDENT_TRITON_COPIES=cuda, many calls (graph
    replay after the first ones): caches, counter and results eager's bit for bit, also with
    one tensor as K and V."""
    cache_len = 4 + 12 * s

    def fresh(shape, seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(shape, generator=g) * 100).to(dtype).cuda()

    def inputs():
        keys = torch.zeros(b, h, cache_len, d, dtype=dtype, device="cuda")
        values = keys if alias else torch.zeros_like(keys)
        return [keys, values, torch.tensor(0, device="cuda")]

    k0, v0 = fresh((b, h, s, d), 0), fresh((b, h, s, d), 1)
    opt = trident.optimize(trident.capture(_update_and_read, *[t.clone() for t in inputs()], k0, v0))
    assert _launches(opt)["cache_write_kernel"] == 1
    got, want = inputs(), inputs()
    for step in range(12):
        k, v = fresh((b, h, s, d), 2 + 2 * step), fresh((b, h, s, d), 3 + 2 * step)
        for x, y in zip(opt(*got, k, v), _update_and_read(*want, k.clone(), v.clone())):
            _assert_same(x, y)
        for x, y in zip(got, want):
            _assert_same(x, y)
    torch.cuda.synchronize()
    assert int(got[2]) == 12 * s


def test_writes_through_views_of_the_counter_or_pos_keep_the_launches_apart():
    """Review finds: a closed-over counter bumped through a view (`cnt[0] += 5`) or pos changed
    in place before the writes: the fused kernel would read the wrong base; left apart, eager's."""
    cnt = torch.tensor([2])
    keys, values = torch.zeros(1, 2, 16, 4), torch.zeros(1, 2, 16, 4)

    def through_view(k, v):
        pos = torch.arange(1) + cnt
        cnt.view(-1).add_(5)
        cnt.add_(1)
        keys.index_copy_(2, pos, k)
        values.index_copy_(2, pos, v)
        return keys.sum(-1)

    def pos_changed(k, v):
        pos = torch.arange(1) + cnt
        pos.view(-1).remainder_(8)
        cnt.add_(1)
        keys.index_copy_(2, pos, k)
        values.index_copy_(2, pos, v)
        return keys.sum(-1)

    k, v = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
    for fn in (through_view, pos_changed):
        gm = _lowered(fn, [k, v])
        assert fuse_cache_writes(gm) == 0, gm.code
        for t in (cnt, keys, values):
            t.zero_()
        cnt.fill_(9 if fn is pos_changed else 2)
        want_keys = keys.clone()
        want_cnt = cnt.clone()
        opt = _optimize(fn, [k, v])
        for t, w in ((cnt, want_cnt), (keys, want_keys)):
            t.copy_(w)
        values.zero_()
        got = opt(k, v)
        got_state = (cnt.clone(), keys.clone(), values.clone())
        cnt.copy_(want_cnt)
        keys.copy_(want_keys)
        values.zero_()
        want = fn(k, v)
        _assert_same(got, want)
        for a, b in zip(got_state, (cnt, keys, values)):
            _assert_same(a, b)


def test_an_int32_counter_at_call_time():
    """Captured with an int64 counter, called with an int32 one: a new specialization of the
    fused kernel (the index is computed in int64, the bump wraps in int32), eager's result."""
    args = _args()
    opt = _optimize(_layer, args)
    got, want = _clone(args), _clone(args)
    got[2] = torch.tensor(3, dtype=torch.int32)
    want[2] = torch.tensor(3, dtype=torch.int32)
    _assert_same(opt(*got), _layer(*want))
    for a, b in zip(got[:3], want[:3]):
        _assert_same(a, b)
