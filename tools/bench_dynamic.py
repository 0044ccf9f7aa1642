"""Prefills of varying length through one model (issue 11, Note [Symbolic sizes]): Hugging Face
Llama-3.2-1B shapes (random weights), bf16, StaticCache, Liger-Kernel's Triton kernels patched in
(or the plain model), prompts of random lengths in 1..512 -- a fresh `input_ids` tensor per call,
as a tokenizer makes it -- against eager, torch.compile(dynamic=True) and torch.compile
mode="reduce-overhead" (which re-records a CUDA graph per shape), all in one run.

Two passes over the same 32 lengths: the first (cold) counts everything a user waits for --
captures, compiles, re-recordings, Trident's new specializations; the second (warm) is the
per-call cost once every length has been seen. Reported: total seconds of the cold pass, the
median ms per prefill of the warm pass, and ratios against eager. trident_untuned is
trident.compile without issue 25's passes (tools/knob_sets.py): trident_compile
against it is what those passes change here.

    python tools/bench_dynamic.py --out results/bench_dynamic.json [--kernels liger] [--device cuda]
    python tools/bench_dynamic.py --tiny --device cpu        # a smoke run on the CPU
    python tools/bench_dynamic.py --variants trident_compile,trident_no_pdl --profile-call 5
        # where the 6th cold call's time goes: its host functions (cProfile) and its kernels

Variants: eager, torch.compile's two, and trident.compile under any knob set of
tools/knob_sets.py (trident_compile, trident_untuned, trident_no_pdl, ...).

Each variant runs in a process of its own, as a user's program would: the process-wide caches a
cold pass fills -- cuDNN's attention graphs (one per prompt length: ~40 ms each on an H100),
cuBLAS's heuristics, the allocator's blocks, Triton's loaded kernels -- are never filled by a
variant that ran before (in one process, the variants after eager had found eager's cuDNN graphs
built: their cold passes looked ~40 ms a length cheaper than a user's first run); nor are the
on-disk caches of Triton and Inductor: each variant's process gets empty ones (`--shared-caches`
keeps the environment's). Eager runs first;
its last logits are the reference the others are checked against.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import trident  # noqa: E402  (on a machine without a GPU its host-only driver runs the eager kernels too)
from tools.bench_hf import _sync, build_model  # noqa: E402
from tools.knob_sets import KNOBS, for_device  # noqa: E402

VARIANTS = ("eager", "trident_compile", "trident_untuned", "compile_dynamic", "compile_reduce_overhead")


def lengths(n: int, top: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    out = [1, top] + [rng.randint(1, top) for _ in range(n - 2)]
    rng.shuffle(out)
    return out


def make_forward(variant: str, model):
    if variant == "eager":
        return model.forward
    if variant in KNOBS:
        return trident.compile(model.forward)
    if variant == "compile_dynamic":
        return torch.compile(model.forward, dynamic=True)
    if variant == "compile_reduce_overhead":
        return torch.compile(model.forward, mode="reduce-overhead")
    raise ValueError(variant)


def profiled(fn, dev: str, top: int = 25) -> tuple:
    """fn()'s result and where its time went: the host functions by cumulative and by own time (cProfile),
    the host-side events by their own time and the kernels by device time (torch.profiler), `top`
    of each."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    host = cProfile.Profile()
    with profile(activities=activities) as prof:
        host.enable()
        result = fn()
        _sync(dev)
        host.disable()
    def listing(order: str) -> list:
        text = io.StringIO()
        pstats.Stats(host, stream=text).sort_stats(order).print_stats(top)
        return [line.strip() for line in text.getvalue().splitlines() if line.strip()]

    averages = prof.key_averages()
    events = [e for e in averages if e.device_type == torch.autograd.DeviceType.CUDA] if dev == "cuda" else []
    kernels = sorted(events, key=lambda e: -e.self_device_time_total)[:top]
    # host-side events: operators and the CUDA runtime and driver calls the profiler sees (launches,
    # allocations, synchronizations), by their own host time
    calls = sorted((e for e in averages if e.device_type != torch.autograd.DeviceType.CUDA),
                   key=lambda e: -e.self_cpu_time_total)[:top]
    return result, {"host_cumulative": listing("cumulative"), "host_self": listing("tottime"),
                    "host_events": [{"name": e.key[:100], "n": e.count, "us": e.self_cpu_time_total} for e in calls],
                    "device_us": sum(e.self_device_time_total for e in events),
                    "kernels": [{"name": e.key[:100], "n": e.count, "us": e.self_device_time_total} for e in kernels]}


