"""Decode attention with grouped key/value heads (Note [Decode attention]): a few query tokens
against a key/value cache, each key/value head read once for the query heads that share it, the
cache split over programs (flash-decoding) and the pieces combined by a second kernel.

    decode_attention_split_kernel  grid (batch * kv_heads, SPLITS): program (bh, s) attends the
                                   G * Lq query rows of kv head bh to keys [s * chunk, (s+1) * chunk)
                                   and writes its running max, sum and unnormalized output
    decode_attention_combine_kernel grid (batch * kv_heads, G * Lq): rescales and sums the SPLITS
                                   pieces of one query row (for up to COMBINE_ROWS rows the split
                                   kernel's last program does this instead: Note [The last split
                                   combines])
    one pass (DIRECT)              the split kernel on grid (batch * kv_heads, 1): each program reads
                                   every key of its head and writes the output itself (Note [One pass])

Note [One pass]
~~~~~~~~~~~~~~~
Split and combine are two kernels and a kernel boundary per layer; at a short static cache (a
StaticCache of a few hundred positions) the split kernel's programs read one block of keys each,
so the step pays the launch chain, not the reading. With DIRECT the split kernel runs SPLITS = 1
(one program per batch row and key/value head) over ONE_PASS_BLOCK_N keys a step, Triton's
pipelined loop keeping the next blocks' loads in flight, and normalizes and writes its rows
itself: one launch, no workspace. Fewer programs read more keys each, so it wins
only where the cache is short; Note [Decode attention by measurement] times it beside the two
launches and the last split combining, per shape, and keeps the fastest. A write of the step's
rows (NEW) is the program's own (its range is the whole cache). A counter's bump (INCREMENT: a
transformers 5 StaticCache's cumulative length) must follow every program's read of the
counter, and there is no second kernel: each program counts its arrival after its stores (the
CTA synchronized first, one acquire-release atomic at GPU scope in `count[count_offset]`, as
Note [The last split combines] counts), and the last to arrive bumps the counter and puts the
count back to 0 -- one atomic round trip at the end of each program. The measurement times
every form with a bump (of 0, on a counter of its own), as a StaticCache step runs them. Large
heads take the split form's BLOCK_N (`one_pass_block_n`: its pipelined tiles then fit in shared
memory wherever the split form's do).

A program's key blocks follow one another (each step's product, maxima, exponentials and sums
wait for the last), so the one pass costs about a step's latency per block, whatever the block
holds: on the H100 (6ae6098) one pass over a 512-position StaticCache in blocks of 64 keys took
8.0-8.1 us against 4.1-4.3 us for split + combine (Qwen2-0.5B's and Llama-1B's heads). Its wide variant
(`one_pass_wide_block_n`) takes up to ONE_PASS_WIDE_N keys a step, a key or value tile of at most
ONE_PASS_WIDE_TILE bytes, where a head has at most 16 query rows (decode): four times fewer steps
at a 512-position cache, on 8 warps at 256 keys (`one_pass_warps`: on 4, ptxas spills there).
On sm_90 its pipelined tiles take 178 KB of shared memory at Llama's and Qwen2's heads (bf16,
head size 64, a boolean mask; the H100's bound is 227 KB); a shape whose tiles would not fit
fails to launch and the measurement leaves that form out (each form is timed in a try of its
own). The measurement times it as a form of its own where it is wider than `one_pass_block_n`.

Note [The last split combines]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The combine is a kernel and a kernel boundary per layer (~1.5 us of an H200 each, 16 per
Llama-1B step: results/bench_hf_llama_liger_c73d461.json). With COMBINE the split kernel's
programs of a kv head count their arrivals as the GEMV's do (Note [The last program reduces] in
gemv.py): each stores its piece, the CTA synchronizes, one acquire-release atomic at GPU scope
counts it in `count[count_offset + bh]`, and the program that sees SPLITS - 1 arrivals before
its own combines every query row of the head (the combine kernel's code per row, the pieces read
through L2) and puts the counter back to 0. The counters are int32 zeros allocated once per call
for every attention of a graph (trident/passes/common.py `call_counters`, shared with the GEMVs' counters). Used where the head has at most
COMBINE_ROWS query rows (G * Lq: decode with grouped heads); more rows (a prefill, speculative
verification) keep the combine kernel, whose programs share them. Where the pass measures
(Note [Decode attention by measurement]) it times this form beside the others and keeps the
fastest: on the H200
the combining form was the slower in Llama-1B's decode (7.2 us a layer against 3.3 + 1.5 us for
the two launches, results/bench_hf_llama_c26d638.json), the one last program's serial combine
costing more than the kernel boundary it saves; so on the H100 at 852c0e7 (6.86 / 8.95 us for
Llama's 4 / Qwen2's 7 rows a head against 4.26 / 4.01 for split + combine): each row's loads
waited for the store of the row before. The last program now combines every row of its head at
once (`_combine_rows`: for heads of at most 64 one round of loads -- the pieces' maxima, sums and
outputs as [SPLITS, COMBINE_ROWS(, BLOCK_D)] tiles -- then the arithmetic and one store; larger
heads in tiles of fewer pieces; sm_90 code checked in tests/passes/test_decode_attention.py, no
spills at heads of 32-256); NOT yet measured on a GPU.

Note [The cache write inside the attention]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A StaticCache decode step writes the step's key and value rows into the cache (one launch of
cache_write_kernel per layer after trident/passes/fuse_cache_writes.py) and then attends over the
cache: a launch and a kernel boundary per layer (~1.5 us of an H200 for the write, 24 of them in
Qwen2-0.5B's step). With NEW > 0 the split kernel does the write itself
(trident/passes/fuse_cache_attention.py makes it so): the new rows' positions are index[j]
(or base + j, base the counter's value, with INDEX_OFFSET), j < NEW; the program whose key range
[split * chunk, (split + 1) * chunk) holds a position stores that row of new_k / new_v into the
cache (of rows with one position the last, as index_copy_ leaves it), and every program takes
such a key from new_k / new_v, not from the cache (for one new row the one program whose range
holds it loads the cache's stale row with its block and replaces it in registers: Note [One
round of loads]), so no program uses a row another writes in the same launch. The counter's
bump (counter += increment) moves to the combine kernel, which runs after every split program
has read the counter (in one pass, to the last program to arrive: Note [One pass]). Positions
outside [0, S) are written nowhere, as cache_write_kernel does.

Note [One round of loads]
~~~~~~~~~~~~~~~~~~~~~~~~~
A decode step's attention is latency-bound: a program reads a few KB, so each load that waits for
another before it can be issued adds a memory round trip (~0.5-1 us) to the step. After the
wait for the kernel before it (PDL) the split kernel issues every load of a key block at once:
q, the keys and values (cp.async, Triton's pipelined loop), the mask's row, and in a single-row
write (NEW == 1, decode) the new row and its position -- the cache's rows are read unmasked and
the fresh one replaced in registers (`tl.where`), so no key load waits for the position. Before,
the mask's loads were issued after the scores' product and the key loads after the position's
(four round trips; the sm_90 code is checked in tests/passes/test_fuse_cache_attention.py). More
new rows (speculative verification) keep the position-dependent loads: which row a key takes
needs the positions first.

Layouts: q [B, H, Lq, D] and out [B, H, Lq, D] with any strides; k and v [B, Hkv, S, D]
contiguous (a DynamicCache's concatenation, a StaticCache's buffers); new_k and new_v
[B, Hkv, NEW, D] with any strides; the mask, when given,
[*, *, Lq, S] with unit stride over S, boolean (True: attend) or additive floating point.
Numerics as SDPA's fused kernels: scores and softmax in fp32, the output rounded once.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

SPLITS = 16  # programs per kv head over the cache (fixed: the workspace has a static size)
BLOCK_N = 32  # keys per step
ONE_PASS_BLOCK_N = 64  # keys per step of the one-pass form (Note [One pass]) for heads of at most 256 bytes
COMBINE_ROWS = 8  # query rows per kv head the split kernel's last program combines at most
_COMBINE_ROWS: tl.constexpr = tl.constexpr(COMBINE_ROWS)  # the same, as the kernels read it
ONE_PASS_WIDE_N = 256  # keys per step of the one-pass form's wide variant at most (Note [One pass])
ONE_PASS_WIDE_TILE = 32 << 10  # bytes of one key or value tile of the wide variant at most


def one_pass_block_n(head_dim: int, itemsize: int) -> int:
    """BLOCK_N of the one-pass form (Note [One pass]): ONE_PASS_BLOCK_N keys a step where a key
    row (padded to a power of two) takes at most 256 bytes, else the split form's BLOCK_N."""
    return ONE_PASS_BLOCK_N if triton.next_power_of_2(head_dim) * itemsize <= 256 else BLOCK_N


