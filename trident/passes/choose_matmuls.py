"""Decode-shaped matrix products: cuBLAS or Trident's Triton GEMV, whichever is measured faster.

Note [Decode matmuls by measurement]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
At batch 1 a decode step's matrix products are a few rows times a weight; cuBLAS runs them at
about half of an H200's bandwidth, and they are most of the step's device time (issue 25). For
each `aten.mm(a, b)`, `aten.addmm(c, a, b)` (beta = alpha = 1) and `trident.residual_mm(x, a, b)`
of a static capture with at most 16 rows, one dtype among bf16/fp16/fp32 and every tensor on a
device the knob allows (TRIDENT_DECODE_MATMULS: 'cuda', 'all' for the CPU tests, '' off), this
pass measures the operator against the configurations of trident/kernels/gemv.py
(`gemv_kernel`; split-K with `gemv_reduce_kernel` or with its last program reducing, Note [The
last program reduces]; loads pipelined or the loop unrolled, Note [Bytes in flight]) on stand-in
tensors of the product's sizes, strides and dtype, and keeps the fastest: the operator stays, or
becomes those launches, which the SCM serves like any kernel (its guards, native launches, graph
replay). As @triton.autotune
chooses a config, the choice is made once per product shape -- remembered for the process and on
disk (`decode-matmul` entries of Note [Cached analyses] in TRIDENT_CACHE_DIR or TRIDENT_TUNING_DIR,
Note [Kept measurements]; per device name, torch and Triton version) -- and printed by
`explain()` with every time measured.

The timings: on CUDA each candidate runs inside a CUDA graph (Note [Timing a candidate in a
graph], median), which is how a region's graph replays it: launch overhead is not part of it; the
weight rotates through copies larger than L2 together (a step streams each weight from HBM
once), and the operator is timed as the region runs it (one cuBLAS product); under programmatic
dependent launch each candidate is timed after a kernel, launched as the region launches it
(Note [Measured after a kernel]). Without a
GPU nothing can be timed and the operator stays, unless a process installs a timer
(`set_timer`; the tests do, to prove the plumbing and the kernels through Triton's interpreter).
A Triton candidate must beat the operator by `_MARGIN` to be chosen (noise must not flip a
product to a kernel that is no faster).

Numerics: fp32 accumulation, the addend added in fp32, one rounding to the output dtype -- what
aten.mm/addmm compute, in another summation order (the last bit can differ, as between two
cuBLAS algorithms). residual_mm's own numerics (Note [Residual adds in the GEMM]) are the same.
"""

from __future__ import annotations

import ast
import functools
import math
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

import torch
import triton

try:  # Triton's compile-in-an-executor mode (3.6: private module); without it candidates compile when timed
    from triton.runtime import _async_compile
except ImportError:  # pragma: no cover - another Triton
    _async_compile = None

from .. import disk_cache, knobs, logs, pdl, triton_state
from ..capture.shared_patch import SharedPatch
from ..kernels import gemv as G
from .common import bound_args, call_counters, emit_launch, node_val, stand_in
from . import timing
from .timing import graph_median_us
from .cse import written_nodes

aten = torch.ops.aten

_MARGIN = 0.95  # a kernel is chosen when it takes at most this fraction of the operator's time
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_REDUCE_BLOCK = 256

# (op name, rows, cols, inner, dtype, layouts, device, chained) -> the choice: {"config": [..] or None, "us": {...}}
_CHOICES: dict = {}
_timer: Optional[Callable[[str, dict, Any], float]] = None


def set_timer(timer: Optional[Callable[[str, dict, Any], float]]) -> None:
    """Install (or remove, with None) the timer the pass uses where no GPU is: `timer(name, shape,
    config)` gives the microseconds of candidate `name` ('aten' or 'gemv') for the product
    `shape` (rows, cols, inner, dtype) with `config` (None for aten)."""
    global _timer
    _timer = timer
    _CHOICES.clear()


def _product(node: torch.fx.Node):
    """(a, b, c) nodes of a product the pass can run, else None."""
    if node.op != "call_function":
        return None
    if node.target is aten.mm.default:
        a, b = node.args[:2]
        return a, b, None
    if node.target is aten.addmm.default:
        args = bound_args(node)
        if args.get("beta", 1) != 1 or args.get("alpha", 1) != 1:
            return None
        return args["mat1"], args["mat2"], args["self"]
    if node.target is torch.ops.trident.residual_mm.default:
        x, a, b = node.args[:3]
        return a, b, x
    return None


def _static(t) -> bool:
    return isinstance(t, torch.Tensor) and all(type(s) is int for s in (*t.shape, *t.stride(), t.storage_offset()))


def _fits(node, a, b, c, mode: str) -> bool:
    out, va, vb = node_val(node), node_val(a), node_val(b)
    vc = node_val(c) if c is not None else None
    tensors = [t for t in (out, va, vb, vc) if t is not None]
    if not all(_static(t) for t in tensors) or va.dim() != 2 or vb.dim() != 2 or out.dim() != 2:
        return False
    if len({t.dtype for t in tensors}) != 1 or va.dtype not in _DTYPES or len({t.device for t in tensors}) != 1:
        return False
    if not (va.device.type == "cuda" or (mode == "all" and va.device.type == "cpu")):
        return False
    m, k = va.shape
    if va.device.type == "cpu" and va.dtype == torch.bfloat16 and m > 1:
        return False  # Triton's interpreter multiplies bf16 tl.dot tiles as their bit patterns
    n = vb.shape[1]
    if not (1 <= m <= 16) or vb.shape[0] != k or tuple(out.shape) != (m, n) or k < 16 or n < 16:
        return False
    if out.stride() != (n, 1):
        return False
    if vc is not None and tuple(vc.shape) not in ((n,), (1, n), (m, n)):
        return False
    return True


