"""trident/passes/fuse_cache_attention.py: a StaticCache step's cache write given to the decode
attention that reads the cache (Note [The cache write inside the attention]): the split kernel
writes the new rows and reads them from the new keys and values, the combine kernel bumps the
counter, and the cache_write launch is gone. On the CPU the kernels run through the
interpreter; outputs, caches and counters must equal eager's step after step, and what the pass
cannot prove stays two launches."""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
import torch.nn.functional as F

import trident
from tests.passes.test_decode_attention import _repeat_kv
from trident import knobs
from trident.kernels import attention as A
from trident.kernels.attention import decode_attention
from trident.passes.fuse_cache_attention import APART
from trident.runtime import SCMRuntime

B, HKV, G, D, S = 1, 2, 4, 16, 40


def _eager_write_then_attend(q, keys, values, new_k, new_v, index, offset, increment, mask):
    """What the fused launches replace: index_copy_ of the rows (the counter bumped), then SDPA."""
    pos = torch.arange(new_k.shape[2], device=index.device) + index.reshape(-1)[0] if offset else index
    if increment is not None:
        index.add_(increment)
    keys.index_copy_(2, pos, new_k)
    values.index_copy_(2, pos, new_v)
    g = q.shape[1] // keys.shape[1]
    return F.scaled_dot_product_attention(q, _repeat_kv(keys, g), _repeat_kv(values, g), attn_mask=mask)


@pytest.mark.parametrize("one_pass", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_kernel_writes_the_rows_and_attends_as_index_copy_then_sdpa(seed, one_pass, device):
    """Random shapes; rows at the counter (bumped by the combine kernel) or through an index
    tensor with a repeated position (the last row wins, as index_copy_ leaves it); the new
    rows fall in one program's key range or straddle two; also in one pass (Note [One pass]:
    one program per head reads every key and writes the head's rows)."""
    g = torch.Generator().manual_seed(seed)
    pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=g))]  # noqa: E731
    b, hkv, grp, n = pick([1, 2]), pick([1, 2]), pick([1, 4]), pick([1, 2, 3])
    s, d = int(torch.randint(n + 2, 80, (1,), generator=g)), pick([16, 32])
    offset = seed % 2 == 0
    q = torch.randn(b, hkv * grp, n, d, generator=g)
    keys, values = torch.randn(b, hkv, s, d, generator=g), torch.randn(b, hkv, s, d, generator=g)
    new_k = torch.randn(b, n, hkv, d, generator=g).transpose(1, 2)  # a projection's layout
    new_v = torch.randn(b, hkv, n, d, generator=g)
    mask = torch.rand(b, 1, n, s, generator=g) > 0.3
    if offset:
        index, increment = torch.tensor([int(torch.randint(0, s - n + 1, (1,), generator=g))]), n
    else:
        rows = torch.randint(0, s, (n,), generator=g)
        rows[-1] = rows[0]  # a position twice: the last row's values stay
        index, increment = rows, None
    mask[..., 0] = True
    q, keys, values, new_k, new_v, mask, index = (t.to(device) for t in (q, keys, values, new_k, new_v, mask, index))
    rows = torch.arange(n, device=device) + index[0] if offset else index
    keys[:, :, rows] = values[:, :, rows] = float("nan")  # a program reading a row before its write shows
    # eager on the CPU: CUDA's index_copy_ leaves one of a repeated position's rows at random
    want_k, want_v, want_i = (t.to("cpu", copy=True) for t in (keys, values, index))
    want = _eager_write_then_attend(*(t.cpu() for t in (q, want_k, want_v, new_k, new_v, want_i)), offset,
                                    increment, mask.cpu())
    want_k, want_v, want_i, want = (t.to(device) for t in (want_k, want_v, want_i, want))
    got = decode_attention(q, keys, values, mask, new=(new_k, new_v, index, offset, increment), one_pass=one_pass)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert torch.equal(keys, want_k) and torch.equal(values, want_v) and torch.equal(index, want_i)


def test_a_masked_key_of_inf_gives_eagers_nan():
    """SDPA adds 0 / -inf for a boolean mask: a masked-out score of +inf becomes NaN in eager,
    and the kernel reading the boolean mask itself (Note [A boolean mask as given]) gives the same."""
    args = _inputs()
    opt = _optimize(_layer, args)
    got, want = [a.clone() for a in args], [a.clone() for a in args]
    for a in (got, want):
        a[0][:, :, 30] = float("inf")  # a row the mask leaves out, never written
    assert _layer(*want).isnan().any() and opt(*got).isnan().any()


