"""Note [Decode attention]: trident/kernels/attention.py against SDPA over random decode shapes,
and trident/passes/decode_attention.py rewriting Hugging Face's repeat_kv + SDPA (static and
symbolic captures, DynamicCache and StaticCache generate()) into its two launches, leaving
every other attention alone. On the CPU the kernels run through the interpreter
(TRIDENT_DECODE_ATTENTION="all")."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import trident
from trident import knobs
from trident.kernels import attention as A
from trident.kernels.attention import decode_attention, one_pass_block_n, one_pass_warps, one_pass_wide_block_n
from trident.runtime import SCMRuntime

_TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _repeat_kv(x, n):
    """transformers' repeat_kv, verbatim in effect: unsqueeze, expand, reshape (a clone)."""
    b, h, s, d = x.shape
    if n == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


def _hf_attention(q, k, v, mask):
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, _repeat_kv(k, g), _repeat_kv(v, g), attn_mask=mask, scale=0.125)


def _mask(kind, b, lq, s, dtype, g):
    if kind is None:
        return None
    keep = torch.rand(b, 1, lq, s, generator=g) > 0.3
    keep[..., 0] = True
    if kind == "bool":
        return keep
    return torch.where(keep, 0.0, float("-inf")).to(dtype)


def _case(seed, device, dtype):
    g = torch.Generator().manual_seed(seed)
    pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=g))]  # noqa: E731
    b, hkv, grp, lq = pick([1, 2]), pick([1, 2, 4]), pick([1, 2, 4]), pick([1, 1, 2, 5])
    s, d = int(torch.randint(1, 90, (1,), generator=g)), pick([16, 24, 64])
    q = torch.randn(b, hkv * grp, lq, d, generator=g, dtype=dtype)
    k = torch.randn(b, hkv, s, d, generator=g, dtype=dtype)
    v = torch.randn(b, hkv, s, d, generator=g, dtype=dtype)
    mask = _mask(pick([None, "bool", "float"]), b, lq, s, dtype, g)
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    return move(q), move(k), move(v), move(mask)


