"""Decode products (M = 1, bf16) of Llama-3.2-1B and Qwen2-0.5B: cuBLAS against every GEMV
configuration Trident measures (trident/kernels/gemv.py CONFIGS) and against a wider sweep of
tile sizes, splits and warps, each timed as choose_matmuls times it (in a CUDA graph, the weight
rotating through copies larger than L2, so that it streams from HBM as in a decode step; with PDL
on, the default, after a kernel as a step launches it: Note [Measured after a kernel]). Also
the groups of Note [Products sharing a row block] (q/k/v, gate/up). Reports microseconds and the
fraction of the H200's HBM bandwidth each reaches, and the fastest of each kind of K loop (as
compiled by default, pipelined, unrolled: Note [Bytes in flight]): which configurations to
measure at all.

    python tools/bench_gemv.py --out results/bench_gemv.json [--models llama,qwen2] [--sweep] [--acc2d]

--acc2d measures the one-row kernels with ACC2D: a [BLOCK_N, BLOCK_K] fp32 accumulator summed
across K once after the loop, instead of a row sum (warp shuffles) per tile.

The candidates compile in parallel worker processes first (into Triton's shared cache), so that
the measurement in this process only loads them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from trident.kernels import gemv as G  # noqa: E402
from tools.device_time import hbm_bytes_per_s  # noqa: E402
from trident.passes import choose_matmuls as CM  # noqa: E402
from trident.passes import timing  # noqa: E402


def _use_acc2d() -> None:
    """--acc2d: every candidate launched with ACC2D (the compile workers, spawned, re-import this
    module and see the variable main() sets)."""
    def with_acc2d(args_of):
        def wrapped(*a, **k):
            return {**args_of(*a, **k), "ACC2D": True}
        return wrapped

    CM._launch_args, CM._group_args = with_acc2d(CM._launch_args), with_acc2d(CM._group_args)


if os.environ.get("BENCH_GEMV_ACC2D") == "1":
    _use_acc2d()
MODELS = {  # hidden, intermediate, heads, kv heads, head dim, vocab, q/k/v bias
    "llama": (2048, 8192, 32, 8, 64, 128256, False),
    "qwen2": (896, 4864, 14, 2, 64, 151936, True),
}


def products(model: str) -> list:
    """(label, K, [N per member], bias) of one decode step's products; groups have 2-3 members."""
    h, i, heads, kv, d, vocab, bias = MODELS[model]
    return [
        ("q", h, [heads * d], bias), ("k/v", h, [kv * d], bias), ("o", heads * d, [h], False),
        ("gate/up", h, [i], False), ("down", i, [h], False), ("lm_head", h, [vocab], False),
        ("group q,k,v", h, [heads * d, kv * d, kv * d], bias), ("group gate,up", h, [i, i], False),
    ]


