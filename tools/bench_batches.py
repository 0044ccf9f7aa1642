"""Decode with the batch size changing (issue 11, Note [Symbolic sizes]): the decode step of
tests/decode_model.py (own Triton RMSNorm, rotary, SiLU-mul and residual kernels; ATen matmuls,
attention and cache writes) at Llama-3.2-1B shapes, bf16, KV caches for 8 sequences of which the
first b are live, b changing among 1..8 every 4 steps -- a fresh hidden state per step, as an
embedding lookup makes it, and a new position tensor -- against eager, torch.compile(dynamic=True)
and mode="reduce-overhead" (which re-records per shape), all in one run. Two passes over the same
schedule: cold (every capture, compile and re-recording counted) and warm (µs per step).
trident_untuned is trident.compile without issue 25's passes (tools/knob_sets.py: no
fused glue, no GEMV, Trident's attention unmeasured, no PDL): trident_compile against it is what
those passes change here. Issue 25 item 4: the warm pass's HBM floor (each step's weights and
filled KV positions of its live sequences read once at peak bandwidth) and the fraction of it
reached; with --profile, kernels per step and device time by part over the schedule's first 8
steps, warm. The JSON is rewritten after every variant, so a run cut short keeps what it measured.

    python tools/bench_batches.py --out results/bench_batches.json [--device cuda]
    python tools/bench_batches.py --device cpu --tiny --steps 12     # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.decode_model import Config, decode_step, make_caches, make_weights  # noqa: E402
from tools.knob_sets import KNOBS  # noqa: E402
from tools.device_time import hbm_floor_us, profile_device  # noqa: E402

VARIANTS = ("eager", "trident_compile", "trident_untuned", "compile_dynamic", "compile_reduce_overhead")
PROFILED = 8  # steps of the schedule a profile covers


def kv_bytes(cfg, batch: int, pos: int, itemsize: int) -> int:
    """Bytes of the K and V positions 0..pos of `batch` sequences, every layer."""
    return 2 * cfg.layers * batch * cfg.kv_heads * (pos + 1) * cfg.head_dim * itemsize


def step_bytes(cfg, weight_bytes: int, batches: list, itemsize: int) -> list:
    """What each step of the schedule must read at least (its HBM floor's bytes): every weight,
    and the K and V of the positions written so far of its live sequences (step t writes
    position t mod max_seq, as the benchmark's loop does)."""
    return [weight_bytes + kv_bytes(cfg, b, t % cfg.max_seq, itemsize) for t, b in enumerate(batches)]


def schedule(steps: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    out, b = [], 1
    for t in range(steps):
        if t % 4 == 0:
            b = rng.randint(1, 8)
        out.append(b)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench_batches.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--budget-s", type=float, default=40, help="per variant")
    ap.add_argument("--variants", default="")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--profile", default="trident_compile,trident_untuned",
                    help="variants profiled on CUDA (kernels per step, device time by part)")
    args = ap.parse_args()
    dev = args.device
    if dev == "cpu":
        import trident  # noqa: F401 - its host-only Triton driver runs eager kernels on the CPU

    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    cfg = Config(max_seq=640) if args.tiny else Config(layers=16, hidden=2048, heads=32, kv_heads=8,
                                                       intermediate=8192, max_seq=640)
    weights, cos, sin = make_weights(cfg, dev, dt)
    batches = schedule(args.steps)
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    itemsize = torch.empty((), dtype=dt).element_size()
    floors = [hbm_floor_us(n) for n in step_bytes(cfg, weight_bytes, batches, itemsize)] if dev == "cuda" else []
    result = {"commit": os.environ.get("TRIDENT_COMMIT", "unknown"), "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
              "method": "decode_model step at Llama-3.2-1B shapes, batch among 1..8 every 4 steps, caches of 8 "
                        "sequences sliced to the live batch, fresh hidden state and position per step; cold then warm",
              "batches": batches, "weight_bytes": weight_bytes, "variants": {}}
    if dev == "cuda":
        result["hbm_floor_us_per_step"] = floors

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    def step(fn, t, b, x, caches):
        return fn(x, torch.tensor([t % cfg.max_seq], device=dev), cos, sin, *[c[:b] for c in caches], *weights)

    for variant in [v for v in (args.variants.split(",") if args.variants else VARIANTS) if v]:
        torch._dynamo.reset()
        fn = functools.partial(decode_step, cfg)
        knob_scope = contextlib.nullcontext  # a factory: the timing and the profile each enter a scope
        if variant in ("trident_compile", "trident_untuned"):
            import trident

            fn = trident.compile(fn)
            if variant == "trident_untuned":  # knobs are read as the calls capture and plan
                knob_scope = functools.partial(trident.knobs.scope, **KNOBS[variant])
        elif variant == "compile_dynamic":
            fn = torch.compile(fn, dynamic=True)
        elif variant == "compile_reduce_overhead":
            fn = torch.compile(fn, mode="reduce-overhead")
        caches = make_caches(cfg, dev, dt, batch=8)
        entry = {"cold_us": [], "warm_us": []}
        start = time.perf_counter()
        g = torch.Generator().manual_seed(3)
        try:
            with torch.no_grad(), knob_scope():
                for phase in ("cold_us", "warm_us"):
                    for t, b in enumerate(batches):
                        if time.perf_counter() - start > args.budget_s:
                            entry["cut"] = f"stopped after {args.budget_s:.0f} s in the {phase[:4]} pass"
                            break
                        x = torch.randn(b, cfg.hidden, generator=g).to(device=dev, dtype=dt)
                        sync()
                        t0 = time.perf_counter()
                        out = step(fn, t, b, x, caches)  # a new position tensor made in the step, as a loop does
                        sync()
                        entry[phase].append((time.perf_counter() - t0) * 1e6)
                    if "cut" in entry:
                        break
                entry["last_sum"] = float(out.float().sum())
        except Exception as e:  # a mode that fails is its result
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        if dev == "cuda" and variant in args.profile.split(",") and not {"cut", "error"} & set(entry):
            xs = [torch.randn(b, cfg.hidden, generator=g).to(device=dev, dtype=dt) for b in batches[:PROFILED]]
            try:
                with torch.no_grad(), knob_scope():
                    entry["profile"] = profile_device(
                        lambda fn=fn, xs=xs, caches=caches: [step(fn, t, b, x, caches)
                                                             for t, (b, x) in enumerate(zip(batches, xs))], len(xs))
            except Exception as e:  # the timings stand
                entry["profile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        entry["cold_total_s"] = sum(entry["cold_us"]) / 1e6
        if entry["warm_us"]:
            entry["warm_median_us"] = statistics.median(entry["warm_us"])
            if dev == "cuda":  # issue 25 item 4: the floor of the steps timed, against their time
                warm = len(entry["warm_us"])
                entry["hbm_fraction"] = round(sum(floors[:warm]) / sum(entry["warm_us"]), 3)
        if variant.startswith("trident_") and hasattr(fn, "captures"):
            import trident

            entry["trident"] = {"captures": len(fn.captures), "eager_calls": fn.eager_calls,
                                "cache_info": trident.cache_info(fn)}
        result["variants"][variant] = entry
        print(variant, {k: v for k, v in entry.items() if not k.endswith("_us") or k.endswith("median_us")}, flush=True)
        base = result["variants"].get("eager", {})
        result["ratios"] = {
            f"{v}_warm_over_eager": e["warm_median_us"] / base["warm_median_us"]
            for v, e in result["variants"].items() if "warm_median_us" in e and "warm_median_us" in base
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result.get("ratios", {}), indent=1))


if __name__ == "__main__":
    main()