def one_pass_wide_block_n(length: int, head_dim: int, itemsize: int, rows: int) -> Optional[int]:
    """BLOCK_N of the one-pass form's wide variant (Note [One pass]) over a cache of `length`
    positions for heads of `rows` query rows (G * Lq): the most keys a step of at most
    ONE_PASS_WIDE_N, the cache's length rounded up to a power of two, and ONE_PASS_WIDE_TILE bytes
    a tile; None where that is no wider than `one_pass_block_n` or a head has more than 16 query
    rows (then there is no wide variant)."""
    row = triton.next_power_of_2(head_dim) * itemsize
    n = min(ONE_PASS_WIDE_N, triton.next_power_of_2(max(1, length)), ONE_PASS_WIDE_TILE // row)
    return n if n > one_pass_block_n(head_dim, itemsize) and block_m(rows) == 16 else None


def one_pass_warps(block_n: int) -> int:
    """num_warps of a one-pass launch of `block_n` keys a step: 8 from 256 keys (on 4 warps the
    score and probability tiles spill registers there: ptxas, sm_90), else Triton's 4."""
    return 8 if block_n >= 256 else 4


def combines_in_split(rows: int) -> bool:
    """Note [The last split combines]: whether a head of `rows` query rows (G * Lq) is combined by
    the split kernel's last program."""
    return rows <= COMBINE_ROWS


@triton.jit
def _combine_row(ws_ptr, out_ptr, bh, row, so_b, so_h, so_l,
                 KV_HEADS: tl.constexpr, G: tl.constexpr, LQ: tl.constexpr, D: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr):
    """The combine kernel's program: rescale and sum the SPLITS pieces of query row `row` of kv
    head `bh`, all loaded at once; write the row of out. PDL: release the dependents after the
    loads (Note [Programmatic dependent launch])."""
    b = bh // KV_HEADS
    kvh = bh % KV_HEADS
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, BLOCK_D)
    base = (bh * SPLITS + s) * (BLOCK_M * (BLOCK_D + 2))  # [SPLITS]
    m = tl.load(ws_ptr + base + row)
    sums = tl.load(ws_ptr + base + BLOCK_M + row)
    acc = tl.load(ws_ptr + base[:, None] + 2 * BLOCK_M + row * BLOCK_D + d[None, :])
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    m_max = tl.max(m, 0)
    # a row whose every key is masked keeps m = -inf in every piece: weights exp(-inf) = 0, never NaN
    w = tl.exp(m - tl.where(m_max == float("-inf"), 0.0, m_max))
    total = tl.sum(w * sums, 0)
    out = tl.sum(w[:, None] * acc, 0) / tl.where(total == 0.0, 1.0, total)
    head = kvh * G + row // LQ
    pos = row % LQ
    tl.store(out_ptr + b * so_b + head * so_h + pos * so_l + d, out.to(out_ptr.dtype.element_ty), mask=d < D)