def run_variant(variant, model, cfg, dev, sizes, budget_s, reference, profile_call=None):
    from transformers import StaticCache

    torch._dynamo.reset()
    fwd = make_forward(variant, model)
    cache = StaticCache(config=cfg, max_cache_len=max(sizes) + 16)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, cfg.vocab_size, (1, n), generator=g) for n in sizes]
    out = {"cold_ms": [], "warm_ms": []}
    start = time.perf_counter()
    last = None
    knob_scope = contextlib.nullcontext()
    if variant in KNOBS:  # knobs are read as the calls capture and plan
        knob_scope = trident.knobs.scope(**for_device(variant, dev))
    with torch.no_grad(), knob_scope:
        for phase in ("cold_ms", "warm_ms"):
            for ids_cpu in prompts:
                if time.perf_counter() - start > budget_s:
                    out["cut"] = f"stopped after {budget_s:.0f} s in the {phase[:4]} pass"
                    break
                ids = ids_cpu.to(dev)  # a fresh tensor per call
                cache.reset()
                _sync(dev)
                t0 = time.perf_counter()
                call = functools.partial(lambda i: fwd(input_ids=i, past_key_values=cache, use_cache=True).logits, ids)
                if phase == "cold_ms" and len(out[phase]) == profile_call:
                    logits, out["profile"] = profiled(call, dev)
                    out["profile"].update(call=profile_call, length=ids.shape[1])
                else:
                    logits = call()
                _sync(dev)
                out[phase].append((time.perf_counter() - t0) * 1e3)
                last = logits[:, -1].float()
            if "cut" in out:
                break
    out["cold_total_s"] = sum(out["cold_ms"]) / 1e3
    if out["warm_ms"]:
        out["warm_median_ms"] = statistics.median(out["warm_ms"])
    if reference is not None and last is not None and len(out["warm_ms"]) == len(sizes):
        ref = reference.to(last.device)
        out["last_logits_rel_diff"] = float((last - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
    if variant in KNOBS:
        out["trident"] = {"captures": len(fwd.captures), "eager_calls": fwd.eager_calls,
                          "cache_info": trident.cache_info(fwd)}
        text = trident.explain(fwd)
        out["trident"]["symbolic"] = "symbolic sizes:" in text
    return out, last


def run_one(kernels: str, variant: str, args, reference_path: str) -> dict:
    """One variant in this process (--one): the model built afresh, eager's last logits read from
    `reference_path` (written there when the variant is eager)."""
    dev = args.device
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    sizes = lengths(args.calls, args.max_len)
    cfg, model = build_model("llama", kernels, dev, dt, args.tiny)
    reference = torch.load(reference_path) if variant != "eager" and os.path.exists(reference_path) else None
    entry, last = run_variant(variant, model, cfg, dev, sizes, args.budget_s, reference, args.profile_call)
    if variant == "eager" and last is not None and len(entry["warm_ms"]) == len(sizes):  # the last prompt's
        torch.save(last.cpu(), reference_path)
    entry["device"] = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    return entry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench_dynamic.json")
    ap.add_argument("--kernels", default="liger")
    ap.add_argument("--variants", default="")
    ap.add_argument("--calls", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--budget-s", type=float, default=150, help="per variant (its cold pass: ~35-90 s on an H100)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--shared-caches", action="store_true",
                    help="let the variants share Triton's and Inductor's caches (the environment's); by default "
                         "each variant's process gets empty ones, so that cold passes compare (at 05bed9c the "
                         "second variant's planning call took 9.8 s against the first's 23.2, its kernels compiled)")
    ap.add_argument("--profile-call", type=int, default=None,
                    help="profile this cold call (0-based) of each variant: host functions and kernels (its time "
                         "in cold_ms includes the profilers')")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # kernels:variant in this process
    ap.add_argument("--reference", default="", help=argparse.SUPPRESS)  # eager's last logits (torch.save)
    args = ap.parse_args()
    if args.one:
        kernels, variant = args.one.split(":")
        t0 = time.perf_counter()
        try:
            entry = run_one(kernels, variant, args, args.reference)
        except Exception as e:  # a mode that fails is reported as its result
            entry = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        entry["wall_s"] = time.perf_counter() - t0
        with open(args.out, "w") as f:
            json.dump(entry, f, indent=1, default=str)
        return
    dev = args.device
    sizes = lengths(args.calls, args.max_len)
    variants = [v for v in (args.variants.split(",") if args.variants else VARIANTS) if v]
    variants.sort(key=lambda v: v != "eager")  # eager first: the reference
    result = {
        "commit": os.environ.get("TRIDENT_COMMIT", "unknown"),
        "device": None,  # a variant's process names it: this one opens no CUDA context
        "torch": torch.__version__,
        "method": "HF Llama-3.2-1B shapes, StaticCache, prefill of each length on a reset cache; cold pass then "
                  "warm pass over the same lengths; fresh input_ids per call; each variant in a process of its own "
                  "(its wall_s includes building the model)",
        "lengths": sizes,
        "cases": {},
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for kernels in args.kernels.split(","):
        case = {}
        with tempfile.TemporaryDirectory(prefix="bench_dynamic_") as tmp:
            reference = os.path.join(tmp, "eager_last_logits.pt")
            for v in variants:
                part = os.path.join(tmp, f"{v}.json")
                cmd = [sys.executable, __file__, "--one", f"{kernels}:{v}", "--out", part, "--reference", reference,
                       "--calls", str(args.calls), "--max-len", str(args.max_len), "--budget-s", str(args.budget_s),
                       "--device", dev] + (["--tiny"] if args.tiny else []) + (
                       ["--profile-call", str(args.profile_call)] if args.profile_call is not None else [])
                env = dict(os.environ)
                if not args.shared_caches:  # each variant compiles as a first run does, whatever ran before it
                    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
                        env[var] = tempfile.mkdtemp(prefix=f"{var.lower()}_", dir=tmp)
                rc = subprocess.run(cmd, env=env).returncode
                try:
                    with open(part) as f:
                        entry = json.load(f)
                except (OSError, ValueError):
                    entry = {"error": f"the variant's process exited with {rc}"}
                case[v] = entry
                result["device"] = result["device"] or entry.get("device")
                print(v, {k: x for k, x in entry.items() if not k.endswith("_ms") and k != "profile"}, flush=True)
        base = case.get("eager", {})
        case["ratios"] = {
            f"{v}_warm_over_eager": case[v]["warm_median_ms"] / base["warm_median_ms"]
            for v in variants if "warm_median_ms" in case.get(v, {}) and "warm_median_ms" in base
        }
        case["ratios"].update({
            f"{v}_cold_over_eager": case[v]["cold_total_s"] / base["cold_total_s"]
            for v in variants if "cold_total_s" in case.get(v, {}) and base.get("cold_total_s")
        })
        result["cases"][f"llama_{kernels}"] = case
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps({k: v["ratios"] for k, v in result["cases"].items()}, indent=1))


if __name__ == "__main__":
    main()
