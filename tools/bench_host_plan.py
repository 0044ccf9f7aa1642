"""Hit-path cost of walking a host plan (Note [Host plans]): a CPU region of one tiny Triton
launch and 1,200 cheap operator steps (two native views and an add, 400 times), timed with the
native C++ loop (`run_loop`: no Python, no dispatcher around the region), median of batches.
Run it at two commits to A/B the host program's step execution:

    python tools/bench_host_plan.py [--batches 15] [--calls 20]

Measured 2026-12-01 on the CPU machine, dcd5986 (host plans) vs ac4472a (compiled steps), same
session: 2922 vs 2921 us per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import trident  # noqa: E402
from tests import kernels as K  # noqa: E402
from trident.optimize import _regions  # noqa: E402
from trident.runtime import native  # noqa: E402


def fn(x, y):
    t = K.axpy(x, y)
    for _ in range(400):
        t = t.view(8, 2).view(16) + 1.0
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    x, y = torch.randn(16), torch.randn(16)
    opt = trident.optimize(trident.capture(fn, x, y))
    (rt,) = _regions(opt)
    opt(x, y)
    samples = [native.C.run_loop(rt.region_id, [x, y], args.calls) / args.calls / 1e3 for _ in range(args.batches)]
    print(f"steps={len(rt.program.steps)} median_us_per_call={statistics.median(samples):.1f} min={min(samples):.1f}")


if __name__ == "__main__":
    main()