@pytest.mark.parametrize("seed", range(12))
def test_kernel_equals_sdpa_over_random_decode_shapes(seed, device):
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
    for dtype in dtypes:
        q, k, v, mask = _case(seed, device, dtype)
        g = q.shape[1] // k.shape[1]
        want = F.scaled_dot_product_attention(q.float(), _repeat_kv(k, g).float(), _repeat_kv(v, g).float(),
                                              attn_mask=None if mask is None else mask if mask.dtype == torch.bool
                                              else mask.float())
        wide = one_pass_wide_block_n(k.shape[2], k.shape[3], k.element_size(), q.shape[1] // k.shape[1] * q.shape[2])
        # the split and combine kernels; Note [One pass] in its blocks of keys and its wide variant's
        for one_pass, block_n in ((False, None), (True, None)) + (((True, wide),) if wide else ()):
            got = decode_attention(q, k, v, mask, one_pass=one_pass, block_n=block_n)
            torch.testing.assert_close(got.float(), want, rtol=_TOL[dtype], atol=_TOL[dtype] * 4)


def test_the_wide_one_pass_takes_up_to_256_keys_a_step_in_32_kb_tiles():
    """Note [One pass]: the wide variant's keys a step -- the cache's length rounded up to a power
    of two, at most 256, a key tile of at most 32 KB -- on 8 warps at 256 keys, and none where
    that is no wider than the one pass's own blocks or a head has more than 16 query rows."""
    assert one_pass_wide_block_n(512, 64, 2, 7) == 256  # Llama-1B's and Qwen2-0.5B's heads, bf16
    assert one_pass_warps(256) == 8 and one_pass_warps(128) == one_pass_warps(64) == 4
    assert one_pass_wide_block_n(100, 64, 2, 4) == 128
    assert one_pass_wide_block_n(512, 128, 2, 16) == 128  # 256-byte rows: 128 of them in 32 KB
    assert one_pass_wide_block_n(512, 80, 4, 1) == 64 and one_pass_block_n(80, 4) == 32  # 512-byte rows
    assert one_pass_wide_block_n(64, 64, 2, 4) is None and one_pass_wide_block_n(37, 64, 2, 4) is None
    assert one_pass_wide_block_n(4096, 256, 4, 4) is None  # 1 KB rows: no wider than the split form's 32
    assert one_pass_wide_block_n(512, 64, 2, 17) is None  # 32 query rows a head: no wide tiles
    with pytest.raises(ValueError, match="one_pass=True"):
        decode_attention(*(torch.zeros(1, 2, 1, 16) for _ in range(3)), block_n=128)


def test_the_wide_one_pass_over_several_wide_blocks_and_a_written_row():
    """The wide variant over a cache of several of its blocks (the last one partial), with a
    boolean mask and the step's row written at a counter that is bumped, as a StaticCache step
    runs it: SDPA's result over the written cache, the cache written, the counter bumped."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 8, 1, 16, generator=g)
    k, v = (torch.randn(1, 2, 300, 16, generator=g) for _ in range(2))
    new_k, new_v = (torch.randn(1, 2, 1, 16, generator=g) for _ in range(2))
    mask = torch.rand(1, 1, 1, 300, generator=g) > 0.3
    position = torch.tensor([271])
    want_k, want_v = k.clone(), v.clone()
    want_k[:, :, 271], want_v[:, :, 271] = new_k[:, :, 0], new_v[:, :, 0]
    want = F.scaled_dot_product_attention(q, _repeat_kv(want_k, 4), _repeat_kv(want_v, 4), attn_mask=mask)
    block_n = one_pass_wide_block_n(300, 16, 4, 4)
    assert block_n == 256
    got = decode_attention(q, k, v, mask, new=(new_k, new_v, position, True, 1), one_pass=True, block_n=block_n)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert torch.equal(k, want_k) and torch.equal(v, want_v) and position.item() == 272


@pytest.mark.parametrize("one_pass", [False, True])
def test_fully_masked_rows_give_zeros_not_nans(one_pass):
    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    out = decode_attention(q, k, v, torch.zeros(1, 1, 1, 9, dtype=torch.bool), one_pass=one_pass)
    assert torch.equal(out, torch.zeros_like(out))


def _launches(opt):
    names = []
    for rid in opt.meta["trident_regions"]:
        for step in SCMRuntime.get(rid).program.steps:
            names.append(getattr(step, "kernel_name", None) or getattr(step, "op_name", ""))
    return names


def _optimize(fn, *example, dynamic=False, mode="all"):
    with knobs.scope(decode_attention=mode):
        return trident.optimize(trident.capture(fn, *example, dynamic=dynamic))


@pytest.mark.parametrize("lq,faster", [(1, "last"), (1, "two"), (1, "one"), (3, "last"), (3, "one")])
def test_repeat_kv_and_sdpa_become_kernels(device, lq, faster):
    """GQA decode as HF writes it: the clones of the repeat and the SDPA call are gone, the
    kernels read the cache in place; results equal eager's. The form measured fastest is kept (a
    timer stands for the GPU): one launch where the split kernel's last program combines (4 query
    rows per kv head: Note [The last split combines]; for 12 rows that form is not timed), one
    launch of a program per kv head (Note [One pass]), or the split and combine kernels. On the
    GPU every form is timed for real: whichever is kept, explain() names it and the result is
    eager's."""
    from trident.passes import decode_attention as DA

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, lq, 64, generator=g).to(device)
    k, v = (torch.randn(1, 2, 37, 64, generator=g).to(device) for _ in range(2))
    mask = (torch.rand(1, 1, lq, 37, generator=g) > 0.2).to(device)
    timed = []
    named = {"last": DA._FUSED, "two": "kernel", "one": DA._ONE_PASS}
    us = {"sdpa": 10.0, "kernel": 2.0, DA._FUSED: 3.0, DA._ONE_PASS: 3.0, named[faster]: 1.0}

    def timer(name, shape):
        timed.append(name)
        return us[name]

    DA.set_timer(timer)
    try:
        opt = _optimize(_hf_attention, q, k, v, mask, mode="measured" if device == "cuda" else "all")
    finally:
        DA.set_timer(None)
    text = trident.explain(opt)
    if device == "cuda":
        form = next(f for f, how in DA._HOW.items() if f"Trident's flash-decoding kernel{how}" in text)
        assert form != DA._FUSED or lq == 1
    else:
        assert (DA._FUSED in timed) == (lq == 1) and DA._ONE_PASS in timed, timed
        form = "kernel" if faster == "last" and lq > 1 else named[faster]
    names = _launches(opt)
    assert names.count("decode_attention_split_kernel") == 1
    assert names.count("decode_attention_combine_kernel") == (1 if form == "kernel" else 0), names
    assert f"Trident's flash-decoding kernel{DA._HOW[form]}" in text, text
    assert not any("attention" in n and n.startswith("aten.") for n in names), names
    assert "aten.clone.default" not in names, names
    for _ in range(3):  # call after call (each call zeroes its counters)
        torch.testing.assert_close(opt(q, k, v, mask), _hf_attention(q, k, v, mask), rtol=2e-5, atol=2e-5)


