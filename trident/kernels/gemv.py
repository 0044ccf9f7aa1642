"""Decode-shaped matrix products: out[M, N] = a[M, K] @ b[K, N] (+ c) for M <= 16, a few rows
times a weight (issue 25 item 1; trident/passes/choose_matmuls.py decides where they run).

At M = 1 a product reads the whole weight once and does 2 flops per element read: it is a
stream of the weight through the SMs, and what matters is keeping every SM reading. cuBLAS's
kernels for it reach ~50 % of an H200's bandwidth (results/bench_hf_*_5c68af3.json); these are
the two kernels of a split-K GEMV:

  gemv_kernel          program (n-block, k-split) reads a [BLOCK_N, BLOCK_K] tile of b at a time
                       (b's K axis is contiguous for an nn.Linear weight seen through .t()) and the
                       matching [BLOCK_M, BLOCK_K] tile of a, accumulating in fp32: for BLOCK_M = 1
                       as a broadcast multiply and a row sum, for more rows with tl.dot (16 rows,
                       the extra ones masked; fp32 exact, PRECISION "ieee", as cuBLAS's fp32). With
                       SPLIT_K = 1 it adds c and writes out in its dtype (one rounding, as
                       aten.mm/addmm); else it writes its fp32 partial sum to ws[split, m, n], and
                       with LAST_REDUCES the last program of its column block to arrive sums the
                       pieces (Note [The last program reduces]);
  gemv_reduce_kernel   out = sum over splits of ws (+ c), rounded once: the second launch of a
                       split-K product without LAST_REDUCES.

Note [The last program reduces]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A split-K product's second launch costs a kernel and a kernel boundary (~1-2 us of an H200 each,
80 of them per Llama-1B decode step: results/bench_hf_llama_liger_e3252af.json). With
LAST_REDUCES the programs of a column block count their arrivals instead, as CUTLASS's serial
split-K does: each stores its fp32 piece, the CTA synchronizes (`tl.debug_barrier`, so every
thread's store precedes the count), and one atomic add with acquire-release semantics at GPU
scope counts it in `count[count_offset + n-block]`; the program that sees SPLIT_K - 1 arrivals
before its own reads the pieces through L2 (`.cg`: never a stale L1 line) in split order --
the sum, and so the result, is bit for bit the two-launch one -- adds c, writes out and puts the
counter back to 0. The counters are int32 zeros allocated per call (one allocation for every
product of a graph, shared with the decode attention's: trident/passes/common.py call_counters;
a call never sees another call's counts, whatever stream runs it); putting them back makes a
buffer reusable as the measurement reuses it.

PDL (both kernels): wait for the kernel before first, release the next one after the loads
(Note [Programmatic dependent launch]).

Note [Bytes in flight]
~~~~~~~~~~~~~~~~~~~~~~
A stream reaches the bandwidth only with enough loads outstanding: by Little's law an H200's
~4.8 TB/s at ~0.7 us of latency is ~3.4 MB in flight, ~25 KB per SM. The K loop as Triton
compiles it by default (no dot: no software pipelining) issues one tile's loads (16 KB at 64x128
bf16) and waits for them before the next tile's, so a grid of one program per SM keeps at most
that much in flight. Two config fields let more tiles be outstanding, measured per shape like
the tile sizes (choose_matmuls: in a second round, for the two tiles fastest with the default
loop, so that the first call compiles and times ~14 candidates, not ~25): STAGES >= 2 pipelines
the loop's loads through shared memory (`tl.range(num_stages=...)`: cp.async, STAGES-1 tiles
ahead of the one summed), UNROLL unrolls it (that many tiles' loads issued into registers before
the first is summed; the SASS of 64x128 at UNROLL 2 issues 18 global loads before its first
shuffle, 9 at 1). Neither changes the sum's order: a config's result is the same bits with or
without them. 0 and 1 (the defaults) compile the loop as before they existed. Triton's
interpreter ignores both.

ACC2D (off; measured by tools/bench_gemv.py --acc2d, a default only where the H200 says it is
faster): a one-row product accumulates its [BLOCK_N, BLOCK_K] tile per element and sums across
K once after the loop, instead of a row sum (warp shuffles) per tile.

K is a constexpr: a weight's inner size is fixed, and the loop bound is then known to the
compiler (and a plain int to Triton's interpreter, which cannot range over a scalar argument).

c (HAS_C) is addmm's / residual_mm's addend: [M, N] or a row [N] broadcast (stride_cm 0), added in
fp32 before the one rounding. Every stride is an argument: a and b may be transposed views.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import triton
import triton.language as tl


# Note [Weights ahead of the wait]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Under programmatic dependent launch a GEMV's programs start while the kernel before it still
# runs, and wait (gdc_wait) before reading anything that kernel may write. Its weights are read
# by nobody's result: with PREFETCH = t > 0, each program first asks the L2 for every 128-byte
# line of the first t weight tiles it will stream (`prefetch.global.L2`, one per line, no
# register written), and only then waits: those HBM reads overlap the kernel before (in a decode
# step a norm, a rotary embedding or the attention: latency-bound kernels that leave HBM idle),
# and the K loop finds them in L2. t is every tile of the program where the launch's prefetches
# fit in PREFETCH_BYTES (a third of an H100's or H200's 50 MB L2), else as many as fit, at least
# one (`prefetch_tiles`): a product larger than the L2 (Llama's gate/up, 67 MB; an lm_head) would
# otherwise have its first lines evicted by its last before the loop reads them, and read twice.
# A prefetch has no effect on any value -- the L2 is the GPU's point of coherence, so a line a
# kernel writes later is the written line when read -- so it is safe whatever the weights alias.
# CUDA only (inline PTX: Triton's interpreter runs none); set by emit_launch where PDL is (Note
# [Programmatic dependent launch]).

PREFETCH_BYTES = 16 << 20


def prefetch_for(grid, kwargs: dict) -> int:
    """PREFETCH of a launch of gemv_kernel or gemv_group_kernel on `grid` with `kwargs` (its
    arguments; tensors as FX nodes or tensors): `prefetch_tiles` of its weight."""
    weight = kwargs.get("b_ptr", kwargs.get("b0_ptr"))
    weight = weight.meta["val"] if hasattr(weight, "meta") else weight
    return prefetch_tiles(math.prod(grid), kwargs["K"], kwargs["BLOCK_N"], kwargs["BLOCK_K"], kwargs["SPLIT_K"],
                          weight.dtype.itemsize)


def prefetch_tiles(programs: int, k: int, block_n: int, block_k: int, split_k: int, itemsize: int) -> int:
    """PREFETCH of a launch of `programs` programs (Note [Weights ahead of the wait]): how many of
    its K loop's weight tiles each program prefetches before it waits."""
    iterations = -(-k // (block_k * split_k))
    fit = PREFETCH_BYTES // max(1, programs * block_n * block_k * itemsize)
    return max(1, min(iterations, fit))


@triton.jit
def _prefetch_weights(b_ptr, stride_bk, stride_bn, N, K: tl.constexpr, pid_n, pid_k,
                      SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TILES: tl.constexpr):
    """Note [Weights ahead of the wait]: the L2 prefetch of program (pid_n, pid_k)'s first TILES
    weight tiles."""
    # 64 2-byte elements per 128-byte line (4-byte weights: every other line)
    LINES: tl.constexpr = BLOCK_K // 64 if BLOCK_K >= 64 else 1
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    for i in tl.static_range(TILES):  # no branch before the wait (pdl.waits_before_memory)
        rk = i * BLOCK_K * SPLIT_K + pid_k * BLOCK_K + tl.arange(0, LINES) * 64
        ok = (rn[:, None] < N) & (rk[None, :] < K)
        ptrs = tl.where(ok, b_ptr + rk[None, :] * stride_bk + rn[:, None] * stride_bn, b_ptr)
        tl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _gemv_program(
    a_ptr, b_ptr, c_ptr, out_ptr, ws_ptr, count_ptr,
    M, N, K: tl.constexpr,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_om, stride_on, count_index,
    pid_n, pid_k,
    HAS_C: tl.constexpr, SPLIT_K: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    LAST_REDUCES: tl.constexpr, PDL: tl.constexpr, ACC2D: tl.constexpr, STAGES: tl.constexpr, UNROLL: tl.constexpr,
):
    """Program (pid_n, pid_k) of one product: columns [pid_n * BLOCK_N, ...) of out = a @ b (+ c),
    split pid_k of K; ws_ptr is this product's workspace, count_index its column block's counter."""
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    n_mask = rn < N
    m_mask = rm < M
    if BLOCK_M == 1:
        if ACC2D:
            acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        else:
            acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # split pid_k reads blocks pid_k, pid_k + SPLIT_K, ...; Note [Bytes in flight]
    for k0 in tl.range(0, K, BLOCK_K * SPLIT_K, num_stages=STAGES if STAGES > 0 else None,
                       loop_unroll_factor=UNROLL if UNROLL > 1 else None):
        rk = k0 + pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        k_mask = rk < K
        b = tl.load(b_ptr + rk[None, :] * stride_bk + rn[:, None] * stride_bn,
                    mask=n_mask[:, None] & k_mask[None, :], other=0.0)  # [BLOCK_N, BLOCK_K]
        if BLOCK_M == 1:
            a = tl.load(a_ptr + rk * stride_ak, mask=k_mask, other=0.0)  # row 0: [BLOCK_K]
            if ACC2D:  # products summed across K once, after the loop (no shuffles per tile)
                acc2 += b.to(tl.float32) * a.to(tl.float32)[None, :]
            else:
                acc1 += tl.sum(b.to(tl.float32) * a.to(tl.float32)[None, :], axis=1)
        else:
            a = tl.load(a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak,
                        mask=m_mask[:, None] & k_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
            acc += tl.dot(a, tl.trans(b.to(a.dtype)), input_precision=PRECISION, out_dtype=tl.float32)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    if BLOCK_M == 1:
        if ACC2D:
            acc = tl.sum(acc2, axis=1)[None, :]
        else:
            acc = acc1[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        if HAS_C:
            c = tl.load(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, mask=mask, other=0.0)
            acc += c.to(tl.float32)
        out = out_ptr + rm[:, None] * stride_om + rn[None, :] * stride_on
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # ws_ptr: the fp32 workspace [SPLIT_K, M, N], contiguous
        piece = rm[:, None] * N + rn[None, :]
        tl.store(ws_ptr + pid_k * M * N + piece, acc, mask=mask)
        if LAST_REDUCES:  # Note [The last program reduces]
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + count_index, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(SPLIT_K):  # in split order: gemv_reduce_kernel's sum
                    total += tl.load(ws_ptr + s * M * N + piece, mask=mask, other=0.0, cache_modifier=".cg")
                if HAS_C:
                    c = tl.load(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, mask=mask, other=0.0)
                    total += c.to(tl.float32)
                out = out_ptr + rm[:, None] * stride_om + rn[None, :] * stride_on
                tl.store(out, total.to(out_ptr.dtype.element_ty), mask=mask)
                tl.store(count_ptr + count_index, 0)


# count_offset differs per product of a graph: not specialized (divisible by 16, equal to 1), so
# that every product of one config runs the one compiled kernel the measurement compiled
@triton.jit(do_not_specialize=["count_offset"])
def gemv_kernel(
    a_ptr, b_ptr, c_ptr, out_ptr, ws_ptr, count_ptr,
    M, N, K: tl.constexpr,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_om, stride_on, count_offset,
    HAS_C: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    LAST_REDUCES: tl.constexpr = False,
    PDL: tl.constexpr = False,
    ACC2D: tl.constexpr = False,
    STAGES: tl.constexpr = 0,
    UNROLL: tl.constexpr = 1,
    PREFETCH: tl.constexpr = 0,
):
    pid_n = tl.program_id(0)
    if PREFETCH > 0:  # Note [Weights ahead of the wait]
        _prefetch_weights(b_ptr, stride_bk, stride_bn, N, K, pid_n, tl.program_id(1), SPLIT_K, BLOCK_N, BLOCK_K,
                          PREFETCH)
    if PDL:  # Note [Programmatic dependent launch]
        tl.extra.cuda.gdc_wait()
    _gemv_program(a_ptr, b_ptr, c_ptr, out_ptr, ws_ptr, count_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_om, stride_on,
                  count_offset + pid_n, pid_n, tl.program_id(1),
                  HAS_C, SPLIT_K, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K, LAST_REDUCES, PDL, ACC2D, STAGES, UNROLL)


@triton.jit(do_not_specialize=["count_offset"])
def gemv_group_kernel(
    a_ptr, b0_ptr, b1_ptr, b2_ptr, c0_ptr, c1_ptr, c2_ptr, out0_ptr, out1_ptr, out2_ptr, ws_ptr, count_ptr,
    M, K: tl.constexpr, N0: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cn, count_offset,
    MEMBERS: tl.constexpr,
    HAS_C: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    LAST_REDUCES: tl.constexpr = False,
    PDL: tl.constexpr = False,
    ACC2D: tl.constexpr = False,
    STAGES: tl.constexpr = 0,
    UNROLL: tl.constexpr = 1,
    PREFETCH: tl.constexpr = 0,
):
    """Note [Products sharing a row block]: 2 or 3 products of one `a` (q/k/v, gate/up) in one
    launch; column block pid < NB0 is member 0's, then member 1's, then member 2's. Each member's
    out is [M, N_i] contiguous, its addend a bias row [N_i]; the workspace holds the members'
    [SPLIT_K, M, N_i] pieces one after the other, the counters one per column block."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    NB0: tl.constexpr = (N0 + BLOCK_N - 1) // BLOCK_N
    NB1: tl.constexpr = (N1 + BLOCK_N - 1) // BLOCK_N
    if PREFETCH > 0:  # Note [Weights ahead of the wait]: the member selected without a branch
        in1 = pid >= NB0
        in2 = pid >= NB0 + NB1
        if MEMBERS == 3:
            b_sel = tl.where(in2, b2_ptr, tl.where(in1, b1_ptr, b0_ptr))
        else:
            b_sel = tl.where(in1, b1_ptr, b0_ptr)
        n_sel = tl.where(in2, N2, tl.where(in1, N1, N0))
        first = tl.where(in2, NB0 + NB1, tl.where(in1, NB0, 0))
        _prefetch_weights(b_sel, stride_bk, stride_bn, n_sel, K, pid - first, pid_k, SPLIT_K, BLOCK_N, BLOCK_K,
                          PREFETCH)
    if PDL:  # Note [Programmatic dependent launch]
        tl.extra.cuda.gdc_wait()
    if pid < NB0:
        _gemv_program(a_ptr, b0_ptr, c0_ptr, out0_ptr, ws_ptr, count_ptr, M, N0, K,
                      stride_am, stride_ak, stride_bk, stride_bn, 0, stride_cn, N0, 1, count_offset + pid, pid, pid_k,
                      HAS_C, SPLIT_K, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K, LAST_REDUCES, PDL, ACC2D, STAGES, UNROLL)
    elif pid < NB0 + NB1:
        _gemv_program(a_ptr, b1_ptr, c1_ptr, out1_ptr, ws_ptr + SPLIT_K * M * N0, count_ptr, M, N1, K,
                      stride_am, stride_ak, stride_bk, stride_bn, 0, stride_cn, N1, 1, count_offset + pid, pid - NB0,
                      pid_k, HAS_C, SPLIT_K, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K, LAST_REDUCES, PDL, ACC2D,
                      STAGES, UNROLL)
    else:
        if MEMBERS == 3:
            _gemv_program(a_ptr, b2_ptr, c2_ptr, out2_ptr, ws_ptr + SPLIT_K * M * (N0 + N1), count_ptr, M, N2, K,
                          stride_am, stride_ak, stride_bk, stride_bn, 0, stride_cn, N2, 1, count_offset + pid,
                          pid - NB0 - NB1, pid_k, HAS_C, SPLIT_K, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K,
                          LAST_REDUCES, PDL, ACC2D, STAGES, UNROLL)


@triton.jit
def gemv_reduce_kernel(
    ws_ptr, c_ptr, out_ptr,
    M, N,
    stride_cm, stride_cn, stride_om, stride_on,
    HAS_C: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:
        tl.extra.cuda.gdc_wait()
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < M * N
    m = i // N
    n = i % N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):  # in split order: the same sum every call
        acc += tl.load(ws_ptr + s * M * N + i, mask=mask, other=0.0)
    if HAS_C:
        acc += tl.load(c_ptr + m * stride_cm + n * stride_cn, mask=mask, other=0.0).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + m * stride_om + n * stride_on, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def after_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    """The kernel a product is timed after where PDL is on (Note [Measured after a kernel],
    choose_matmuls): one program per row of n elements, which waits for the kernel before it and
    releases its dependents at once, as a user kernel's waiting twin does (Note [A user kernel made
    to wait]), then copies its row -- latency-bound, as the norm before a projection is. CUDA only."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64) * n
    for start in tl.range(0, n, BLOCK):
        i = start + tl.arange(0, BLOCK)
        tl.store(dst_ptr + row + i, tl.load(src_ptr + row + i, mask=i < n), mask=i < n)


class Config(NamedTuple):
    """A configuration a decode product is measured with (choose_matmuls): the tile, the split of
    K, warps, whether the last program reduces (Note [The last program reduces]) and how many
    tiles are in flight (Note [Bytes in flight]). Config(*five fields) is the config whose loop
    is compiled as by default (how tests and tools name one)."""
    block_n: int
    block_k: int
    split_k: int
    warps: int
    last: int
    stages: int = 0
    unroll: int = 1


# The configurations a decode product is measured over (choose_matmuls). Small N (k/v projections:
# 256-1024 columns) needs K split to fill 132 SMs, or narrow tiles: 8 or 16 rows a program with all
# of K in one or a few tiles (Qwen2-0.5B's o projection, 896 x 896: 112 programs of one 8 x 1024
# tile, where 32-row tiles give 28 programs and a split pays the reduction's round trip; with the
# tiles before these its 1.6 MB took 3.7 us on the H200, 9 % of the bandwidth,
# results/bench_gemv_b5cf397.json; the narrow tiles are not yet timed on a GPU); large N (MLP,
# lm_head) has enough column blocks alone. A split config's last program sums the pieces: measured
# on the H200 against the two-launch form for every Llama-1B decode product at M = 1 and 16, the
# one-launch form was faster wherever a split config won
# (results/bench_generate_llama_dynamic_c73d461.json); the two-launch form (gemv_reduce_kernel)
# stays the reference it is tested against bit for bit, and is no longer measured. Each tile is
# measured as compiled by default; the two fastest also with their loads pipelined in 3 stages and
# with their loop unrolled twice (Note [Bytes in flight]): each config measured is one more compile
# (~0.15 s of an sm_90 compile, in parallel threads) and one timing on a capture's first call, where
# the choice is not already in TRIDENT_CACHE_DIR.
_SPLIT = ((32, 256, 2, 4), (32, 256, 4, 4), (64, 128, 4, 4), (32, 256, 8, 4), (64, 128, 16, 4), (16, 256, 8, 2))
_TILES = (
    Config(32, 256, 1, 4, 0), Config(64, 128, 1, 4, 0), Config(64, 256, 1, 8, 0), Config(128, 128, 1, 8, 0),
    Config(8, 1024, 1, 4, 0), Config(16, 512, 1, 4, 0),
    *(Config(*c, 1) for c in _SPLIT),
)
CONFIGS = (*_TILES, *(c._replace(stages=3) for c in _TILES), *(c._replace(unroll=2) for c in _TILES))


def block_m(m: int) -> int:
    """Rows per program: 1, or 16 (tl.dot's least) for 2..16 rows."""
    return 1 if m == 1 else 16


def grid(n: int, k: int, config) -> tuple:
    block_n, _, split_k = config[:3]
    return (triton.cdiv(n, block_n), split_k, 1)


def group_grid(ns, config) -> tuple:
    """gemv_group_kernel's grid: the members' column blocks one after the other, times the splits."""
    block_n, _, split_k = config[:3]
    return (sum(triton.cdiv(n, block_n) for n in ns), split_k, 1)


def counters(n: int, config) -> int:
    """int32 counters a launch with `config` needs (Note [The last program reduces]): one per
    column block where the last program reduces, else none."""
    block_n, _, split_k, _, last = config[:5]
    return triton.cdiv(n, block_n) if split_k > 1 and last else 0


# Shared memory of one H100/H200 block (opt-in maximum; `useful` is given the device's own where
# there is one) and what a K loop takes of it: a pipelined one-row loop, Triton's buffers for
# (stages + 2) weight tiles (measured: fp32 64x256 at 3 stages asked for 327,680 bytes and could not
# launch, bf16 163,840); the tl.dot loop of more rows, which Triton pipelines by default, two
# buffers of the weight tile and the 16-row `a` tile per tile the loop issues at once (UNROLL of
# them: fp32 64x256 unrolled twice asked for 327,680 on an H100 and could not launch).
SHARED_BYTES = 232448


def pipelined_bytes(config, itemsize: int, m: int = 1) -> int:
    """An upper bound of the shared memory gemv_kernel's K loop asks for with `config` at `m` rows
    (checked against Triton's sm_90 code for every config in tests/passes/test_choose_matmuls.py)."""
    block_n, block_k, _, _, _, stages, unroll = Config(*config)
    if m > 1:
        return 2 * max(1, unroll) * (block_n + block_m(m)) * block_k * itemsize
    return (stages + 2) * block_n * block_k * itemsize if stages else 0


def useful(n: int, k: int, config, m: int = 1, itemsize: int = 2, shared_bytes: int = SHARED_BYTES) -> bool:
    """A config whose splits each get at least one block of K and whose column block is not
    more than twice the product's columns; pipelined or unrolled (Note [Bytes in flight]) only
    where its loop runs at least that many tiles, and pipelined only for one row (the tl.dot loop
    of more rows is pipelined in Triton's default 3 stages already): else it is the same kernel
    as the config without them, compiled and timed again for nothing. Only where its loop's
    buffers of `itemsize`-byte elements (`pipelined_bytes`) fit in `shared_bytes` of shared memory
    (else it cannot launch); for more than one row only tiles of at least 16 columns (tl.dot's
    least N)."""
    block_n, block_k, split_k, _, _, stages, unroll = Config(*config)
    tiles = triton.cdiv(k, block_k * split_k)
    if (stages and (m > 1 or tiles < stages)) or tiles < unroll or pipelined_bytes(config, itemsize, m) > shared_bytes:
        return False
    if m > 1 and block_n < 16:  # tl.dot's least N
        return False
    return (split_k == 1 or k >= block_k * split_k) and block_n <= max(32, 2 * triton.next_power_of_2(n))