def _c_strides(vc, m: int) -> tuple:
    if vc is None:
        return 0, 0
    if vc.dim() == 1:
        return 0, vc.stride(0)
    return (vc.stride(0) if vc.shape[0] == m and m > 1 else 0), vc.stride(1)


def _launch_args(va, vb, vc, config, m: int, n: int, k: int, count_offset: int = 0, programmatic: bool = False) -> dict:
    """gemv_kernel's scalar and constexpr arguments. The addend is the kernel's where it writes
    out: one split, or the last program reducing (else gemv_reduce_kernel adds it).
    `programmatic`: as the region launches it under PDL (Note [Measured after a kernel])."""
    block_n, block_k, split_k, warps, last, stages, unroll = G.Config(*config)
    writes_out = split_k == 1 or bool(last)
    cm, cn = _c_strides(vc if writes_out else None, m)
    return {
        "M": m, "N": n, "K": k,
        "stride_am": va.stride(0), "stride_ak": va.stride(1), "stride_bk": vb.stride(0), "stride_bn": vb.stride(1),
        "stride_cm": cm, "stride_cn": cn,
        "stride_om": n if writes_out else 0, "stride_on": 1 if writes_out else 0, "count_offset": count_offset,
        "HAS_C": vc is not None and writes_out, "SPLIT_K": split_k,
        "PRECISION": "ieee" if va.dtype == torch.float32 else "tf32",
        "BLOCK_M": G.block_m(m), "BLOCK_N": block_n, "BLOCK_K": block_k, "LAST_REDUCES": bool(last),
        "STAGES": stages, "UNROLL": unroll, "num_warps": warps,
    } | (_programmatic_args(G.grid(n, k, config), vb, config, k) if programmatic else {})


