"""What a prompt length new to the process costs each SDPA backend at a prefill's attention, and
what a length already seen costs: Llama-3.2-1B's shapes (32 query heads, keys and values repeated
to 32 as HF's repeat_kv does, head dim 64, bf16) over a StaticCache of 512 positions with HF's
boolean mask [1, 1, L, 512]. Question (issue 25, results at 0bf8375): a new prompt length costs
~42 ms in `aten::_cudnn_attention_forward` over 16 layers; does another backend serve the same call
without that cost, and how much slower is it warm? Each backend runs in a process of its own (the
cuDNN graph cache is process-wide) and calls the backend once first at a length not measured (the
process's first call loads libraries and makes handles: 810 ms for cuDNN at c79fb30). Prints one
JSON line per backend.

    python tools/probe_sdpa_prefill.py [--lengths 97,211,333,401] [--layers 16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
CACHE = 512


def one(backend: str, lengths: list[int], layers: int) -> dict:
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    k = torch.randn(1, 32, CACHE, 64, device=dev, dtype=dt, generator=g)
    v = torch.randn(1, 32, CACHE, 64, device=dev, dtype=dt, generator=g)
    out = {"backend": backend, "new_ms": [], "warm_us": [], "max_abs_vs_math": []}
    warm = max(lengths) + 1  # the process's first call (handles, libraries) at a length not measured
    with sdpa_kernel(BACKENDS[backend]):
        try:
            F.scaled_dot_product_attention(torch.randn(1, 32, warm, 64, device=dev, dtype=dt), k, v)
        except RuntimeError:
            pass  # the backend refuses: said below, per length
    for L in lengths:
        q = torch.randn(1, 32, L, 64, device=dev, dtype=dt, generator=g)
        causal = torch.zeros(1, 1, L, CACHE, device=dev, dtype=torch.bool)
        causal[..., :L] = torch.ones(L, L, device=dev, dtype=torch.bool).tril()  # positions 0..L-1 filled
        try:
            with sdpa_kernel(BACKENDS[backend]):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(layers):  # a model's layers, each its own call of one shape
                    y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
                torch.cuda.synchronize()
                out["new_ms"].append(round((time.perf_counter() - t0) * 1e3, 2))
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                for _ in range(5):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
                start.record()
                for _ in range(50):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
                end.record()
                torch.cuda.synchronize()
                out["warm_us"].append(round(start.elapsed_time(end) * 1e3 / 50, 2))
            with sdpa_kernel(SDPBackend.MATH):
                want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=causal)
            out["max_abs_vs_math"].append(round((y.float() - want).abs().max().item(), 4))
        except RuntimeError as e:
            out["error"] = str(e).splitlines()[0][:300]
            break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="97,211,333,401")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--backends", default="cudnn,efficient,flash")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    if max(lengths) >= CACHE:
        sys.exit(f"--lengths: expected prompt lengths below the cache's {CACHE} positions; got {args.lengths}")
    unknown = sorted(set(args.backends.split(",")) - set(BACKENDS))
    if unknown:
        sys.exit(f"--backends: expected names from {', '.join(BACKENDS)}; got {', '.join(unknown)}")
    if args.one:
        print(json.dumps(one(args.one, lengths, args.layers)), flush=True)
        return
    for b in args.backends.split(","):
        subprocess.run([sys.executable, __file__, "--one", b, "--lengths", args.lengths,
                        "--layers", str(args.layers)], check=False)


if __name__ == "__main__":
    main()
