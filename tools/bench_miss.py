"""What a miss costs: the decode step of tests/decode_model.py (own Triton RMSNorm, rotary,
SiLU-mul and residual kernels; ATen matmuls, attention, cache writes and views) at several
layer counts, float32, on the CPU (default) or CUDA. Per layer count, in one process:

  capture        trident.capture (make_fx with Triton launches)
  passes         trident.optimize (the FX passes, partition, outline; no native code yet)
  (optimize builds specialization 0 for the captured inputs' facts)
  first call     the captured inputs again: a hit
  miss           a call whose hidden state sits 4 bytes off a 16-byte boundary (Triton's key
                 changes for the kernels that read it): specialization 1 is built

and for each miss the split Trident records (SCMRuntime.build_costs): plan (propagation,
layouts, keys, native tables), Triton (its compiler, JITFunction.warmup), torch-dialect import,
host MLIR emission, LLVM (MLIR's LLVM lowering + the ExecutionEngine). Issue 11's target: the
native build of one new specialization of a 24-layer region (plan + MLIR + LLVM, Triton's
compile excluded) <= 50 ms.

    python tools/bench_miss.py --layers 2,16,24 --out results/bench_miss.json [--warm]

--warm runs each layer count a second time in a new process with the first's TRIDENT_CACHE_DIR
(Note [Persistent plans]): the warm start (issue 11's target for the 16-layer region: <= 1 s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
os.environ.setdefault("TRIDENT_TUNING_DIR", "")  # a first call measures, as a first run (Note [Kept measurements])

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

PHASES = ("plan_s", "triton_s", "torch_mlir_s", "host_mlir_s", "llvm_s")


def run(layers: int, device: str) -> dict:
    import trident
    from tests.decode_model import decode_call, misaligned
    from trident.optimize import _regions

    step, (x, *rest) = decode_call(layers, device)
    out: dict = {"layers": layers}
    t0 = time.perf_counter()
    gm = trident.capture(step, x, *rest)
    out["capture_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    opt = trident.optimize(gm)
    out["passes_s"] = time.perf_counter() - t0
    (rt,) = _regions(opt)
    out["launches"], out["operator_calls"] = len(rt.program.launches), len(rt.program.atens)

    def split(cost: dict) -> dict:
        cost = dict(cost)
        cost["native_build_s"] = cost["plan_s"] + cost["torch_mlir_s"] + cost["host_mlir_s"] + cost["llvm_s"]
        return cost

    out["optimize_build"] = [split(c) for c in rt.build_costs]  # specializations optimize built
    for label, hidden in (("first_call", x), ("miss", misaligned(x))):
        built = len(rt.build_costs)
        t0 = time.perf_counter()
        opt(hidden, *rest)
        if device == "cuda":
            torch.cuda.synchronize()
        out[label] = {"wall_s": time.perf_counter() - t0, "builds": [split(c) for c in rt.build_costs[built:]]}
    out["specializations"] = len(rt.scm.specializations)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="2,16,24")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="results/bench_miss.json")
    ap.add_argument("--warm", action="store_true",
                    help="also a second process with the first's TRIDENT_CACHE_DIR: the warm start (Note [Persistent plans])")
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)  # one layer count in this process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run(args.one, args.device)))
        return
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    result = {"commit": os.environ.get("TRIDENT_COMMIT", commit or "unknown"), "device": args.device,
              "torch": torch.__version__, "method": __doc__.split("\n\n")[0].replace("\n", " "), "runs": []}
    import tempfile

    for layers in map(int, args.layers.split(",")):
        # each layer count in a fresh process: no kernel or MLIR state carries over
        plans = tempfile.mkdtemp(prefix="trident-plans-")
        env = dict(os.environ, TRIDENT_CACHE_DIR=plans) if args.warm else None
        proc = subprocess.run([sys.executable, __file__, "--one", str(layers), "--device", args.device],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            result["runs"].append({"layers": layers, "error": proc.stderr[-2000:]})
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        if args.warm:  # the same region in a second process: every specialization restored
            warm = subprocess.run([sys.executable, __file__, "--one", str(layers), "--device", args.device],
                                  capture_output=True, text=True, env=env)
            if warm.returncode == 0:
                r["warm"] = json.loads(warm.stdout.strip().splitlines()[-1])
                w = r["warm"]
                print(f"layers={layers:3d} warm start: capture {w['capture_s']:.2f} s + optimize {w['passes_s']:.2f} s "
                      f"(restored {sum(bool(c.get('restored')) for c in w['optimize_build'])} specialization(s); "
                      f"first call {w['first_call']['wall_s'] * 1e3:.0f} ms, the misaligned call "
                      f"{w['miss']['wall_s'] * 1e3:.0f} ms, {len(w['miss']['builds'])} built)", flush=True)
            else:
                r["warm"] = {"error": warm.stderr[-2000:]}
        result["runs"].append(r)
        rows = [("optimize", r["passes_s"], c) for c in r["optimize_build"]]
        rows += [(label, r[label]["wall_s"], c) for label in ("first_call", "miss") for c in r[label]["builds"]]
        for label, wall, c in rows:
            print(f"layers={layers:3d} {label:10s} spec {c['specialization']} (wall {wall * 1e3:8.1f} ms) | native "
                  f"build {c['native_build_s'] * 1e3:8.1f} ms = plan {c['plan_s'] * 1e3:7.1f} + torch-mlir "
                  f"{c['torch_mlir_s'] * 1e3:6.1f} + host mlir {c['host_mlir_s'] * 1e3:6.1f} + llvm "
                  f"{c['llvm_s'] * 1e3:8.1f} | triton {c['triton_s'] * 1e3:8.1f} ms", flush=True)
        print(f"layers={layers:3d} capture {r['capture_s']:.2f} s, passes {r['passes_s']:.2f} s, "
              f"{r['launches']} launches, {r['operator_calls']} operator calls", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