@pytest.mark.parametrize("one_pass", [False, True])
def test_rows_past_the_cache_are_written_nowhere(one_pass):
    """A position past the cache end (eager's CPU index_copy_ raises; cache_write_kernel skips
    the row, Note [Out-of-range indices in index_copy_kernel]): the rows in range land, the
    others are neither written nor read, the counter is bumped; one new row at the end or past
    it (Note [One round of loads]: its position is -1, matched by no key); also in one pass."""
    q = torch.randn(1, 2, 2, 16)
    keys, values = torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 8, 16)
    new_k, new_v = torch.randn(1, 1, 2, 16), torch.randn(1, 1, 2, 16)
    counter = torch.tensor([7])
    out = decode_attention(q, keys, values, None, new=(new_k, new_v, counter, True, 2), one_pass=one_pass)
    assert int(counter) == 9 and torch.equal(keys[0, 0, 7], new_k[0, 0, 0]) and not keys[0, 0, :7].any()
    assert torch.isfinite(out).all()
    for position, lands in ((7, True), (0, True), (8, False), (-1, False)):  # written nowhere outside [0, S)
        q1 = torch.randn(1, 2, 1, 16)
        keys.zero_()
        values.zero_()
        row_k, row_v = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
        index = torch.tensor([position])
        want_keys = keys.clone()
        if lands:
            want_keys[0, 0, position] = row_k[0, 0, 0]
        out = decode_attention(q1, keys, values, None, new=(row_k, row_v, index, False, None), one_pass=one_pass)
        assert torch.equal(keys, want_keys) and torch.isfinite(out).all(), (position, one_pass)
        g = q1.shape[1]
        want = F.scaled_dot_product_attention(q1, _repeat_kv(want_keys, g), _repeat_kv(values, g))
        if lands:
            torch.testing.assert_close(out, want, rtol=2e-5, atol=2e-5)