@triton.jit
def _combine_rows(ws_ptr, out_ptr, bh, so_b, so_h, so_l,
                  KV_HEADS: tl.constexpr, G: tl.constexpr, LQ: tl.constexpr, D: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr):
    """Every query row of kv head `bh` at once (Note [The last split combines]): the pieces of
    COMBINE_ROWS rows (a head combined here has at most that many) as [pieces, rows, BLOCK_D]
    tiles of at most 8192 elements, CHUNK pieces a tile, every load issued before the one store
    (through L2: '.cg'), so the rows cost one round of loads (heads of at most 64: one tile), or
    one after the maxima's per tile, not one each (a row's loads waited for the store of the row before: 0.65-0.8 us a row on the H100, 6.86
    / 8.95 us a layer for 4 / 7 rows, results/bench_hf_liger_852c0e7.json). Rows beyond G * LQ
    are summed like the others and not stored."""
    CHUNK: tl.constexpr = SPLITS if SPLITS * _COMBINE_ROWS * BLOCK_D <= 8192 else 8192 // (_COMBINE_ROWS * BLOCK_D)
    b = bh // KV_HEADS
    kvh = bh % KV_HEADS
    s = tl.arange(0, SPLITS)
    c = tl.arange(0, CHUNK)
    r = tl.arange(0, _COMBINE_ROWS)
    d = tl.arange(0, BLOCK_D)
    piece = BLOCK_M * (BLOCK_D + 2)
    base = (bh * SPLITS + s) * piece  # [SPLITS]
    if CHUNK == SPLITS:  # one tile: every load first, then the arithmetic (one round of loads)
        m = tl.load(ws_ptr + base[:, None] + r[None, :], cache_modifier=".cg")  # [SPLITS, COMBINE_ROWS]
        sums = tl.load(ws_ptr + base[:, None] + BLOCK_M + r[None, :], cache_modifier=".cg")
        acc = tl.load(ws_ptr + base[:, None, None] + 2 * BLOCK_M + r[None, :, None] * BLOCK_D + d[None, None, :],
                      cache_modifier=".cg")  # [SPLITS, COMBINE_ROWS, BLOCK_D]
        m_max = tl.max(m, 0)
        # a row whose every key is masked keeps m = -inf in every piece: weights exp(-inf) = 0, never NaN
        w = tl.exp(m - tl.where(m_max == float("-inf"), 0.0, m_max)[None, :])
        total = tl.sum(w * sums, 0)
        out = tl.sum(w[:, :, None] * acc, 0)
    else:  # CHUNK pieces a tile: a round of loads per tile after the maxima's
        m_max = tl.max(tl.load(ws_ptr + base[:, None] + r[None, :], cache_modifier=".cg"), 0)
        m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
        total = tl.zeros([_COMBINE_ROWS], tl.float32)
        out = tl.zeros([_COMBINE_ROWS, BLOCK_D], tl.float32)
        for k in tl.static_range(0, SPLITS, CHUNK):
            at = (bh * SPLITS + k + c) * piece  # [CHUNK]
            w = tl.exp(tl.load(ws_ptr + at[:, None] + r[None, :], cache_modifier=".cg") - m_max[None, :])
            total += tl.sum(w * tl.load(ws_ptr + at[:, None] + BLOCK_M + r[None, :], cache_modifier=".cg"), 0)
            acc = tl.load(ws_ptr + at[:, None, None] + 2 * BLOCK_M + r[None, :, None] * BLOCK_D + d[None, None, :],
                          cache_modifier=".cg")  # [CHUNK, COMBINE_ROWS, BLOCK_D]
            out += tl.sum(w[:, :, None] * acc, 0)
    out = out / tl.where(total == 0.0, 1.0, total)[:, None]
    head = kvh * G + r // LQ
    pos = r % LQ
    tl.store(out_ptr + b * so_b + head[:, None] * so_h + pos[:, None] * so_l + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=(r < G * LQ)[:, None] & (d < D)[None, :])


