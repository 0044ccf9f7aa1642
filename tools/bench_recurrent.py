"""Decode of a recurrent model that keeps its state the way real Triton libraries do
(tests/recurrent_model.py: per layer a dict whose state tensor is REPLACED every step by a
Triton kernel's new output, a Python int counting tokens read as a position), ALL in one run:

  eager                     model(x, cache)
  compile_default           torch.compile(model)
  compile_reduce_overhead   torch.compile(model, mode="reduce-overhead")
  trident_compile           trident.compile(model)
  trident_backend           torch.compile(model, backend="trident")
  graph_floor               the eager step captured once in a torch.cuda.CUDAGraph over static
                            state buffers (the new states copied back into them inside the
                            graph); each step copies its input in and replays

    python tools/bench_recurrent.py --out results/bench_recurrent.json [--layers 12 --dim 1024]

Each step's input is the previous step's output (a fresh tensor) and the cache is the caller's
object, as a library's decode loop keeps them. Per variant: a 64-step check against eager from
the same start (outputs, final states and counter; bf16 tolerance), which is also the warm-up
with `warm` more decodes (graphs of the first steps of a request are recorded over requests),
then ms/step = wall time of `steps` steps (synchronized before and after) / steps, median over
`reps` decodes from a fresh cache. Warm-up steps a variant spends compiling or capturing are
reported as `first_steps_s`. Each variant also gives the HBM floor (every weight read once, each
layer's state read and written) and its fraction of it; --profile's variants (CUDA) their host
time and their kernels per step, device time by part and idle time (tools/device_time.py).
--device cpu --tiny: a smoke test of the script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.recurrent_model import RecurrentCache, RecurrentModel  # noqa: E402
from tools.device_time import hbm_floor_us, profile_device  # noqa: E402
os.environ.setdefault("TRIDENT_TUNING_DIR", "")  # a first call measures, as a first run (Note [Kept measurements])

VARIANTS = ("eager", "graph_floor", "trident_compile", "trident_backend", "compile_default", "compile_reduce_overhead")


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def _decode(step, x, steps, cache=None):
    cache = RecurrentCache() if cache is None else cache
    outs = []
    for _ in range(steps):
        x = step(x, cache)
        outs.append(x)
    return outs, cache


def graph_floor(model, x0, warm_steps: int):
    """The step replayed as one CUDA graph over static state buffers (Note in the docstring)."""
    cache = RecurrentCache()
    with torch.no_grad():
        _decode(model, x0, warm_steps, cache)  # states exist, the counter is past 0 and 1
        static_x = x0.clone()
        states = [s["recurrent_state"] for s in cache.states]
        seen = cache.seen
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                model(static_x, cache)
        torch.cuda.current_stream().wait_stream(s)
        for d, t in zip(cache.states, states):
            d["recurrent_state"] = t
        cache.seen = seen
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static_x, cache)
            for d, t in zip(cache.states, states):
                t.copy_(d["recurrent_state"])
        for d, t in zip(cache.states, states):
            d["recurrent_state"] = t

    def step(x, _cache):
        static_x.copy_(x)
        graph.replay()
        return out.clone()  # a fresh tensor per step, as the other variants return

    return step


def _host_profile(step, x0, steps: int) -> dict:
    """Where the host's time goes in one decode: the wall time of issuing `steps` steps without
    waiting for the GPU (when the host is the slower side this is the step time), the
    synchronizing calls torch reports (set_sync_debug_mode), and the Python functions with the
    most self time (cProfile, which slows Python down: read it as proportions)."""
    import cProfile
    import pstats
    import warnings

    torch.cuda.synchronize()
    t = time.perf_counter()
    _decode(step, x0.clone(), steps)
    host = (time.perf_counter() - t) / steps * 1e3
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            _decode(step, x0.clone(), steps)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [str(w.message)[:200] for w in caught
             if "synchroniz" in str(w.message) and "prototype" not in str(w.message)]  # not its own notice
    prof = cProfile.Profile()
    prof.enable()
    _decode(step, x0.clone(), steps)
    prof.disable()
    torch.cuda.synchronize()
    rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:20]
    return {"host_issue_ms_per_step": round(host, 4), "syncs_per_decode": len(syncs), "first_syncs": syncs[:3],
            "python_self_us_per_step": [
                {"fn": f"{os.path.basename(k[0])}:{k[1]}({k[2]})", "us": round(v[2] / steps * 1e6, 1), "calls": v[1]}
                for k, v in rows]}


def run_variant(name, model, x0, args) -> dict:
    import trident
    from trident.frontends.dynamo import compiled_graphs

    dev = args.device
    torch._dynamo.reset()
    start = len(compiled_graphs())
    with torch.no_grad():
        want, want_cache = _decode(model, x0, args.check)
    t0 = time.perf_counter()
    if name == "eager":
        step = model
    elif name == "graph_floor":
        step = graph_floor(model, x0, 4)
    elif name == "trident_compile":
        step = trident.compile(model)
    elif name == "trident_backend":
        step = torch.compile(model, backend="trident")
    elif name == "compile_default":
        step = torch.compile(model)
    else:
        compiled = torch.compile(model, mode="reduce-overhead")

        def step(x, cache):
            # CUDA-graph trees overwrite a graph's outputs on its next replay: a new step begins
            # here, and the output kept by the caller is cloned (what PyTorch's docs prescribe)
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(x, cache).clone()
            for d in cache.states:  # the next replay overwrites the graph's outputs the cache holds
                d["recurrent_state"] = d["recurrent_state"].clone()
            return out
    out = {}
    with torch.no_grad():
        got, cache = _decode(step, x0, args.check)
        _sync(dev)
        out["first_steps_s"] = round(time.perf_counter() - t0, 2)
        if name != "graph_floor":
            rel = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(got, want))
            states = max(((a["recurrent_state"].float() - b["recurrent_state"].float()).abs().max()
                          / b["recurrent_state"].float().abs().max()).item()
                         for a, b in zip(cache.states, want_cache.states))
            out["check"] = {"max_rel_output_diff": rel, "max_rel_state_diff": states,
                            "counter_equal": cache.seen == want_cache.seen}
        for _ in range(args.warm):  # more decodes from fresh caches: what is recorded per request settles
            _decode(step, x0.clone(), args.steps)
        times = []
        for _ in range(args.reps):
            x = x0.clone()
            c = RecurrentCache()
            _sync(dev)
            t = time.perf_counter()
            _decode(step, x, args.steps, c)
            _sync(dev)
            times.append((time.perf_counter() - t) / args.steps * 1e3)
        if dev == "cuda" and name in args.profile.split(","):
            out["host"] = _host_profile(step, x0, args.steps)
            out["device"] = profile_device(lambda: _decode(step, x0.clone(), 8), 8)  # per step
    out["ms_per_step"] = statistics.median(times)
    out["ms_per_step_samples"] = [round(v, 4) for v in times]
    if name in ("trident_compile", "trident_backend"):  # where the time goes: regions, graphs, cuts
        texts = [trident.explain(step)] if name == "trident_compile" else [
            trident.explain(g) for g in compiled_graphs()[start:]]
        out["explain"] = [line[:300] for t in texts for line in t.splitlines()
                          if not line.startswith(("    launch", "    guard", "  size guard", "  symbolic trace"))][:80]
    if name == "trident_compile":
        out["captures"] = len(step.captures)
        out["eager_calls"] = step.eager_calls
        out["eager_log"] = list(step.eager_log)
    if name == "trident_backend":
        graphs = compiled_graphs()[start:]
        out["dynamo_graphs"] = len(graphs)
        out["captures"] = sum(len(g.captures) for g in graphs)
        out["eager_calls"] = sum(g.eager_calls for g in graphs)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="results/bench_recurrent.json")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--check", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warm", type=int, default=2, help="decodes after the checked one, before timing")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--variants", default="")
    p.add_argument("--budget-s", type=int, default=300, help="per variant process")
    p.add_argument("--profile", default="trident_compile,trident_backend,graph_floor",
                   help="variants whose host and device time are profiled (CUDA)")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--variant", default="", help=argparse.SUPPRESS)  # one variant in this process
    args = p.parse_args()
    if args.tiny:
        args.layers, args.dim, args.steps, args.check, args.reps = 2, 16, 8, 8, 2
    variants = [v for v in (args.variants.split(",") if args.variants else VARIANTS)
                if v != "graph_floor" or args.device == "cuda"]
    if args.variant:  # child: one variant, JSON on the last line
        dt = torch.bfloat16 if args.device == "cuda" else torch.float32
        torch.manual_seed(0)
        model = RecurrentModel(dim=args.dim, layers=args.layers, max_positions=4096).to(args.device, dt).eval()
        x0 = (torch.randn(1, args.dim) * 0.5).to(args.device, dt)
        out = run_variant(args.variant, model, x0, args)
        # issue 25 item 4: every weight read once (of the position table the one row looked up),
        # each layer's state read and its new one written
        with torch.no_grad():
            _, cache = _decode(model, x0.clone(), 1)
        nbytes = sum((p[0] if name == "positions" else p).numel() * p.element_size()
                     for name, p in model.named_parameters())
        nbytes += 2 * sum(d["recurrent_state"].numel() * d["recurrent_state"].element_size() for d in cache.states)
        out["hbm_floor_ms_per_step"] = hbm_floor_us(nbytes) / 1e3
        out["hbm_fraction"] = round(out["hbm_floor_ms_per_step"] / out["ms_per_step"], 3)
        print(json.dumps(out))
        return
    results = {"commit": os.environ.get("TRIDENT_COMMIT", ""), "device": args.device,
               "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "",
               "torch": torch.__version__, "layers": args.layers, "dim": args.dim,
               "dtype": "bfloat16" if args.device == "cuda" else "float32", "steps": args.steps, "variants": {}}
    for v in variants:  # each variant in its own process: no compiled state carries over
        cmd = [sys.executable, __file__, "--variant", v, "--layers", str(args.layers), "--dim", str(args.dim),
               "--steps", str(args.steps), "--check", str(args.check), "--reps", str(args.reps), "--warm", str(args.warm), "--profile", args.profile, "--device",
               args.device] + (["--tiny"] if args.tiny else [])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.budget_s)
            results["variants"][v] = json.loads(proc.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            results["variants"][v] = {"error": f"over the budget of {args.budget_s} s"}
        except Exception:  # noqa: BLE001 - a failed variant is reported, the others still run
            results["variants"][v] = {"error": proc.stderr[-1500:]}
        _write(results, args.out)  # after every variant: a cut run keeps what it measured
        r = results["variants"][v]
        # the numbers first: a log cut to its width still shows them
        print(v, f"ms_per_step={r.get('ms_per_step')} x_floor={r.get('x_floor')} check={r.get('check')}",
              json.dumps(r)[:300], flush=True)


def _write(results: dict, out: str) -> None:
    floor = results["variants"].get("graph_floor", {}).get("ms_per_step")
    if floor:
        for r in results["variants"].values():
            if "ms_per_step" in r:
                r["x_floor"] = round(r["ms_per_step"] / floor, 3)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)

if __name__ == "__main__":
    main()