def _programmatic_args(grid, vb, config, k: int) -> dict:
    """A GEMV launch's arguments as the region makes it under PDL: PDL and PREFETCH as emit_launch
    sets them (`gemv.prefetch_for`, Note [Weights ahead of the wait]), launched with programmatic
    serialization."""
    block_n, block_k, split_k = G.Config(*config)[:3]
    shape = {"b_ptr": vb, "K": k, "BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split_k}
    return {"PDL": True, "PREFETCH": G.prefetch_for(grid, shape), "launch_pdl": True}


def _run_gemv(a, b, c, out, config, counts=None, compile_only=False, programmatic=False):
    """The candidate on real tensors (stand-ins while measuring): the launches the rewrite emits.
    `counts`: zeroed int32 counters where the last program reduces (G.counters; made here when
    not given: the kernel puts them back to 0, so a caller may reuse them). `compile_only`: the
    kernels compiled for these arguments (Triton's warmup), nothing launched. `programmatic`:
    launched as under PDL (Note [Measured after a kernel])."""
    m, k = a.shape
    n = b.shape[1]
    split_k, last = config[2], config[4]
    ws = torch.empty(split_k, m, n, dtype=torch.float32, device=a.device) if split_k > 1 else out
    if counts is None:
        counts = torch.zeros(max(1, G.counters(n, config)), dtype=torch.int32, device=a.device)
    args = (a, b, c if c is not None else a, out, ws, counts)
    kwargs = _launch_args(a, b, c, config, m, n, k, programmatic=programmatic)
    if compile_only:
        G.gemv_kernel.warmup(*args, grid=G.grid(n, k, config), **kwargs)
        return
    G.gemv_kernel[G.grid(n, k, config)](*args, **kwargs)
    if split_k > 1 and not last:
        cm, cn = _c_strides(c, m)
        G.gemv_reduce_kernel[(triton.cdiv(m * n, _REDUCE_BLOCK),)](
            ws, c if c is not None else ws, out, m, n, cm, cn, n, 1,
            HAS_C=c is not None, SPLIT_K=split_k, BLOCK=_REDUCE_BLOCK,
            **({"PDL": True, "launch_pdl": True} if programmatic else {}))


_L2_BYTES = 64 << 20  # more than an H100/H200's L2 (50 MB): weights are timed as streamed from HBM


# Note [One AST conversion at a time]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Triton's compile parses the kernel's source (`JITFunction.parse`: `ast.parse`). CPython 3.11
# counts the depth of its C-to-Python AST conversion in one process-wide variable: when two
# threads convert at once (a collection inside one conversion runs Python code, and the GIL
# passes to the other thread), each sees the other's depth and one fails with `SystemError: AST
# constructor recursion depth mismatch` (python/cpython#106905; later CPythons keep the count per
# call). precompile's compiles run in threads, so on 3.11 a candidate sometimes failed to
# compile ahead (compiled again when timed: correct, only slower), and a thread of the caller's
# own that parsed meanwhile could fail the same way. While any precompile runs, `ast.parse` takes
# one reentrant lock (a conversion is ~1 ms of a ~0.3 s compile: the compiles' native parts still
# run in parallel); the function found on entry is back when the last precompile ends.
_parse_lock = threading.RLock()
_parse_found: list = []  # `ast.parse` as the first precompile found it


@functools.wraps(ast.parse)
def _parse_one_at_a_time(*args, **kwargs):
    with _parse_lock:
        return _parse_found[0](*args, **kwargs)


def _install_serial_parse() -> None:
    if ast.parse is not _parse_one_at_a_time:  # left installed (replaced and put back meanwhile): kept
        _parse_found[:] = [ast.parse]
    ast.parse = _parse_one_at_a_time


def _remove_serial_parse() -> None:
    if ast.parse is _parse_one_at_a_time:  # not replaced again meanwhile
        ast.parse = _parse_found[0]


_SERIAL_PARSE = SharedPatch(_install_serial_parse, _remove_serial_parse)


def precompile(compiles) -> None:
    """Compile every candidate before any is timed, Triton's compiles running in threads
    (Triton's own AsyncCompileMode: a JIT function's warmup submits its compile to the executor
    and the mode waits for all of them on exit). Each candidate is one more Triton compile on a
    capture's first call (~0.3-0.5 s each, ~50 for a Llama decode step); the compiles' native
    parts (LLVM, ptxas) run in parallel. A candidate that fails to compile here fails again when
    timed, and is then no candidate. `ast.parse` is serialized meanwhile (Note [One AST
    conversion at a time])."""
    if len(compiles) < 2 or _async_compile is None or _async_compile.active_mode.get() is not None:
        return  # one to compile, no such mode, or the caller's own mode active: compiled when timed
    workers = max(1, min(len(compiles), 8, (os.cpu_count() or 2)))
    try:
        with _SERIAL_PARSE.held(), ThreadPoolExecutor(max_workers=workers, thread_name_prefix="trident-compile") as pool:
            mode = _async_compile.AsyncCompileMode(pool, ignore_errors=True)
            token = _async_compile.active_mode.set(mode)  # what AsyncCompileMode.__enter__ does
            try:
                for compile_one in compiles:
                    try:
                        compile_one()
                    except Exception as e:  # noqa: BLE001 - timed (and refused) later
                        logs.lowering.debug("candidate not compiled ahead: %s", e)
            finally:
                # Triton's __exit__ waits for the compiles, then unsets the mode without a
                # `finally`: an interrupt while waiting would leave every later compile of
                # this thread submitted to a pool that is gone. Unset it here whatever happens.
                try:
                    mode.__exit__(None, None, None)
                finally:
                    _async_compile.active_mode.reset(token)
                for future in mode.raw_futures:  # Triton drops them (ignore_errors): compiled again when timed
                    if future.done() and future.exception() is not None:
                        logs.lowering.debug("candidate not compiled ahead (in its thread): %r", future.exception())
    except Exception as e:  # noqa: BLE001 - compiling ahead is an optimization only
        logs.lowering.debug("candidates not compiled ahead: %s", e)


# Note [Measured after a kernel]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Where PDL is wanted on the product's device (Note [Programmatic dependent launch]), the region
# launches a GEMV programmatically: its programs start while the kernel before it runs, prefetch
# their first weight tiles (Note [Weights ahead of the wait]), and release the kernel after it
# before their epilogue; a cuBLAS product keeps ordinary order on both sides. Timed alone and back
# to back, neither shows: on an H100 (e62c382) Llama-1B's o projection measured 6.01 us as a GEMV
# against cuBLAS's 6.22 and stayed on cuBLAS (_MARGIN), and with it two boundaries a layer kept
# ordinary order. So under PDL every candidate is timed as a step runs it: each repetition is
# `after_kernel` (a program per row of the product's input, each waiting, releasing its dependents
# at once and copying its row: latency-bound, as the norm before a projection, a user kernel's
# waiting twin, is) then the candidate, each launched as the region launches it (the GEMV with PDL,
# PREFETCH and programmatic serialization; the operator in order; after_kernel programmatic); the
# time of after_kernel alone, chained the same way, is subtracted. A time is then what the product
# adds to a step after such a kernel (`_Timer`; explain() lists these times); without PDL, or with
# user kernels in ordinary order (TRIDENT_PDL_USER_KERNELS=0: the norm before a projection is then
# no twin that releases it early), it is the product alone, as before. Whether the times are of this
# kind is part of every key a choice is kept under. The GEMV timed is compiled with launch_pdl (an
# option of Triton's cache key, the code the same), the region's without: the chosen config is
# compiled once more for the region.


def _chained(device: torch.device) -> bool:
    """Whether products on `device` are timed after a kernel (Note [Measured after a kernel])."""
    return device.type == "cuda" and pdl.wanted(device) and knobs.pdl_user_kernels()


class _Timer:
    """Median microseconds of a call inside a CUDA graph (graph_median_us records its
    repetitions in one graph); with `chained`, of the call after `after_kernel` less that
    kernel's own (Note [Measured after a kernel]). Made inside the product's device."""

    def __init__(self, a: torch.Tensor, chained: bool):
        self.after = None
        self.base = 0.0
        if chained:  # zeros: no draw from the device's random generator, which is the user's
            src = torch.zeros(a.shape, dtype=a.dtype, device=a.device)
            dst = torch.empty_like(src)
            rows, n = a.shape  # a product's [M, K] input
            self.after = lambda: G.after_kernel[(rows,)](src, dst, n, BLOCK=1024, launch_pdl=True)
            self.base = self._bench(self.after)

    @staticmethod
    def _bench(fn) -> float:
        return graph_median_us(fn)

    def __call__(self, fn) -> float:
        if self.after is None:
            return self._bench(fn)

        def after_then_fn():
            self.after()
            fn()

        return max(self._bench(after_then_fn) - self.base, 0.001)


def _measure_cuda(target, va, vb, vc, configs, rounds: bool = True) -> dict:
    """Median microseconds of the operator ('aten') and of each config, each inside a CUDA graph,
    under PDL after a kernel (`_Timer`, Note [Measured after a kernel]). The weight rotates through
    enough copies that the repetitions read more than L2 holds, as a decode step streams every
    weight once. The operator is timed as the region runs it: one cuBLAS product (residual_mm's
    addend is C of one cuBLASLt call there, Note [Residual adds in the GEMM], so it is timed as the
    product alone, not as ATen's copy + addmm). Empty when nothing could be timed (another
    capture running, a failure): the operator then stays, and nothing is stored. `rounds`: the
    configs in two rounds (_second_round), else all of them (tools/bench_gemv.py)."""
    if torch.cuda.is_current_stream_capturing():
        return {}
    chained = _chained(va.device)
    try:
        with torch.cuda.device(va.device):
            g = torch.Generator(device=va.device).manual_seed(0)  # stand-ins drawn on the device
            a = stand_in(va, g)
            timer = _Timer(a, chained)
            copies = max(1, min(32, -(-2 * _L2_BYTES // max(1, vb.numel() * vb.element_size()))))
            bs = [stand_in(vb, g) for _ in range(copies)]
            c = stand_in(vc, g) if vc is not None else None
            out = torch.empty(a.shape[0], bs[0].shape[1], dtype=a.dtype, device=a.device)
            turn = [0]

            def weight():
                turn[0] += 1
                return bs[turn[0] % copies]

            def aten_call():
                if target is aten.addmm.default:
                    torch.addmm(c, a, weight(), out=out)
                else:
                    torch.mm(a, weight(), out=out)

            times = {"aten": timer(aten_call)}
    except Exception as e:  # noqa: BLE001 - no measurement: the operator stays
        logs.lowering.debug("decode matmul %s x %s not measured: %s", tuple(va.shape), tuple(vb.shape), e)
        return {}
    def time_all(round_configs):
        with torch.cuda.device(va.device):
            precompile([lambda config=config: _run_gemv(a, bs[0], c, out, config, compile_only=True,
                                                        programmatic=chained) for config in round_configs])
        for config in round_configs:
            try:
                with torch.cuda.device(va.device):
                    # the counters are allocated per call in a region, once for all its products
                    counts = torch.zeros(max(1, G.counters(out.shape[1], config)), dtype=torch.int32, device=a.device)
                    torch.cuda.synchronize(a.device)  # graph_median_us runs on a stream of its own
                    times[_name(config)] = timer(
                        lambda config=config, counts=counts: _run_gemv(a, weight(), c, out, config, counts,
                                                                       programmatic=chained))
            except Exception as e:  # noqa: BLE001 - a config that fails to compile or run is no candidate
                logs.lowering.debug("gemv config %s failed for %s: %s", config, tuple(out.shape), e)

    if not rounds:
        time_all(configs)
        return times
    time_all(_first_round(configs))
    time_all(_second_round(configs, times))
    return times


_REFINED = 2  # the fastest tiles of the first round whose other K loops are measured


def _first_round(configs) -> list:
    """Every tile with the K loop as compiled by default."""
    return [c for c in configs if not G.Config(*c).stages and G.Config(*c).unroll == 1]


def _second_round(configs, times: dict) -> list:
    """Note [Bytes in flight]: the pipelined and unrolled loops of the _REFINED fastest tiles of
    the first round, of `configs` (a loop that helps a tile helps it most where the tile already
    streams best; measuring every tile's would double the first call's compiles and timings)."""
    first = sorted((c for c in _first_round(configs) if _name(c) in times), key=lambda c: times[_name(c)])
    best = {G.Config(*c) for c in first[:_REFINED]}
    return [c for c in configs if G.Config(*c) not in best and
            G.Config(*c)._replace(stages=0, unroll=1) in best]


def _name(config) -> str:
    block_n, block_k, split_k, warps, last, stages, unroll = G.Config(*config)
    how = ", LAST_REDUCES" if last else ""
    how += f", STAGES={stages}" if stages else ""
    how += f", UNROLL={unroll}" if unroll > 1 else ""
    return f"gemv(BLOCK_N={block_n}, BLOCK_K={block_k}, SPLIT_K={split_k}{how}, num_warps={warps})"


def _shared_bytes(device: torch.device) -> int:
    """One block's opt-in shared memory on `device`, as Triton checks a compile against it (its
    OutOfResources); H100/H200's off CUDA (the CPU tests)."""
    if device.type != "cuda":
        return G.SHARED_BYTES
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])


def _choose(node, va, vb, vc) -> dict:
    m, k = va.shape
    n = vb.shape[1]
    name = str(node.target)
    layouts = (tuple(va.stride()), tuple(vb.stride()), None if vc is None else (tuple(vc.shape), tuple(vc.stride())))
    device = torch.cuda.get_device_name(va.device) if va.device.type == "cuda" else va.device.type
    key = (name, m, n, k, str(va.dtype), layouts, device, _chained(va.device))
    if key in _CHOICES:
        return _CHOICES[key]
    configs = [c for c in G.CONFIGS if G.useful(n, k, c, m, va.dtype.itemsize, _shared_bytes(va.device))]
    disk_key = disk_cache.key_of("decode-matmul", device, key, disk_cache.source_digest(sys.modules[__name__], G, timing))

    def valid(v) -> bool:  # an entry of another Trident may name a config this one does not measure
        return (isinstance(v, dict) and isinstance(v.get("us"), dict) and
                all(isinstance(t, (int, float)) for t in v["us"].values()) and
                (v.get("config") is None or (isinstance(v["config"], list) and tuple(v["config"]) in configs)))

    cached = disk_cache.load("decode-matmul", disk_key, valid)
    if cached is not None:
        choice = {**cached, "source": disk_cache.where("decode-matmul")}
    else:
        if va.device.type == "cuda":
            with triton_state.exclusive():  # compiles Triton kernels (Note [Triton's interpreter state])
                times = _measure_cuda(node.target, va, vb, vc, configs)
        elif _timer is not None:
            shape = {"rows": m, "cols": n, "inner": k, "dtype": va.dtype}
            times = {"aten": _timer("aten", shape, None)}
            times.update({_name(c): _timer("gemv", shape, c) for c in _first_round(configs)})
            times.update({_name(c): _timer("gemv", shape, c) for c in _second_round(configs, times)})
        else:
            times = {}
        best = min((c for c in configs if _name(c) in times), key=lambda c: times[_name(c)], default=None)
        chosen = best if best is not None and "aten" in times and times[_name(best)] <= _MARGIN * times["aten"] else None
        choice = {"config": list(chosen) if chosen else None, "us": {k2: round(v, 3) for k2, v in times.items()}}
        if "aten" in times and any(_name(c) in times for c in configs):  # a whole measurement only
            disk_cache.store("decode-matmul", disk_key, choice)
    if choice["us"] or va.device.type != "cuda":  # a GPU measurement that failed is tried again later
        _CHOICES[key] = choice
    return choice


# Note [Products sharing a row block]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A decode step multiplies one row block by several weights in a row: q, k and v of the normed
# hidden state, gate and up of the MLP's input. Each product alone is a few microseconds of
# latency more than of bandwidth (k and v read 2 MB each at Llama-1B), and each is a kernel
# boundary. Two or three products of the same `a` (mm, or addmm with a bias row each: same inner
# size, dtype, device and weight layout) become one launch of `gemv_group_kernel` where that is
# measured faster than the sum of what each member runs alone (its operator or its own GEMV
# config): one grid over the members' column blocks. The group is launched where its first
# member was; the members' weights and biases must be defined before it, or be views/attribute
# reads that can be moved there, and nothing between the first and the last member may write
# (no launch, no mutating operator), so that every member reads what it read before. Split-K
# groups sum their pieces in their last program (Note [The last program reduces]). Measured and
# remembered as single products are (`decode-matmul-group` entries), listed by explain().

_GROUPABLE = (aten.mm.default, aten.addmm.default)
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.alias.default, aten.reshape.default}
_MOVABLE = {aten.t.default, aten.permute.default, aten.transpose.int, aten.expand.default, *_VIEWS}


def _rows(a: torch.fx.Node) -> tuple:
    """What identifies a product's rows across the views HF takes of one activation (each
    F.linear of a [B, T, H] input views it as [B * T, H] anew): the node under the views, and the
    layout read."""
    base = a
    while base.op == "call_function" and base.target in _VIEWS and isinstance(base.args[0], torch.fx.Node):
        base = base.args[0]
    va = node_val(a)
    return base, tuple(va.shape), tuple(va.stride()), va.storage_offset()


def _groups(gm, products) -> list:
    """Runs of 2-3 measured products reading one row block that may be one launch, each with the
    nodes to move ahead of its first member: [(members, moves)]. A run of three that cannot be
    one launch is tried as pairs."""
    by_rows: dict = {}
    for p in products:
        node, a, b, c, choice = p
        if node.target not in _GROUPABLE or "aten" not in choice["us"]:
            continue
        vb = node_val(b)
        vc = node_val(c) if c is not None else None
        if vc is not None and (vc.dim() != 1 or tuple(vc.stride()) != (1,)):
            continue
        by_rows.setdefault((_rows(a), tuple(vb.stride()), vb.shape[0], vc is not None), []).append(p)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    groups = []
    for members in by_rows.values():
        i = 0
        while i < len(members) - 1:
            for size in (3, 2):
                chunk = members[i:i + size]
                moves = _moves(chunk, order) if len(chunk) == size and _quiet_between(chunk[0][0], chunk[-1][0]) else None
                if moves is not None:
                    groups.append((chunk, moves))
                    i += size
                    break
            else:
                i += 1
    return groups


def _quiet_between(first, last) -> bool:
    """Nothing strictly between two nodes writes (cse's written_nodes: launches by what they
    write, operators by their schema, anything else as writing anything)."""
    node = first.next
    while node is not last:
        if written_nodes(node):  # [] for none; WRITES_ANYTHING (non-empty) for an unknown effect
            return False
        node = node.next
    return True


def _moves(members, order) -> Optional[list]:
    """The views and attribute reads defining the members' weights and biases that must move
    ahead of the first member (inputs first), or None when one of those cannot move."""
    first = members[0][0]
    moves: list = []

    def ready(x, depth=0) -> bool:
        if not isinstance(x, torch.fx.Node) or order[x] < order[first] or x in moves:
            return True
        movable = x.op == "get_attr" or (x.op == "call_function" and x.target in _MOVABLE)
        if depth > 4 or not movable or not all(ready(y, depth + 1) for y in x.all_input_nodes):
            return False
        moves.append(x)  # after its inputs
        return True

    if not all(ready(x) for _, _, b, c, _ in members for x in (b, c)):
        return None
    return moves


def _group_args(va, vb, ns, has_c: bool, config, count_offset: int = 0, programmatic: bool = False) -> dict:
    block_n, block_k, split_k, warps, last, stages, unroll = G.Config(*config)
    m, k = va.shape
    return {
        "M": m, "K": k, "N0": ns[0], "N1": ns[1], "N2": ns[2] if len(ns) > 2 else 0,
        "stride_am": va.stride(0), "stride_ak": va.stride(1), "stride_bk": vb.stride(0), "stride_bn": vb.stride(1),
        "stride_cn": 1, "count_offset": count_offset, "MEMBERS": len(ns), "HAS_C": has_c, "SPLIT_K": split_k,
        "PRECISION": "ieee" if va.dtype == torch.float32 else "tf32",
        "BLOCK_M": G.block_m(m), "BLOCK_N": block_n, "BLOCK_K": block_k, "LAST_REDUCES": bool(last),
        "STAGES": stages, "UNROLL": unroll, "num_warps": warps,
    } | (_programmatic_args(G.group_grid(ns, config), vb, config, k) if programmatic else {})


def _three(xs, fill) -> list:
    return (list(xs) + [fill] * 3)[:3]


def _run_group(a, bs, cs, outs, config, counts=None, compile_only=False, programmatic=False):
    """A group candidate on real tensors: the one launch _rewrite_group emits (`compile_only`:
    compiled for these arguments, not launched; `programmatic`: as under PDL)."""
    m = a.shape[0]
    ns = [b.shape[1] for b in bs]
    split_k = config[2]
    ws = torch.empty(split_k * m * sum(ns), dtype=torch.float32, device=a.device) if split_k > 1 else outs[0]
    if counts is None:
        counts = torch.zeros(max(1, sum(G.counters(n, config) for n in ns)), dtype=torch.int32, device=a.device)
    args = (a, *_three(bs, bs[0]), *_three([c if c is not None else a for c in cs], a), *_three(outs, outs[0]), ws, counts)
    kwargs = _group_args(a, bs[0], ns, cs[0] is not None, config, programmatic=programmatic)
    if compile_only:
        G.gemv_group_kernel.warmup(*args, grid=G.group_grid(ns, config), **kwargs)
        return
    G.gemv_group_kernel[G.group_grid(ns, config)](*args, **kwargs)


def _measure_group_cuda(va, vbs, vcs, configs, rounds: bool = True) -> dict:
    """As _measure_cuda, for a group: each config's one launch, the weights rotating together."""
    if torch.cuda.is_current_stream_capturing():
        return {}
    times = {}
    chained = _chained(va.device)
    try:
        with torch.cuda.device(va.device):
            g = torch.Generator(device=va.device).manual_seed(0)  # stand-ins drawn on the device
            a = stand_in(va, g)
            timer = _Timer(a, chained)
            size = sum(vb.numel() * vb.element_size() for vb in vbs)
            copies = max(1, min(32, -(-2 * _L2_BYTES // max(1, size))))
            weights = [[stand_in(vb, g) for vb in vbs] for _ in range(copies)]
            cs = [stand_in(vc, g) if vc is not None else None for vc in vcs]
            outs = [torch.empty(a.shape[0], vb.shape[1], dtype=a.dtype, device=a.device) for vb in vbs]
            turn = [0]

            def weight():
                turn[0] += 1
                return weights[turn[0] % copies]

            for round_configs in ((_first_round(configs), None) if rounds else (configs,)):
                if round_configs is None:
                    round_configs = _second_round(configs, times)
                precompile([lambda config=config: _run_group(a, weights[0], cs, outs, config, compile_only=True,
                                                             programmatic=chained) for config in round_configs])
                for config in round_configs:
                    try:
                        counts = torch.zeros(max(1, sum(G.counters(vb.shape[1], config) for vb in vbs)),
                                             dtype=torch.int32, device=a.device)
                        torch.cuda.synchronize(a.device)
                        times[_name(config)] = timer(
                            lambda config=config, counts=counts: _run_group(a, weight(), cs, outs, config, counts,
                                                                            programmatic=chained))
                    except Exception as e:  # noqa: BLE001 - a config that fails is no candidate
                        logs.lowering.debug("gemv group config %s failed: %s", config, e)
    except Exception as e:  # noqa: BLE001 - no measurement: the members stay as they are
        logs.lowering.debug("decode matmul group not measured: %s", e)
        return {}
    return times


def _alone_us(choice: dict) -> float:
    """What a product takes alone: its chosen config's time, or its operator's (inf when an entry
    does not hold it: no group is then made)."""
    name = _name(tuple(choice["config"])) if choice["config"] is not None else "aten"
    return float(choice["us"].get(name, math.inf))


def _choose_group(members) -> dict:
    """The group's choice: {"config": [...] or None, "us": {"members": their sum alone, config: ...}}."""
    node, a, b, c, _ = members[0]
    va, vbs = node_val(a), [node_val(p[2]) for p in members]
    vcs = [node_val(p[3]) if p[3] is not None else None for p in members]
    m, k = va.shape
    ns = [vb.shape[1] for vb in vbs]
    device = torch.cuda.get_device_name(va.device) if va.device.type == "cuda" else va.device.type
    alone = sum(_alone_us(p[4]) for p in members)
    key = ("group", m, tuple(ns), k, str(va.dtype), tuple(va.stride()), tuple(vbs[0].stride()), c is not None, device,
           _chained(va.device))
    if key in _CHOICES:
        return _decide_group(_CHOICES[key], alone)
    shared = _shared_bytes(va.device)
    configs = [cfg for cfg in G.CONFIGS if all(G.useful(n, k, cfg, m, va.dtype.itemsize, shared) for n in ns)]
    disk_key = disk_cache.key_of("decode-matmul-group", device, key, disk_cache.source_digest(sys.modules[__name__], G, timing))

    def valid(v) -> bool:  # the group's own times (each config's): whether to group is decided per use
        return (isinstance(v, dict) and isinstance(v.get("us"), dict) and
                all(isinstance(t, (int, float)) for t in v["us"].values()) and
                all(n in {_name(cfg) for cfg in configs} for n in v["us"]))

    cached = disk_cache.load("decode-matmul-group", disk_key, valid)
    if cached is not None:
        times = {"us": cached["us"], "source": disk_cache.where("decode-matmul-group")}
    else:
        if va.device.type == "cuda":
            with triton_state.exclusive():  # compiles Triton kernels (Note [Triton's interpreter state])
                times = _measure_group_cuda(va, vbs, vcs, configs)
        elif _timer is not None:
            shape = {"rows": m, "cols": ns, "inner": k, "dtype": va.dtype}
            times = {_name(cfg): _timer("group", shape, cfg) for cfg in _first_round(configs)}
            times.update({_name(cfg): _timer("group", shape, cfg) for cfg in _second_round(configs, times)})
        else:
            times = {}
        times = {"us": {k2: round(v, 3) for k2, v in times.items()}}
        if times["us"]:
            disk_cache.store("decode-matmul-group", disk_key, times)
    if times["us"] or va.device.type != "cuda":  # a GPU measurement that failed is tried again later
        _CHOICES[key] = times
    return _decide_group(times, alone)


def _decide_group(times: dict, alone: float) -> dict:
    """The group's choice from its measured times and what its members take alone: the fastest
    config where it beats them by _MARGIN, else None (the members stay as they are)."""
    us = times["us"]
    best = min(us, key=us.get, default=None)
    chosen = list(_config_named(best)) if best is not None and us[best] <= _MARGIN * alone else None
    choice = {"config": chosen, "us": {**us, "members": round(alone, 3)} if us else {}}
    return {**choice, "source": times["source"]} if times.get("source") else choice


def _config_named(name: str) -> tuple:
    return next(cfg for cfg in G.CONFIGS if _name(cfg) == name)


def _rewrite_group(gm, members, config, counts: Optional[torch.fx.Node], count_offset: int) -> None:
    first = members[0][0]
    a = members[0][1]
    va, vbs = node_val(a), [node_val(p[2]) for p in members]
    m = va.shape[0]
    ns = [vb.shape[1] for vb in vbs]
    split_k = config[2]
    with gm.graph.inserting_before(first):
        outs = []
        for node, *_ in members:
            out = gm.graph.call_function(aten.empty_strided.default, ([m, node_val(node).shape[1]], [node_val(node).shape[1], 1]),
                                         {"dtype": va.dtype, "device": va.device})
            out.meta["val"] = node_val(node)
            outs.append(out)
        ws = outs[0]
        if split_k > 1:
            ws = gm.graph.call_function(aten.empty_strided.default, ([split_k * m * sum(ns)], [1]),
                                        {"dtype": torch.float32, "device": va.device})
            ws.meta["val"] = node_val(first).new_empty((split_k * m * sum(ns),), dtype=torch.float32)
        bs, cs = [p[2] for p in members], [p[3] if p[3] is not None else a for p in members]
        emit_launch(gm, G.gemv_group_kernel, G.group_grid(ns, config), {
            **dict(zip(("b0_ptr", "b1_ptr", "b2_ptr"), _three(bs, bs[0]))),
            **dict(zip(("c0_ptr", "c1_ptr", "c2_ptr"), _three(cs, cs[0]))),
            **dict(zip(("out0_ptr", "out1_ptr", "out2_ptr"), _three(outs, outs[0]))),
            "a_ptr": a, "ws_ptr": ws, "count_ptr": counts if counts is not None else outs[0],
            **_group_args(va, vbs[0], ns, members[0][3] is not None, config, count_offset)})
    for (node, *_), out in zip(members, outs):
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)


def describe(choice: dict, shape, group: bool = False, chained: bool = False) -> str:
    """One line of explain(): the product (or group of products), what runs it, and the times
    measured (`chained`: as added after a kernel, Note [Measured after a kernel])."""
    alone = "the members as listed alone" if group else "the operator (cuBLAS on CUDA)"
    what = _name(tuple(choice["config"])) if choice["config"] else alone
    us = ", ".join(f"{k} {v:.2f} us" for k, v in sorted(choice["us"].items(), key=lambda kv: kv[1]))
    where = f", from {choice['source']}" if choice.get("source") else ""
    after = "; each as added after a kernel, under programmatic dependent launch" if chained else ""
    return f"{shape}: {what}" + (f" [measured{where}: {us}{after}]" if us else " [not measured: no GPU and no timer]")


def choose_matmuls(gm: torch.fx.GraphModule) -> int:
    """Rewrite each decode product the measurement gives to Trident's GEMV (alone, or with the
    products sharing its rows: Note [Products sharing a row block]); returns how many products.
    Every product and group considered is listed in gm.meta["trident_matmul_choices"]."""
    mode = knobs.decode_matmuls()
    if not mode:
        return 0
    notes = gm.meta.setdefault("trident_matmul_choices", [])
    products = []  # (node, a, b, c, choice) in graph order
    for node in list(gm.graph.nodes):
        parts = _product(node)
        if parts is None:
            continue
        a, b, c = parts
        if not _fits(node, a, b, c, mode):
            continue
        va, vb = node_val(a), node_val(b)
        vc = node_val(c) if c is not None else None
        choice = _choose(node, va, vb, vc)
        notes.append(describe(choice, _label(node, va, vb), chained=_chained(va.device)))
        products.append((node, a, b, c, choice))
    units = []  # each launch to emit: (members [(node, a, b, c)], config)
    grouped = set()
    for members, moves in _groups(gm, products):
        choice = _choose_group(members)
        notes.append(describe(choice, "group of " + ", ".join(_label(m[0], node_val(m[1]), node_val(m[2]))
                                                             for m in members), group=True,
                              chained=_chained(node_val(members[0][1]).device)))
        if choice["config"] is not None:
            now = {n: i for i, n in enumerate(gm.graph.nodes)}  # an earlier group may have moved some
            for x in moves:  # the weights' views and attribute reads, ahead of the first member
                if now[x] > now[members[0][0]]:
                    members[0][0].prepend(x)
            units.append(([m[:4] for m in members], tuple(choice["config"])))
            grouped.update(m[0] for m in members)
    units += [([p[:4]], tuple(p[4]["config"])) for p in products if p[0] not in grouped and p[4]["config"] is not None]
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    units.sort(key=lambda u: order[u[0][0][0]])
    counts = _counters(gm, units)
    for members, config in units:
        if len(members) == 1:
            _rewrite(gm, *members[0], config, *counts.get(members[0][0], (None, 0)))
        else:
            _rewrite_group(gm, members, config, *counts.get(members[0][0], (None, 0)))
    if units:
        gm.graph.lint()
        gm.recompile()
    return sum(len(members) for members, _ in units)


def _label(node, va, vb) -> str:
    m, k = va.shape
    name = node.target._opname if hasattr(node.target, "_opname") else node.target
    return f"{name} {m}x{k} @ {k}x{vb.shape[1]} {va.dtype}"


def _counters(gm, units) -> dict:
    """The counters of the launches whose last program reduces (Note [The last program reduces]),
    from the graph's one per-call allocation (`call_counters`, shared with the decode attention's);
    {a launch's first product node: (that allocation's node, its offset in it)}."""
    where = {}
    for members, config in units:
        n = sum(G.counters(node_val(b).shape[1], config) for _, _, b, _ in members)
        if n:
            where[members[0][0]] = call_counters(gm, node_val(members[0][0]), n)
    return where


def _rewrite(gm, node, a, b, c, config, counts: Optional[torch.fx.Node], count_offset: int) -> None:
    va, vb = node_val(a), node_val(b)
    vc = node_val(c) if c is not None else None
    m, k = va.shape
    n = vb.shape[1]
    split_k, last = config[2], config[4]
    out_val = node_val(node)
    with gm.graph.inserting_before(node):
        out = gm.graph.call_function(aten.empty_strided.default, ([m, n], [n, 1]),
                                     {"dtype": va.dtype, "device": va.device})
        out.meta["val"] = out_val
        ws = out
        if split_k > 1:
            ws = gm.graph.call_function(aten.empty_strided.default, ([split_k, m, n], [m * n, n, 1]),
                                        {"dtype": torch.float32, "device": va.device})
            ws.meta["val"] = out_val.new_empty((split_k, m, n), dtype=torch.float32)
        emit_launch(gm, G.gemv_kernel, G.grid(n, k, config), {
            "a_ptr": a, "b_ptr": b, "c_ptr": c if c is not None else a, "out_ptr": out, "ws_ptr": ws,
            "count_ptr": counts if counts is not None else out,
            **_launch_args(va, vb, vc, config, m, n, k, count_offset)})
        if split_k > 1 and not last:
            cm, cn = _c_strides(vc, m)
            emit_launch(gm, G.gemv_reduce_kernel, (math.ceil(m * n / _REDUCE_BLOCK), 1, 1), {
                "ws_ptr": ws, "c_ptr": c if c is not None else ws, "out_ptr": out, "M": m, "N": n,
                "stride_cm": cm, "stride_cn": cn, "stride_om": n, "stride_on": 1,
                "HAS_C": c is not None, "SPLIT_K": split_k, "BLOCK": _REDUCE_BLOCK})
    node.replace_all_uses_with(out)
    gm.graph.erase_node(node)