def sweep(k: int, ns: list) -> list:
    """A wider set than CONFIGS: tiles of 2-32 K elements, 4-16 rows of a tile per thread, grids
    of half a wave to 32 waves of 132 SMs, each K loop of _LOOPS; a split's last program reduces."""
    n = sum(ns)
    out = []
    for block_n in (8, 16, 32, 64, 128):
        for block_k in (64, 128, 256, 512, 1024):
            for warps in (2, 4, 8):
                for split in (1, 2, 4, 8, 16):
                    tile = block_n * block_k
                    programs = sum(-(-x // block_n) for x in ns) * split
                    if not (2048 <= tile <= 32768 and 8 <= tile // (warps * 32) <= 64):
                        continue
                    if not (66 <= programs <= 132 * 32) or (split > 1 and k < block_k * split):
                        continue
                    if block_n > max(32, 2 * (1 << (n - 1).bit_length())):
                        continue
                    for stages, unroll in _LOOPS:
                        config = G.Config(block_n, block_k, split, warps, int(split > 1), stages, unroll)
                        if G.useful(n, k, config):
                            out.append(config)
    return out


# the sweep's K loops (Note [Bytes in flight]): as compiled by default, pipelined in 2-4 stages, unrolled 2 or 4 times
_LOOPS = ((0, 1), (2, 1), (3, 1), (4, 1), (0, 2), (0, 4))


def _loop_kind(config) -> str:
    c = G.Config(*config)
    return "pipelined" if c.stages else ("unrolled" if c.unroll > 1 else "default")


def candidates(k: int, ns: list, wide: bool) -> list:
    base = [c for c in G.CONFIGS if all(G.useful(x, k, c) for x in ns)]
    return base + ([c for c in sweep(k, ns) if c not in base] if wide else [])


def _tensors(k: int, ns: list, bias: bool):
    g = torch.Generator().manual_seed(0)
    a = torch.rand(1, k, generator=g).to(torch.bfloat16).cuda()
    bs = [torch.rand(x, k, generator=g).to(torch.bfloat16).cuda().t() for x in ns]  # nn.Linear weights, .t()
    cs = [torch.rand(x, generator=g).to(torch.bfloat16).cuda() if bias else None for x in ns]
    return a, bs, cs


def _compile(job) -> int:
    """Worker: run each candidate once (compiling it into Triton's cache); returns how many ran."""
    k, ns, bias, configs = job
    a, bs, cs = _tensors(k, ns, bias)
    chained = CM._chained(a.device)  # launched as measured (Note [Measured after a kernel])
    ran = 0
    for config in configs:
        try:
            if len(ns) == 1:
                out = torch.empty(1, ns[0], dtype=a.dtype, device="cuda")
                CM._run_gemv(a, bs[0], cs[0], out, config, programmatic=chained)
            else:
                outs = [torch.empty(1, x, dtype=a.dtype, device="cuda") for x in ns]
                CM._run_group(a, bs, cs, outs, config, programmatic=chained)
            ran += 1
        except Exception:  # noqa: BLE001 - measured as failing later
            pass
    torch.cuda.synchronize()
    return ran


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench_gemv.json")
    ap.add_argument("--models", default="llama,qwen2")
    ap.add_argument("--sweep", action="store_true", help="also the wider sweep of configurations")
    ap.add_argument("--acc2d", action="store_true",
                    help="one row's products accumulated per element of the tile, summed after the loop (ACC2D)")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--calls", type=int, default=timing.CALLS, help="calls in each candidate's graph")
    args = ap.parse_args()
    if args.acc2d and os.environ.get("BENCH_GEMV_ACC2D") != "1":
        os.environ["BENCH_GEMV_ACC2D"] = "1"
        _use_acc2d()
    bench = CM.graph_median_us
    CM.graph_median_us = lambda fn: bench(fn, calls=args.calls)
    cases = [(m, *p) for m in args.models.split(",") for p in products(m)]
    jobs = []
    for _, _, k, ns, bias in cases:
        cands = candidates(k, ns, args.sweep)
        step = max(1, -(-len(cands) // 4))
        jobs += [(k, ns, bias, cands[i:i + step]) for i in range(0, len(cands), step)]
    t0 = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        compiled = sum(ex.map(_compile, jobs))
    peak = hbm_bytes_per_s()  # the card's own (tools/device_time.py)
    res = {"commit": os.environ.get("TRIDENT_COMMIT", "unknown"), "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "acc2d": args.acc2d, "compile_s": round(time.perf_counter() - t0, 1), "compiled": compiled,
           "peak_bytes_per_s": peak, "cases": []}
    print(f"compiled {compiled} candidates in {res['compile_s']} s", flush=True)
    for model, label, k, ns, bias in cases:
        a, bs, cs = _tensors(k, ns, bias)
        cands = candidates(k, ns, args.sweep)
        t = time.perf_counter()
        if len(ns) == 1:
            times = CM._measure_cuda(torch.ops.aten.addmm.default if bias else torch.ops.aten.mm.default,
                                     a, bs[0], cs[0], cands, rounds=False)
        else:
            times = CM._measure_group_cuda(a, bs, cs, cands, rounds=False)  # no 'aten': compare the members' rows
        nbytes = 2 * k * sum(ns) + 2 * k
        ranked = sorted(times.items(), key=lambda kv: kv[1])
        if not ranked:  # nothing could be timed (a failure: see the trident.lowering debug log)
            res["cases"].append({"model": model, "product": label, "K": k, "N": ns, "error": "not measured"})
            print(f"{model} {label}: not measured", flush=True)
            continue
        base = {CM._name(c) for c in G.CONFIGS}
        kinds = {CM._name(c): _loop_kind(c) for c in cands}
        best_by_loop = {}  # the fastest of each kind of K loop: which kinds earn their compiles
        for n, us in ranked:
            if n in kinds and kinds[n] not in best_by_loop:
                best_by_loop[kinds[n]] = [n, round(us, 2)]
        best_base = next(((n, us) for n, us in ranked if n in base), None)
        row = {"model": model, "product": label, "K": k, "N": ns, "bias": bias, "mb": round(nbytes / 1e6, 2),
               "aten_us": round(times["aten"], 2) if "aten" in times else None,
               "best": ranked[0][0], "best_us": round(ranked[0][1], 2),
               "best_fraction_of_peak": round(nbytes / (ranked[0][1] * 1e-6) / peak, 3),
               "best_of_configs": best_base[0] if best_base else None,
               "best_of_configs_us": round(best_base[1], 2) if best_base else None, "best_by_loop": best_by_loop,
               "top": [[n, round(us, 2), round(nbytes / (us * 1e-6) / peak, 3)] for n, us in ranked[:12]],
               "measured": len(times), "seconds": round(time.perf_counter() - t, 1)}
        if "aten" in times:
            row["aten_fraction_of_peak"] = round(nbytes / (times["aten"] * 1e-6) / peak, 3)
        res["cases"].append(row)
        print(f"{model} {label} K={k} N={ns}: aten {row['aten_us']} us, best {row['best']} {row['best_us']} us "
              f"({row['best_fraction_of_peak']:.0%} of peak); of CONFIGS {row['best_of_configs']} "
              f"{row['best_of_configs_us']} us", flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