def test_growing_cache_in_a_symbolic_capture(device):
    """A DynamicCache step: the new key and value concatenated to the past ones, whose length is
    a symbol; one capture serves every length (keys and values are separate inputs with
    separate symbols: the pass guards their equality), and a call whose keys and values differ
    in length is refused by the guard before anything runs."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 1, 16, generator=g).to(device)
    new_k, new_v = (torch.randn(1, 2, 1, 16, generator=g).to(device) for _ in range(2))

    def step(q, past_k, past_v, mask):
        return _hf_attention(q, torch.cat([past_k, new_k], 2), torch.cat([past_v, new_v], 2), mask)

    past = lambda s: torch.randn(1, 2, s, 16, generator=g).to(device)  # noqa: E731
    mask = lambda s: torch.rand(1, 1, 1, s + 1, generator=g).to(device) > 0.2  # noqa: E731
    with knobs.scope(decode_attention="all"):
        opt = trident.optimize(trident.capture(step, q, past(6), past(6), mask(6), dynamic=True, static_inputs=(0,)))
    assert opt.meta["trident_symbolic"] and "decode_attention_split_kernel" in _launches(opt)
    for s in (7, 8, 31, 64, 65):
        args = (q, past(s), past(s), mask(s))
        torch.testing.assert_close(opt(*args), step(*args), rtol=2e-5, atol=2e-5)
    with pytest.raises(trident.GuardError):
        opt(q, past(9), past(10), mask(9))


@pytest.mark.parametrize("change", ["causal", "dropout", "long_query", "off"])
def test_other_attentions_stay_sdpa(change):
    """Causal attention (its causality is not in a mask), dropout, more than 16 query tokens, or
    the knob off: the SDPA op stays."""
    q, k, v = torch.randn(1, 4, 20 if change == "long_query" else 1, 16), torch.randn(1, 4, 9, 16), torch.randn(1, 4, 9, 16)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=change == "causal",
                                              dropout_p=0.5 if change == "dropout" else 0.0)

    if change == "dropout":
        torch.manual_seed(0)
    opt = _optimize(f, q, k, v, mode="" if change == "off" else "all")
    assert "decode_attention_split_kernel" not in _launches(opt)


def _converted_mask_attention(q, k, v, keep):
    """SDPA's own handling of a boolean mask on CUDA's memory-efficient path (ATen's
    convert_boolean_attn_mask and preprocess_mask), written out: where(keep, 0, -inf), padded to a
    multiple of 8 keys and sliced back, expanded to [B, H, Lq, S]."""
    s = keep.shape[-1]
    bias = torch.where(keep, 0.0, float("-inf"))
    bias = F.pad(bias, (0, 8 - s % 8))[..., :s]
    return _hf_attention(q, k, v, bias.expand(q.shape[0], q.shape[1], q.shape[2], s))


@pytest.mark.parametrize("padded", [False, True])
def test_a_boolean_mask_is_read_as_given(padded):
    """Note [A boolean mask as given]: the where (and the padding) go, the kernel reads the boolean
    mask; results equal eager's, also where a masked-out key's score is +inf (eager's NaN)."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 1, 16, generator=g)
    k, v = torch.randn(1, 2, 37, 16, generator=g), torch.randn(1, 2, 37, 16, generator=g)
    keep = torch.rand(1, 1, 1, 37, generator=g) > 0.3
    keep[..., 0] = True
    fn = _converted_mask_attention if padded else (lambda q, k, v, keep: _hf_attention(
        q, k, v, torch.where(keep, 0.0, float("-inf"))))
    opt = _optimize(fn, q, k, v, keep)
    names = _launches(opt)
    assert not any(n.startswith(("aten.where", "aten.constant_pad_nd", "aten.slice", "aten.expand")) for n in names), names
    torch.testing.assert_close(opt(q, k, v, keep), fn(q, k, v, keep), rtol=2e-5, atol=2e-5)
    k_inf = k.clone()
    k_inf[:, :, int((~keep[0, 0, 0]).nonzero()[0])] = float("inf")
    assert fn(q, k_inf, v, keep).isnan().any() and opt(q, k_inf, v, keep).isnan().any()


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_hf_generate_uses_the_kernel_and_keeps_eager_tokens(cache, monkeypatch):
    """Tiny Llama (GQA: 4 query heads over 2 kv heads) through trident.compile: every decode
    capture's attention is the kernel pair; greedy tokens equal eager's."""
    pytest.importorskip("transformers")
    from tests.frontends.test_generate import _generate
    from tests.test_hf import _model

    _, model = _model("llama", "own", monkeypatch)
    with torch.no_grad():  # 6 new tokens: a DynamicCache gets its symbolic decode capture in the first generate()
        want = _generate(model, cache, new=6)
    with knobs.scope(decode_attention="all"):
        model.forward = trident.compile(model.forward)
        with torch.no_grad():
            for _ in range(2):
                assert torch.equal(_generate(model, cache, new=6), want)
    decode = [opt for opt in model.forward.captures.values() if "decode_attention_split_kernel" in _launches(opt)]
    assert decode, "no capture uses the decode attention kernel"
    for opt in decode:
        assert _launches(opt).count("decode_attention_split_kernel") == 2  # one per layer


def test_hf_generate_static_cache_in_one_pass(monkeypatch):
    """Tiny Llama through trident.compile with a StaticCache (transformers 5: the step's rows at
    the cache's cumulative length, bumped in place) where the one-pass form measures fastest (a
    timer stands for the GPU): each layer's attention is one launch that writes the rows and
    whose last program bumps the counter (Note [One pass]); greedy tokens equal eager's."""
    pytest.importorskip("transformers")
    from tests.frontends.test_generate import _generate
    from tests.test_hf import _model
    from trident.passes import decode_attention as DA

    _, model = _model("llama", "own", monkeypatch)
    with torch.no_grad():
        want = _generate(model, "static", new=6)
    DA.set_timer(lambda name, shape: 1.0 if name == DA._ONE_PASS else 2.0)
    try:
        with knobs.scope(decode_attention="all", triton_copies="all"):
            model.forward = trident.compile(model.forward)
            with torch.no_grad():
                for _ in range(2):
                    assert torch.equal(_generate(model, "static", new=6), want)
    finally:
        DA.set_timer(None)
    decode = [opt for opt in model.forward.captures.values() if "decode_attention_split_kernel" in _launches(opt)]
    assert decode, "no capture uses the decode attention kernel"
    for opt in decode:
        names = _launches(opt)
        assert names.count("decode_attention_split_kernel") == 2, names  # one per layer
        assert "decode_attention_combine_kernel" not in names and "cache_write_kernel" not in names, names
        assert not any("index_copy" in n for n in names), names  # the rows written by the attention


def test_the_wide_one_pass_is_kept_where_measured_fastest():
    """A StaticCache-long key length (150 positions) where the one pass's wide variant measures
    fastest (a timer stands for the GPU): one launch of a program per kv head in blocks of 128
    keys (fp32, head size 64: 32 KB tiles), no combine; explain() names it; SDPA's result."""
    from trident.passes import decode_attention as DA

    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 8, 1, 64, generator=g)
    k, v = (torch.randn(1, 2, 150, 64, generator=g) for _ in range(2))
    mask = torch.rand(1, 1, 1, 150, generator=g) > 0.2
    timed = []
    DA.set_timer(lambda name, shape: timed.append(name) or (1.0 if name == DA._ONE_PASS_WIDE else 2.0))
    try:
        opt = _optimize(_hf_attention, q, k, v, mask)
    finally:
        DA.set_timer(None)
    assert set(timed) == {"sdpa", *DA._FORMS}, timed
    text = trident.explain(opt)
    assert f"Trident's flash-decoding kernel{DA._HOW[DA._ONE_PASS_WIDE]}" in text, text
    steps = [s for rid in opt.meta["trident_regions"] for s in SCMRuntime.get(rid).program.steps
             if getattr(s, "kernel_name", None) == "decode_attention_split_kernel"]
    assert [(s.grid, s.args["BLOCK_N"], s.args["DIRECT"]) for s in steps] == [((2, 1, 1), 128, True)], steps
    assert "decode_attention_combine_kernel" not in _launches(opt)
    for _ in range(2):
        torch.testing.assert_close(opt(q, k, v, mask), _hf_attention(q, k, v, mask), rtol=2e-5, atol=2e-5)


