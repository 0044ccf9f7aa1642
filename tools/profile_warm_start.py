"""Where a warm start's time goes (issue 11, point 5: the 16-layer decode region in <= 1 s).

A first process captures and optimizes the decode step of tests/decode_model.py with
TRIDENT_CACHE_DIR set (filling it); a second process does the same under cProfile, so every
specialization comes back from the cache, and prints the capture and optimize times and the
functions with the most cumulative time. Not a test: a measurement for the machine it runs on.

    python tools/profile_warm_start.py --layers 16 --device cuda --out results/profile_warm.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def once(layers: int, device: str, profile: bool) -> str:
    import torch

    import trident
    from tests.decode_model import decode_call

    step, args = decode_call(layers, device)
    prof = cProfile.Profile()
    if profile:
        prof.enable()
    t0 = time.perf_counter()
    gm = trident.capture(step, *args)
    t1 = time.perf_counter()
    opt = trident.optimize(gm)
    t2 = time.perf_counter()
    if profile:
        prof.disable()
    opt(*args)
    if device == "cuda":
        torch.cuda.synchronize()
    t3 = time.perf_counter()
    text = f"layers={layers} capture {t1 - t0:.3f} s + optimize {t2 - t1:.3f} s; first call {t3 - t2:.3f} s\n"
    if profile:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(60)
        text += out.getvalue()
    return text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="")
    ap.add_argument("--one", choices=["cold", "warm"], default=None)
    args = ap.parse_args()
    if args.one:
        print(once(args.layers, args.device, args.one == "warm"))
        return
    with tempfile.TemporaryDirectory() as cache:
        os.chmod(cache, 0o700)
        env = dict(os.environ, TRIDENT_CACHE_DIR=cache)
        report = ""
        for which in ("cold", "warm"):
            r = subprocess.run([sys.executable, __file__, "--one", which, "--layers", str(args.layers), "--device",
                                args.device], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(r.stderr[-3000:])
            report += f"== {which} process ==\n" + r.stdout
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"commit {os.environ.get('TRIDENT_COMMIT', 'unknown')}\n" + report)


if __name__ == "__main__":
    main()
