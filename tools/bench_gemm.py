"""Host cost of aten::mm inside an SCM: cached cuBLASLt plans (gemm path) vs the typed dispatcher
call, on decode-step shapes, in one process. Also times at::mm from Python for reference.

    python tools/bench_gemm.py --out results/bench_gemm.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import trident  # noqa: E402
from trident.runtime.native import C  # noqa: E402
from tests.kernels import axpy  # noqa: E402

SHAPES = [(1, 2048, 2048), (1, 2048, 512), (1, 2048, 16384), (1, 8192, 2048), (8, 2048, 2048), (1, 896, 9728)]


def chain(a, *ws):
    # 8 products per call so that per-call overhead is amortized; weights passed transposed like F.linear
    outs = [torch.mm(a, w.t()) for w in ws]
    return outs + [axpy(outs[-1], outs[-1])]  # a region needs a Triton launch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench_gemm.json")
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    res = {"commit": os.environ.get("TRIDENT_COMMIT", "unknown"), "device": torch.cuda.get_device_name(), "shapes": {}}
    for m, k, n in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
        row = {}
        for name, paths in (("gemm", "views,constants,typed,gemm"), ("typed", "views,constants,typed")):
            with trident.knobs.scope(native_paths=paths):
                opt = trident.optimize(trident.capture(chain, a, *ws))
            for _ in range(5):
                outs = opt(a, *ws)
            torch.cuda.synchronize()
            with trident.profile() as prof:
                for _ in range(args.iters):
                    opt(a, *ws)
            torch.cuda.synchronize()
            mm = [r for r in prof.grouped() if r.name == "aten::mm"]
            row[f"{name}_host_us_per_mm"] = mm[0].us_per_call if mm else None
            row[f"{name}_bitwise_equal_to_aten"] = all(torch.equal(o, torch.mm(a, w.t())) for o, w in zip(outs, ws))
        samples = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            for _ in range(args.iters):
                for w in ws:
                    torch.mm(a, w.t())
            samples.append((time.perf_counter_ns() - t0) / args.iters / 8 / 1e3)  # host-side issue rate
            torch.cuda.synchronize()
        row["python_torch_mm_us"] = statistics.median(samples)
        # Every algorithm the heuristic ranks: host cost per cublasLtMatmul, bitwise equal to rank 0?
        torch.cuda.synchronize()
        row["algorithms"] = [
            {"rank": int(r), "host_us": round(us, 2), "equal_to_rank0": bool(eq), "workspace": int(nbytes)}
            for r, us, eq, nbytes in C.gemm_survey(a, ws[0].t(), 100)
        ]
        torch.cuda.synchronize()
        res["shapes"][f"{m}x{k}x{n}"] = row
        print(m, k, n, json.dumps(row), flush=True)
    res["cublaslt_available"] = C.cublaslt_available()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