def _gqa_case():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, 1, 64, generator=g)
    k, v = (torch.randn(1, 2, 37, 64, generator=g) for _ in range(2))
    mask = torch.rand(1, 1, 1, 37, generator=g) > 0.2
    return q, k, v, mask


@pytest.mark.parametrize("faster", ["sdpa", "kernel"])
def test_the_faster_measured_path_is_kept(faster, tmp_path):
    """Note [Decode attention by measurement]: with a static key length the rewrite is made only
    where the kernel is not measurably slower than the traced repeat + SDPA (a timer stands for
    the GPU here); explain() lists the choice and the times; the choice is kept in
    TRIDENT_CACHE_DIR and a later process (the memo cleared) takes it without measuring."""
    from trident.passes import decode_attention as DA

    q, k, v, mask = _gqa_case()
    DA.set_timer(lambda name, shape: 1.0 if name == faster else 2.0)
    try:
        with knobs.scope(cache_dir=str(tmp_path)):
            for source in ("", ", from TRIDENT_CACHE_DIR"):
                opt = _optimize(_hf_attention, q, k, v, mask)
                names = _launches(opt)
                assert ("decode_attention_split_kernel" in names) == (faster == "kernel"), names
                text = trident.explain(opt)
                what = "Trident's flash-decoding kernel" if faster == "kernel" else "as traced"
                assert "decode attention:" in text and what in text and f"[measured{source}: " in text, text
                torch.testing.assert_close(opt(q, k, v, mask), _hf_attention(q, k, v, mask), rtol=2e-5, atol=2e-5)
                DA.set_timer(lambda *a: pytest.fail("measured again"))  # also clears the memo
    finally:
        DA.set_timer(None)