# count_offset differs per layer: not specialized (one compiled kernel for every layer)
@triton.jit(do_not_specialize=["count_offset"])
def decode_attention_split_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, ws_ptr,
    S, scale,
    sq_b, sq_h, sq_l,
    sm_b, sm_h, sm_l,
    KV_HEADS: tl.constexpr, G: tl.constexpr, LQ: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, SPLITS: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr = False,
    out_ptr=None, count_ptr=None, so_b=0, so_h=0, so_l=0, count_offset=0,
    COMBINE: tl.constexpr = False,
    new_k_ptr=None, new_v_ptr=None, index_ptr=None,
    snk_b=0, snk_h=0, snk_l=0, snk_d=0, snv_b=0, snv_h=0, snv_l=0, snv_d=0, index_stride=0,
    NEW: tl.constexpr = 0, NEW_BLOCK: tl.constexpr = 2, INDEX_OFFSET: tl.constexpr = False,
    WRAP_NEGATIVE: tl.constexpr = False,
    DIRECT: tl.constexpr = False,
    counter_ptr=None, increment=0, INCREMENT: tl.constexpr = False,
):
    if PDL:  # Note [Programmatic dependent launch]
        tl.extra.cuda.gdc_wait()
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // KV_HEADS
    kvh = bh % KV_HEADS
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < G * LQ
    head = kvh * G + rows // LQ
    pos = rows % LQ
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(q_ptr + b * sq_b + head[:, None] * sq_h + pos[:, None] * sq_l + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    kv_base = (b * KV_HEADS + kvh).to(tl.int64) * S * D
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    chunk = tl.cdiv(S, SPLITS)
    start = split * chunk
    if DIRECT and INCREMENT:  # the counter as every program reads it, for the last one's bump (Note [One pass])
        count = tl.load(counter_ptr)
    if NEW == 1:  # Note [One round of loads]: the new row and its position, neither waiting for the other
        new_pos1 = tl.load(index_ptr).to(tl.int64)
        if WRAP_NEGATIVE:
            new_pos1 = tl.where(new_pos1 < 0, new_pos1 + S, new_pos1)
        new_pos1 = tl.where((new_pos1 >= 0) & (new_pos1 < S), new_pos1, -1)  # -1: written nowhere, read nowhere
        kn1 = tl.load(new_k_ptr + b * snk_b + kvh * snk_h + d * snk_d, mask=d_ok, other=0.0)
        vn1 = tl.load(new_v_ptr + b * snv_b + kvh * snv_h + d * snv_d, mask=d_ok, other=0.0)
    elif NEW > 0:  # Note [The cache write inside the attention]
        j = tl.arange(0, NEW_BLOCK)
        j_ok = j < NEW
        if INDEX_OFFSET:
            new_pos = tl.load(index_ptr).to(tl.int64) + j
        else:
            new_pos = tl.load(index_ptr + j * index_stride, mask=j_ok, other=-1).to(tl.int64)
        if WRAP_NEGATIVE:
            new_pos = tl.where(new_pos < 0, new_pos + S, new_pos)
        new_pos = tl.where(j_ok & (new_pos >= 0) & (new_pos < S), new_pos, -1)  # -1: written nowhere, read nowhere
    for i in tl.range(0, chunk, BLOCK_N):
        n = start + i + tl.arange(0, BLOCK_N)
        n_ok = (n < start + chunk) & (n < S)
        kv_off = kv_base + n[:, None].to(tl.int64) * D + d[None, :]
        if HAS_MASK:  # issued with the key loads, not after their product (Note [One round of loads])
            m_off = b * sm_b + head[:, None] * sm_h + pos[:, None] * sm_l + n[None, :]
            mv = tl.load(mask_ptr + m_off, mask=row_ok[:, None] & n_ok[None, :], other=0)
        if NEW == 1:
            fresh1 = (n.to(tl.int64) == new_pos1) & n_ok
            k = tl.load(k_ptr + kv_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            k = tl.where(fresh1[:, None], kn1[None, :], k)
        elif NEW > 0:
            # the row j a key takes from new_k / new_v (the last j of its position), -1: the cache's
            sel = tl.max(tl.where(n[:, None].to(tl.int64) == new_pos[None, :], j[None, :], -1), 1)
            fresh = (sel >= 0) & n_ok
            kn_off = b * snk_b + kvh * snk_h + sel[:, None] * snk_l + d[None, :] * snk_d
            vn_off = b * snv_b + kvh * snv_h + sel[:, None] * snv_l + d[None, :] * snv_d
            k = tl.load(k_ptr + kv_off, mask=n_ok[:, None] & d_ok[None, :] & ~fresh[:, None], other=0.0)
            k = tl.where(fresh[:, None], tl.load(new_k_ptr + kn_off, mask=fresh[:, None] & d_ok[None, :], other=0.0), k)
        else:
            k = tl.load(k_ptr + kv_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * scale
        if HAS_MASK:
            if MASK_BOOL:  # what adding SDPA's 0 / -inf gives, also for a score of +inf or NaN
                s = tl.where(mv != 0, s, s + float("-inf"))
            else:
                s = s + mv.to(tl.float32)
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # rows with every key masked so far keep m = -inf: exp of (-inf) - 0 is 0, never NaN
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if NEW == 1:
            v = tl.load(v_ptr + kv_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            v = tl.where(fresh1[:, None], vn1[None, :], v)
        elif NEW > 0:
            v = tl.load(v_ptr + kv_off, mask=n_ok[:, None] & d_ok[None, :] & ~fresh[:, None], other=0.0)
            v = tl.where(fresh[:, None], tl.load(new_v_ptr + vn_off, mask=fresh[:, None] & d_ok[None, :], other=0.0), v)
        else:
            v = tl.load(v_ptr + kv_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION).to(tl.float32)
        m_i = m_new
    if NEW == 1:  # the row this program's key range holds, from the registers it was read into
        w_ok = (new_pos1 >= start) & (new_pos1 < start + chunk) & d_ok
        w_off = kv_base + tl.where(new_pos1 >= 0, new_pos1, 0) * D + d
        tl.store(k_ptr + w_off, kn1, mask=w_ok)
        tl.store(v_ptr + w_off, vn1, mask=w_ok)
    elif NEW > 0:
        # this program's positions get their rows; of rows with one position only the last
        later = (new_pos[:, None] == new_pos[None, :]) & (j[None, :] > j[:, None])
        mine = (new_pos >= start) & (new_pos < start + chunk) & (tl.max(later.to(tl.int32), 1) == 0)
        w_off = kv_base + tl.where(mine, new_pos, 0)[:, None] * D + d[None, :]
        w_ok = mine[:, None] & d_ok[None, :]
        kn = tl.load(new_k_ptr + b * snk_b + kvh * snk_h + j[:, None] * snk_l + d[None, :] * snk_d, mask=w_ok)
        vn = tl.load(new_v_ptr + b * snv_b + kvh * snv_h + j[:, None] * snv_l + d[None, :] * snv_d, mask=w_ok)
        tl.store(k_ptr + w_off, kn, mask=w_ok)
        tl.store(v_ptr + w_off, vn, mask=w_ok)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    if DIRECT:  # Note [One pass]: the one piece normalized and written (what combining one split gives)
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_off = b * so_b + head[:, None] * so_h + pos[:, None] * so_l + d[None, :]
        tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        if INCREMENT:  # the counter bumped by the last program to arrive: every program has read it
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + count_offset, 1, sem="acq_rel", scope="gpu")
            if arrived == tl.num_programs(0) * tl.num_programs(1) - 1:
                tl.store(counter_ptr, (count + increment).to(counter_ptr.dtype.element_ty))
                tl.store(count_ptr + count_offset, 0)
    else:
        # workspace per (bh, split): BLOCK_M maxima, BLOCK_M sums, BLOCK_M x BLOCK_D outputs (fp32)
        base = (bh * SPLITS + split) * (BLOCK_M * (BLOCK_D + 2))
        tl.store(ws_ptr + base + rows, m_i)
        tl.store(ws_ptr + base + BLOCK_M + rows, l_i)
        tl.store(ws_ptr + base + 2 * BLOCK_M + rows[:, None] * BLOCK_D + d[None, :], acc)
        if COMBINE:  # Note [The last split combines]
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + count_offset + bh, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLITS - 1:
                _combine_rows(ws_ptr, out_ptr, bh, so_b, so_h, so_l, KV_HEADS, G, LQ, D, BLOCK_M, BLOCK_D, SPLITS)
                tl.store(count_ptr + count_offset + bh, 0)


@triton.jit
def decode_attention_combine_kernel(
    ws_ptr, out_ptr,
    so_b, so_h, so_l,
    KV_HEADS: tl.constexpr, G: tl.constexpr, LQ: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr,
    PDL: tl.constexpr = False,
    counter_ptr=None, increment=0, INCREMENT: tl.constexpr = False,
):
    # program (bh, row): one query row of kv head bh, its SPLITS pieces loaded at once (one round
    # of loads, not SPLITS dependent ones: 8 programs walking 16 pieces each took ~5.7 us per
    # layer on the H200, results/bench_hf_llama_liger_e3252af.json)
    if PDL:
        tl.extra.cuda.gdc_wait()
    if INCREMENT:  # read with the pieces, not after them (Note [One round of loads]); by the bumping program
        count = tl.load(counter_ptr, mask=(tl.program_id(0) == 0) & (tl.program_id(1) == 0), other=0)
    _combine_row(ws_ptr, out_ptr, tl.program_id(0), tl.program_id(1), so_b, so_h, so_l,
                 KV_HEADS, G, LQ, D, BLOCK_M, BLOCK_D, SPLITS, PDL)
    if INCREMENT:  # the cache write's counter bump (Note [The cache write inside the attention])
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(counter_ptr, (count + increment).to(counter_ptr.dtype.element_ty))


def combine_grid(batch: int, kv_heads: int, rows: int) -> tuple:
    """The combine kernel's grid: a program per (batch, kv head) and query row (G * Lq rows)."""
    return (batch * kv_heads, rows, 1)


def dot_precision(dtype) -> str:
    """fp32 inputs multiply exactly ("ieee": SDPA's fp32 kernels do not round to tf32); half
    types take the tensor cores' only mode."""
    return "ieee" if dtype == torch.float32 else "tf32"


def block_m(rows: int) -> int:
    """Query rows per program, padded for tl.dot (at least 16)."""
    return max(16, triton.next_power_of_2(rows))


def new_block(rows: int) -> int:
    """The split kernel's NEW_BLOCK for `rows` new cache rows (a power of two, at least 2)."""
    return max(2, triton.next_power_of_2(rows))


def workspace_elements(batch: int, kv_heads: int, rows: int, head_dim: int) -> int:
    """fp32 elements of the split kernel's workspace."""
    return batch * kv_heads * SPLITS * block_m(rows) * (triton.next_power_of_2(head_dim) + 2)


def decode_attention(q, k, v, mask=None, scale=None, counts=None, combine=None, new=None, one_pass=False,
                     counter=None, block_n=None):
    """Eager entry (tests, benchmarks): out[B, H, Lq, D] of softmax(q k^T * scale + mask) v with
    k, v [B, Hkv, S, D] contiguous shared by H / Hkv query heads each; the launches the pass
    emits. `combine`: whether the split kernel's last program combines (Note [The last split
    combines]; None: where the head has at most COMBINE_ROWS query rows; False: the combine
    kernel). `counts`: B * Hkv int32 zeros where the split kernel combines (made here when not
    given; the kernel puts them back to 0, so a caller may reuse them). `new`: (new_k, new_v,
    index, offset, increment) writes the rows of new_k, new_v [B, Hkv, n, D] into k and v at
    positions index[j] (offset: index[0] + j) before attending, and adds `increment` (not None)
    to index[0] after (Note [The cache write inside the attention]; the two launches). `counter`:
    (tensor, increment), a bump without a write (the measurement's). `one_pass`: one launch on
    SPLITS = 1 that writes the output itself and bumps the counter after every program read it
    (Note [One pass]; `counts`: one int32 zero for its arrivals, made here when not given);
    `block_n`: its keys a step (`one_pass_block_n` when None; `one_pass_wide_block_n`'s, the
    wide variant; one pass only)."""
    if block_n is not None and not one_pass:
        raise ValueError(f"decode_attention: block_n={block_n} is the one pass's keys a step; pass one_pass=True "
                         "with it (the split form's blocks are fixed)")
    B, H, LQ, D = q.shape
    _, HKV, S, _ = k.shape
    G = H // HKV
    scale = D**-0.5 if scale is None else scale
    out = torch.empty_like(q)
    ws = None if one_pass else torch.empty(workspace_elements(B, HKV, G * LQ, D), dtype=torch.float32, device=q.device)
    has_mask = mask is not None
    m = mask if has_mask else q
    ms = [mask.stride(i) if mask.size(i) > 1 else 0 for i in range(3)] if has_mask else [0, 0, 0]
    BM, BD = block_m(G * LQ), triton.next_power_of_2(D)
    fused = combines_in_split(G * LQ) if combine is None else bool(combine) and combines_in_split(G * LQ)
    combine = {}
    if fused and new is None and counter is None and not one_pass:  # a bump needs the combine kernel
        if counts is None:
            counts = torch.zeros(B * HKV, dtype=torch.int32, device=q.device)
        combine = dict(out_ptr=out, count_ptr=counts, so_b=out.stride(0), so_h=out.stride(1), so_l=out.stride(2),
                       count_offset=0, COMBINE=True)
    write, bump = {}, {}
    if new is not None:
        new_k, new_v, index, offset, increment = new
        write = dict(new_k_ptr=new_k, new_v_ptr=new_v, index_ptr=index,
                     **dict(zip(("snk_b", "snk_h", "snk_l", "snk_d"), new_k.stride())),
                     **dict(zip(("snv_b", "snv_h", "snv_l", "snv_d"), new_v.stride())),
                     index_stride=0 if offset else index.stride(0), NEW=new_k.shape[2],
                     NEW_BLOCK=new_block(new_k.shape[2]), INDEX_OFFSET=bool(offset))
        if increment is not None:
            bump = dict(counter_ptr=index, increment=increment, INCREMENT=True)
    if counter is not None:
        bump = dict(counter_ptr=counter[0], increment=counter[1], INCREMENT=True)
    if one_pass:
        if bump:
            counts = torch.zeros(1, dtype=torch.int32, device=q.device) if counts is None else counts
            bump = dict(bump, count_ptr=counts, count_offset=0)
        block_n = block_n or one_pass_block_n(D, q.element_size())
        decode_attention_split_kernel[(B * HKV, 1)](
            q, k, v, m, out, S, scale, q.stride(0), q.stride(1), q.stride(2), *ms,
            KV_HEADS=HKV, G=G, LQ=LQ, D=D, BLOCK_M=BM, BLOCK_D=BD, BLOCK_N=block_n, num_warps=one_pass_warps(block_n),
            HAS_MASK=has_mask, MASK_BOOL=has_mask and mask.dtype == torch.bool, SPLITS=1,
            PRECISION=dot_precision(q.dtype), out_ptr=out, so_b=out.stride(0), so_h=out.stride(1),
            so_l=out.stride(2), DIRECT=True, **write, **bump)
        return out
    decode_attention_split_kernel[(B * HKV, SPLITS)](
        q, k, v, m, ws, S, scale, q.stride(0), q.stride(1), q.stride(2), *ms,
        KV_HEADS=HKV, G=G, LQ=LQ, D=D, BLOCK_M=BM, BLOCK_D=BD, BLOCK_N=BLOCK_N,
        HAS_MASK=has_mask, MASK_BOOL=has_mask and mask.dtype == torch.bool, SPLITS=SPLITS,
        PRECISION=dot_precision(q.dtype), **combine, **write)
    if combine:
        return out
    decode_attention_combine_kernel[combine_grid(B, HKV, G * LQ)](
        ws, out, out.stride(0), out.stride(1), out.stride(2),
        KV_HEADS=HKV, G=G, LQ=LQ, D=D, BLOCK_M=BM, BLOCK_D=BD, SPLITS=SPLITS, **bump)
    return out