def _project_and_write(keys, values, counter, x, wq, wk, wv):
    """A layer's projections and its StaticCache update as transformers 5.x writes it: the position
    from the device counter, bumped in place, the rows written with index_copy_; the query."""
    b, s, _ = x.shape
    hkv, d = keys.shape[1], keys.shape[3]
    q = (x @ wq).view(b, s, wq.shape[1] // d, d).transpose(1, 2)
    k = (x @ wk).view(b, s, hkv, d).transpose(1, 2)
    v = (x @ wv).view(b, s, hkv, d).transpose(1, 2)
    pos = torch.arange(s, device=keys.device) + counter
    counter.add_(s)
    keys.index_copy_(2, pos, k)
    values.index_copy_(2, pos, v)
    return q


def _attend(q, keys, values, mask):
    """repeat_kv and SDPA with the 4D boolean mask generate() passes."""
    g = q.shape[1] // keys.shape[1]
    return F.scaled_dot_product_attention(q, _repeat_kv(keys, g), _repeat_kv(values, g), attn_mask=mask)


def _layer(keys, values, counter, x, wq, wk, wv, mask):
    """One attention layer over a StaticCache: the update, then the attention."""
    return _attend(_project_and_write(keys, values, counter, x, wq, wk, wv), keys, values, mask)


def _peek_between(keys, values, counter, x, wq, wk, wv, mask):
    """The same, reading the cache after the attention: the write is still given to it."""
    out = _layer(keys, values, counter, x, wq, wk, wv, mask)
    return out, keys.sum()


def _peek_inside(keys, values, counter, x, wq, wk, wv, mask):
    """Reading the cache between its write and the attention: the write stays its own launch."""
    q = _project_and_write(keys, values, counter, x, wq, wk, wv)
    seen = keys.amax()
    return _attend(q, keys, values, mask) + seen


def _layer_at(keys, values, pos, x, wq, wk, wv, mask):
    """The rows written at a cache_position tensor the caller passes (transformers 4.x)."""
    b, s, _ = x.shape
    hkv, d = keys.shape[1], keys.shape[3]
    h = wq.shape[1] // d
    q = (x @ wq).view(b, s, h, d).transpose(1, 2)
    keys.index_copy_(2, pos, (x @ wk).view(b, s, hkv, d).transpose(1, 2))
    values.index_copy_(2, pos, (x @ wv).view(b, s, hkv, d).transpose(1, 2))
    return F.scaled_dot_product_attention(q, _repeat_kv(keys, h // hkv), _repeat_kv(values, h // hkv), attn_mask=mask)


def _layer_at_after_projections(keys, values, pos, x, wq, wk, wv, mask):
    """The rows written at a cache_position tensor after the three projections, as Hugging Face's
    attention does (StaticCache.update: both index_copy_ calls together)."""
    b, s, _ = x.shape
    hkv, d = keys.shape[1], keys.shape[3]
    h = wq.shape[1] // d
    q = (x @ wq).view(b, s, h, d).transpose(1, 2)
    k = (x @ wk).view(b, s, hkv, d).transpose(1, 2)
    v = (x @ wv).view(b, s, hkv, d).transpose(1, 2)
    keys.index_copy_(2, pos, k)
    values.index_copy_(2, pos, v)
    return F.scaled_dot_product_attention(q, _repeat_kv(keys, h // hkv), _repeat_kv(values, h // hkv), attn_mask=mask)


def _layer_given(keys, values, counter, x, k_in, v_in, wq, mask):
    """The new keys and values passed in ([B, n, Hkv, D], transposed here): views of graph inputs,
    which may be views of the caches at run time: the write stays apart."""
    b, s, _ = x.shape
    d = keys.shape[3]
    h = wq.shape[1] // d
    q = (x @ wq).view(b, s, h, d).transpose(1, 2)
    pos = torch.arange(s) + counter
    counter.add_(s)
    keys.index_copy_(2, pos, k_in.transpose(1, 2))
    values.index_copy_(2, pos, v_in.transpose(1, 2))
    g = h // keys.shape[1]
    return F.scaled_dot_product_attention(q, _repeat_kv(keys, g), _repeat_kv(values, g), attn_mask=mask)


def _inputs(device="cpu", seed=0, length=S):
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.zeros(B, HKV, length, D), torch.zeros(B, HKV, length, D)
    w = [torch.randn(HKV * G * D, n, generator=g) * 0.2 for n in (HKV * G * D, HKV * D, HKV * D)]
    args = [keys, values, torch.tensor(3), torch.randn(B, 1, HKV * G * D, generator=g), *w, _step_mask(3, length=length)]
    return [a.to(device) for a in args]


def _step_mask(position: int, device="cpu", length=S):
    return (torch.arange(length, device=device) <= position)[None, None, None, :]


def _optimize(fn, args):
    with knobs.scope(decode_attention="all", triton_copies="all"):
        return trident.optimize(trident.capture(fn, *[a.clone() for a in args]))


def _kernels(opt) -> list:
    return [getattr(s, "kernel_name", None) or s.op_name for rid in opt.meta["trident_regions"]
            for s in SCMRuntime.get(rid).program.steps if hasattr(s, "kernel_name") or hasattr(s, "op_name")]


def _run_steps(fn, opt, args, steps=6):
    """`steps` decode steps of opt and eager fn on fresh inputs: outputs, caches, counters equal
    (caches bit for bit on the CPU; on CUDA the k/v products may run on Trident's GEMV, measured
    faster than cuBLAS there, which rounds differently: within the outputs' tolerance)."""
    got, want = [a.clone() for a in args], [a.clone() for a in args]
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        x = torch.randn(args[3].shape, generator=g).to(args[3].device)
        got[3], want[3] = x, x.clone()
        got[7] = want[7] = _step_mask(3 + step, args[3].device, args[0].shape[2])
        torch.testing.assert_close(opt(*got), fn(*want), rtol=1e-4, atol=1e-4)
        for a, b in zip(got[:3], want[:3]):
            if a.is_cuda and a.is_floating_point():
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
            else:
                assert torch.equal(a, b)
    return got


def test_static_cache_layer_is_the_attentions_launches_alone(device):
    args = _inputs(device)
    opt = _optimize(_layer, args)
    names = _kernels(opt)
    why = opt.meta.get(APART)
    assert "cache_write_kernel" not in names and "index_copy_kernel" not in names, (why, names)
    assert why == [None]
    assert "cache writes inside the decode attention: 1 of 1 attention(s)" in trident.explain(opt)
    assert names.count("decode_attention_split_kernel") == names.count("decode_attention_combine_kernel") == 1
    assert not any(n.startswith("aten.where") for n in names), names  # Note [A boolean mask as given]
    got = _run_steps(_layer, opt, args)
    assert int(got[2]) == 3 + 6
    with knobs.scope(cache_attention="off"):  # TRIDENT_CACHE_ATTENTION: the write keeps its launch
        assert "cache_write_kernel" in _kernels(_optimize(_layer, args))


@contextlib.contextmanager
def _one_pass_fastest(on: bool = True, form: str = "kernel_one_pass"):
    """A timer (standing for the GPU) under which Note [One pass]'s `form` (its wide variant:
    "kernel_one_pass_wide") measures fastest (none with `on` false), removed after."""
    from trident.passes import decode_attention as DA
    if on:
        DA.set_timer(lambda name, shape: 1.0 if name == form else 2.0)
    try:
        yield
    finally:
        if on:
            DA.set_timer(None)


def _steps_at_positions(opt, fn, args, positions):
    """Steps of opt and eager fn writing the rows at each of `positions` (a cache_position tensor
    per step): outputs within tolerance, caches equal."""
    got, want = [a.clone() for a in args], [a.clone() for a in args]
    g = torch.Generator().manual_seed(2)
    for p in positions:
        x = torch.randn(args[3].shape, generator=g)
        got[3], want[3], got[2], want[2] = x, x.clone(), torch.tensor([p]), torch.tensor([p])
        got[7] = want[7] = _step_mask(max(p, 9), length=args[0].shape[2])
        torch.testing.assert_close(opt(*got), fn(*want), rtol=1e-4, atol=1e-4)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_one_pass_attention_writes_the_rows_at_a_cache_position():
    """Note [One pass] measured fastest: the attention is one launch, and the write of the
    step's rows at the caller's cache_position moves into it (no cache_write, no combine)."""
    args = _inputs()
    args[2] = torch.tensor([3])
    with _one_pass_fastest():
        opt = _optimize(_layer_at_after_projections, args)
    names = _kernels(opt)
    assert names.count("decode_attention_split_kernel") == 1 and "decode_attention_combine_kernel" not in names
    assert "cache_write_kernel" not in names and "index_copy_kernel" not in names, (opt.meta.get(APART), names)
    assert "in one pass" in trident.explain(opt)
    _steps_at_positions(opt, _layer_at_after_projections, args, (3, 4, 9, 4, 0))  # 4 again: its row replaced


@pytest.mark.parametrize("wide", [False, True])
def test_one_pass_attention_takes_a_counters_write_and_bump(wide):
    """A write at a counter (transformers 5's StaticCache: its cumulative length, bumped in
    place): in one pass the write moves into the one launch and the last of its programs (one
    per kv head) to arrive bumps the counter, after every program read it; step after step the
    outputs, caches and counter equal eager's (the arrival count back at 0 each call). Also in
    the wide variant's blocks (a 300-position cache: two blocks of 256 keys)."""
    args = _inputs(length=300 if wide else S)
    with _one_pass_fastest(form="kernel_one_pass_wide" if wide else "kernel_one_pass"):
        opt = _optimize(_layer, args)
    names = _kernels(opt)
    split = [s for rid in opt.meta["trident_regions"] for s in SCMRuntime.get(rid).program.steps
             if getattr(s, "kernel_name", None) == "decode_attention_split_kernel"]
    assert [(s.args["BLOCK_N"], s.args["DIRECT"], s.args["NEW"]) for s in split] == [(256 if wide else 64, True, 1)]
    assert names.count("decode_attention_split_kernel") == 1, names
    assert "cache_write_kernel" not in names and "decode_attention_combine_kernel" not in names, names
    assert opt.meta[APART] == [None]
    got = _run_steps(_layer, opt, args)
    assert int(got[2]) == 3 + 6


def test_rows_at_a_cache_position_tensor():
    """The index-tensor form: fused too, the positions read from the caller's tensor."""
    args = _inputs()
    args[2] = torch.tensor([3])
    opt = _optimize(_layer_at, args)
    assert "cache_write_kernel" not in _kernels(opt), _kernels(opt)
    _steps_at_positions(opt, _layer_at, args, (3, 4, 9, 4))  # 4 again: its row replaced


def test_sources_that_are_views_of_inputs_keep_the_write_apart():
    g = torch.Generator().manual_seed(3)
    args = _inputs()
    args = [*args[:4], torch.randn(B, 1, HKV, D, generator=g), torch.randn(B, 1, HKV, D, generator=g), args[4], args[7]]
    opt = _optimize(_layer_given, args)
    assert "cache_write_kernel" in _kernels(opt), _kernels(opt)
    got, want = [a.clone() for a in args], [a.clone() for a in args]
    torch.testing.assert_close(opt(*got), _layer_given(*want), rtol=1e-4, atol=1e-4)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])


@pytest.mark.parametrize("one_pass", [False, True])
@pytest.mark.parametrize("fn", [_peek_between, _peek_inside])
def test_a_read_of_the_cache_between_keeps_the_write_apart(fn, one_pass):
    """A read of the cache after the write (after the attention, or between the write and the
    attention): where it lies between, the write stays its own launch; results equal eager's.
    The same with the attention in one pass (Note [One pass]: the window ends at its launch)."""
    args = _inputs()
    with _one_pass_fastest(one_pass):
        opt = _optimize(fn, args)
    names = _kernels(opt)
    assert ("decode_attention_combine_kernel" in names) == (not one_pass), names
    assert ("cache_write_kernel" in names) == (fn is _peek_inside), names
    if fn is _peek_inside:  # explain() says why
        assert "one stays a launch of its own: amax (aten.amax.default) between" in trident.explain(opt), trident.explain(opt)
    _run_steps(fn, opt, args, steps=3)


def test_caches_overlapping_at_call_time_are_refused_not_wrong():
    """Keys and values captured apart, then one tensor: the fused kernel would read rows another
    program writes, so the call is refused natively with what to do (eager runs it)."""
    args = _inputs()
    opt = _optimize(_layer, args)
    got = [a.clone() for a in args]
    got[1] = got[0]
    with pytest.raises(RuntimeError, match=r"\(the keys cache\) and reads input 'values' \(the values cache\), "
                                            r"and the two overlap in memory.*TRIDENT_CACHE_ATTENTION=0"):
        opt(*got)


def test_one_round_of_loads_before_the_first_product_on_sm90():
    """Note [One round of loads] in the sm_90 PTX of a decode step's split kernel (Llama-1B's
    heads, a StaticCache of 512, a boolean mask, one new row written, PDL): every plain global
    load -- q, the position, the new row, the mask's row -- is issued after the wait and before
    the first tensor-core product, and the keys' and values' copies before the first wait on them."""
    b, h, hkv, s, d = 1, 32, 8, 512, 64
    q, nk, nv = (torch.empty(b, x, 1, d, dtype=torch.bfloat16) for x in (h, hkv, hkv))
    k, v = torch.empty(b, hkv, s, d, dtype=torch.bfloat16), torch.empty(b, hkv, s, d, dtype=torch.bfloat16)
    mask, index = torch.ones(1, 1, 1, s, dtype=torch.bool), torch.zeros(1, dtype=torch.long)
    ws = torch.empty(A.workspace_elements(b, hkv, h // hkv, d))
    compiled = A.decode_attention_split_kernel.warmup(
        q, k, v, mask, ws, s, 0.125, *q.stride()[:3], 0, 0, mask.stride(2),
        KV_HEADS=hkv, G=h // hkv, LQ=1, D=d, BLOCK_M=16, BLOCK_D=64, BLOCK_N=A.BLOCK_N, HAS_MASK=True,
        MASK_BOOL=True, SPLITS=A.SPLITS, PRECISION="tf32", PDL=True, new_k_ptr=nk, new_v_ptr=nv, index_ptr=index,
        snk_b=0, snk_h=d, snk_l=d, snk_d=1, snv_b=0, snv_h=d, snv_l=d, snv_d=1, index_stride=1, NEW=1, NEW_BLOCK=2,
        grid=(b * hkv, A.SPLITS, 1))
    ptx = compiled.asm["ptx"]
    wait, first = ptx.find("griddepcontrol.wait"), ptx.find("mma.sync")
    loads = [m.start() for m in re.finditer(r"ld\.global", ptx)]
    assert 0 <= wait < first and len(loads) >= 4, (wait, first, loads)
    assert all(wait < at < first for at in loads), (wait, first, loads)
    assert wait < ptx.find("cp.async.cg.shared.global") < ptx.find("cp.async.wait_group") < first