def test_without_a_timer_or_gpu_nothing_is_measured_and_the_kernel_is_taken():
    q, k, v, mask = _gqa_case()
    opt = _optimize(_hf_attention, q, k, v, mask)
    names = _launches(opt)  # the two launches: the faster form where it was measured
    assert "decode_attention_split_kernel" in names and "decode_attention_combine_kernel" in names, names
    assert "decode attention:" not in trident.explain(opt)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the device machine)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_static_length_is_measured_on_cuda(dtype):
    """On the GPU SDPA and every form of the kernel are timed in CUDA graphs; whichever is kept,
    the result is SDPA's."""
    from trident.passes import decode_attention as DA

    q, k, v, mask = (t.cuda() for t in _gqa_case())
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    opt = _optimize(_hf_attention, q, k, v, mask, mode="measured")
    text = trident.explain(opt)
    assert "decode attention:" in text and "[measured: " in text, text
    forms = [f for f in DA._FORMS if f != DA._ONE_PASS_WIDE]  # 37 keys: no wider blocks than one pass's own
    assert all(f"{name} " in text for name in ("sdpa", *forms)) and DA._ONE_PASS_WIDE not in text, text
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=2e-5, atol=2e-5)
    for _ in range(3):
        torch.testing.assert_close(opt(q, k, v, mask), _hf_attention(q, k, v, mask), **tol)


def test_the_last_split_combines_after_its_count_on_sm90():
    """Note [The last split combines] in the sm_90 PTX: the pieces are stored, the CTA
    synchronizes, one acquire-release atomic at GPU scope counts the arrival, and the combining
    program reads the pieces through L2 (ld.global.cg) after it."""
    f, i32 = torch.zeros(1 << 16), torch.zeros(64, dtype=torch.int32)
    compiled = A.decode_attention_split_kernel.warmup(
        f, f, f, f, f, 37, 0.125, 512, 64, 64, 0, 0, 0,
        KV_HEADS=2, G=4, LQ=1, D=64, BLOCK_M=16, BLOCK_D=64, BLOCK_N=32, HAS_MASK=False, MASK_BOOL=False,
        SPLITS=16, PRECISION="ieee", out_ptr=f, count_ptr=i32, so_b=512, so_h=64, so_l=64, count_offset=0,
        COMBINE=True, grid=(1, 1, 1))
    ptx = compiled.asm["ptx"]
    atom = ptx.find("atom.global.gpu.acq_rel.add")
    assert atom >= 0 and ptx.count("atom.") == 1, ptx
    store, barrier = ptx.rfind("st.global", 0, atom), ptx.rfind("bar.sync", 0, atom)
    assert 0 <= store < barrier < atom, (store, barrier, atom)
    assert "ld.global.cg" in ptx[atom:] and "ld.global.cg" not in ptx[:atom]
    # every row of the head combined in one round of loads: every piece's load comes before the
    # combine's first exponential (and so before any store)
    combine = ptx[atom:]
    assert 0 <= combine.rfind("ld.global.cg") < combine.find("ex2.approx"), "a combine load after its arithmetic"


@pytest.mark.cuda
def test_the_last_split_combines_call_after_call_cuda():
    """Note [The last split combines] on the GPU: 300 calls sharing one counter buffer, two
    inputs in turn (the workspace a call reuses holds the other input's pieces: a piece read
    before it was written, or a lost count, would differ), each bit for bit its input's first
    result, the counters back at 0; and the two-kernel form (more rows than COMBINE_ROWS)
    agrees with SDPA."""
    g = torch.Generator(device="cuda").manual_seed(3)
    inputs = [(torch.randn(2, 32, 1, 64, device="cuda", generator=g).bfloat16(),
               *(torch.randn(2, 8, 300, 64, device="cuda", generator=g).bfloat16() for _ in range(2)))
              for _ in range(2)]
    counts = torch.zeros(2 * 8, dtype=torch.int32, device="cuda")
    wants = [decode_attention(q, k, v, None, None, counts) for q, k, v in inputs]
    assert not torch.equal(wants[0], wants[1])
    for i in range(300):
        q, k, v = inputs[i % 2]
        assert torch.equal(decode_attention(q, k, v, None, None, counts), wants[i % 2]), i
    assert not counts.any()
    q, k, v = inputs[0]
    want = wants[0]
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
    torch.testing.assert_close(want, ref, rtol=2e-2, atol=2e-2)
    q3 = torch.randn(2, 32, 3, 64, device="cuda", generator=g).bfloat16()  # 12 rows per kv head
    ref3 = F.scaled_dot_product_attention(q3, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
    torch.testing.assert_close(decode_attention(q3, k, v), ref3, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("head_dim", [128, 256])
def test_the_last_split_combines_large_heads_in_tiles(head_dim):
    """Note [The last split combines] for heads of more than 64 (the pieces in tiles of CHUNK
    splits, `_combine_rows`): SDPA's result, with a boolean mask that empties some splits."""
    g = torch.Generator().manual_seed(head_dim)
    q = torch.randn(1, 8, 1, head_dim, generator=g)
    k, v = (torch.randn(1, 2, 70, head_dim, generator=g) for _ in range(2))
    mask = torch.ones(1, 1, 1, 70, dtype=torch.bool)
    mask[..., 20:45] = False
    want = F.scaled_dot_product_attention(q, _repeat_kv(k, 4), _repeat_kv(v, 4), attn_mask=mask)
    torch.testing.assert_close(decode_attention(q, k, v, mask, combine=True), want, rtol=2e-5, atol=2e-5)
