"""Decode-step latency of Llama-3.2-1B- and Qwen2-0.5B-shaped models built from Triton kernels
(RMSNorm, rotary, SiLU-mul, residual add) plus ATen (matmuls, attention, KV-cache writes,
views): eager, torch.compile (default, cpp_wrapper, reduce-overhead), a manual CUDA-graph
replay at a fixed position (the device floor), and Trident -- all in ONE run. Trident runs in
its default configuration (graph replay on: Note [Graph replay]); A/B variants run the same region
with one knob changed (trident_no_graphs: every call runs the native host program; the other
trident_* variants turn off one native path each, graphs off too so the path's cost shows;
trident_untuned runs without issue 25's passes, as bench_hf's variant of that name).

    python tools/bench_decode.py --out results/bench_decode.json [--models llama,qwen] [--batches 1,8]

µs/step = wall time of `steps` consecutive decode steps (the device synchronized before and
after) / steps; median over repetitions, after warm-up. Inputs are made the way a caller's loop
makes them, inside the timed loop, the same for every variant (`--inputs`): the hidden state is
the previous step's output ("feedback", default) or an embedding lookup of a new token tensor
("embedding"); the position is a new tensor every step (`pos + 1` on the device). Extra Trident
variants: trident_embedding (embedding inputs), trident_inplace (a step that writes the hidden
state in place, embedding inputs: Note [Staging written inputs]).
Outputs of every variant are checked against eager (bf16 tolerance) from identical caches.
Each case gives its HBM floor (every weight and the filled KV positions read once at peak
bandwidth) and each variant its fraction of it; --profile's variants (on CUDA) their kernels per
step, device time by part and idle time (tools/device_time.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import trident  # noqa: E402
from tests.decode_model import Config, decode_step, decode_step_reference, make_caches, make_weights  # noqa: E402
from tools.knob_sets import KNOBS  # noqa: E402
from tools.device_time import hbm_floor_us, profile_device  # noqa: E402
from trident.runtime.native import C  # noqa: E402

MODELS = {
    "llama": Config(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, max_seq=640),
    "qwen": Config(layers=24, hidden=896, heads=14, kv_heads=2, intermediate=4864, max_seq=640),
    "tiny": Config(max_seq=640),  # smoke runs (e.g. --device cpu)
}
START = 512  # positions 512.. : a KV cache of 512+ filled positions


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class CallerLoop:
    """How a decode loop makes each step's inputs: `first()` and `next(out, x, pos)`."""

    VOCAB = 1024

    def __init__(self, cfg: Config, batch: int, dev: str, dt, mode: str):
        self.cfg, self.batch, self.dev, self.dt, self.mode = cfg, batch, dev, dt, mode
        g = torch.Generator().manual_seed(1)
        self.embed = (torch.randn(self.VOCAB, cfg.hidden, generator=g) * 0.5).to(dev, dt)

    def first(self, position: int = START):
        tok = torch.arange(self.batch, device=self.dev) % self.VOCAB
        return self.embed[tok], torch.tensor([position], device=self.dev), tok

    def next(self, out, x, pos, tok):
        pos = pos + 1  # a new position tensor, as HF's cache_position[-1:] + 1
        if self.mode == "feedback":
            return out, pos, tok
        tok = (tok + 7) % self.VOCAB  # a new token tensor, then its embedding: a fresh hidden state
        return torch.nn.functional.embedding(tok, self.embed), pos, tok


def run_steps(step_fn, loop: CallerLoop, rest, steps: int, position: int = START) -> list:
    """`steps` decode steps from `position`, inputs made as the loop does; the outputs."""
    x, pos, tok = loop.first(position)
    outs = []
    for _ in range(steps):
        out = step_fn(x, pos, *rest)
        outs.append(out)
        x, pos, tok = loop.next(out, x, pos, tok)
    return outs


def per_step_us(step_fn, loop: CallerLoop, rest, steps: int, reps: int, device: str = "cuda") -> float:
    samples = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter_ns()
        run_steps(step_fn, loop, rest, steps)
        _sync(device)
        samples.append((time.perf_counter_ns() - t0) / steps / 1e3)
    return statistics.median(samples)


def decode_step_inplace(cfg: Config, x, *rest):
    """The decode step writing its result into the hidden state (a residual stream updated in
    place), returning it."""
    x.copy_(decode_step(cfg, x, *rest))
    return x


def run_case(
    name: str, cfg: Config, batch: int, steps: int, reps: int, deadline: float, dev: str = "cuda", only=(),
    inputs: str = "feedback", profiled=(),
) -> dict:
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    weights, cos, sin = make_weights(cfg, dev, dt)
    caches = make_caches(cfg, dev, dt, batch=batch)
    step = functools.partial(decode_step, cfg)
    # Without a GPU, Triton kernels cannot run eagerly: CPU smoke runs take the same math in
    # plain PyTorch as "eager" (the reference of every check); Trident still captures `step`.
    eager = step if dev == "cuda" else functools.partial(decode_step_reference, cfg)
    rest = (cos, sin, *caches, *weights)
    loops = {mode: CallerLoop(cfg, batch, dev, dt, mode) for mode in ("feedback", "embedding")}

    def make_args(p):  # capture-time examples
        x, pos, _ = loops[inputs].first(p)
        return (x, pos, *rest)

    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    kv_bytes = 2 * cfg.layers * batch * cfg.kv_heads * (START + 1) * cfg.head_dim * caches[0].element_size()
    res: dict = {
        "config": cfg.__dict__ | {"batch": batch, "dtype": str(dt), "start_position": START},
        "inputs": inputs,
        # issue 25 item 4: the least a step can take, every weight and the filled KV positions
        # read once at peak HBM bandwidth
        "hbm_floor_us_per_step": hbm_floor_us(weight_bytes + kv_bytes),
        "weight_bytes": weight_bytes, "kv_bytes": kv_bytes,
    }

    def check(fn, loop) -> float:
        """Max relative difference (max |out - eager| / max |eager|) over 3 steps from identical caches."""
        saved = [c.clone() for c in caches]
        outs = [o.float() for o in run_steps(fn, loop, rest, 3)]
        for c, s in zip(caches, saved):
            c.copy_(s)
        refs = [o.float() for o in run_steps(eager, loop, rest, 3)]
        for c, s in zip(caches, saved):
            c.copy_(s)
        return max(((o - r).abs().max() / r.abs().max()).item() for o, r in zip(outs, refs))

    def variant(key, build, force=False, mode=None):
        loop = loops[mode or inputs]
        if only and key not in only and key != "eager" and not force:  # eager is the reference of every check
            res[key] = {"skipped": "not selected (--variants)"}
            return None
        if time.time() > deadline:
            res[key] = {"skipped": "time budget of this run exhausted"}
            return None
        try:
            t0 = time.time()
            fn = build()
            run_steps(fn, loop, rest, 3)
            _sync(dev)
            setup = time.time() - t0
            res[key] = {
                "inputs": loop.mode,
                "us_per_step": per_step_us(fn, loop, rest, steps, reps, dev),
                "setup_s": round(setup, 1),
                # The graph replays position START with its own inputs: no comparison.
                "max_rel_diff_vs_eager": None if key == "graph_floor" else check(fn, loop),
            }
            res[key]["hbm_fraction"] = round(res["hbm_floor_us_per_step"] / res[key]["us_per_step"], 3)
            if dev == "cuda" and key in profiled:  # kernels per step, device time by part, idle
                res[key]["profile"] = profile_device(lambda: run_steps(fn, loop, rest, 8), 8)
            return fn
        except Exception as e:  # a baseline that cannot run is reported, not fatal
            res[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            return None

    variant("eager", lambda: eager)
    def describe(key: str, opt, mode=None) -> None:
        """Region facts, a native loop and where the host time goes (trident.profile, no
        synchronization inside) for one optimized variant."""
        if opt is None:
            return
        info = trident.cache_info(opt)
        res[key]["cache_info"] = {
            k: {kk: v[kk] for kk in ("hits", "misses", "specializations", "graph_replays", "ordinary_calls", "graph_bytes")}
            for k, v in info.items()
        }
        res[key]["scm_nodes"] = sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes)
        if len(opt.meta["trident_regions"]) != 1:
            return
        (rid,) = opt.meta["trident_regions"]
        node = next(n for n in opt.graph.nodes if n.target is torch.ops.trident.scm.default)
        placeholders = [n.name for n in opt.graph.nodes if n.op == "placeholder"]
        args = dict(zip(placeholders, make_args(START)))
        scm_inputs = [args[a.name] for a in node.args[1]] + [args[a.name] for a in node.args[2]]
        _sync(dev)
        ns = C.run_loop(rid, scm_inputs, steps)
        _sync(dev)
        res[key]["native_loop_us_per_step"] = ns / steps / 1e3
        with trident.profile() as prof:
            run_steps(opt, loops[mode or inputs], rest, steps)
        _sync(dev)
        res[key]["host_profile"] = prof.as_json()[:40]
        print(f"{key}:\n{prof.table()}", flush=True)
        res[key]["graphs"] = C.graph_stats(rid)
        res[key]["explain_graph_lines"] = [ln.strip() for ln in trident.explain(opt).splitlines() if "graph" in ln]
        rt = trident.runtime.SCMRuntime.get(rid)
        res[key]["region"] = {
            "launches": len(rt.program.launches),
            "aten_calls": len(rt.program.atens),
            "allocations": len(rt.program.allocs),
        }

    describe("trident", variant("trident", lambda: trident.optimize(trident.capture(step, *make_args(START)))))
    if dev == "cuda":
        variant("graph_floor", lambda: _graph_replay(step, make_args))
    # Trident with the other way of making inputs, and with a step that writes the hidden state
    # in place (staged both ways: Note [Staging written inputs]); both on embedding inputs.
    other = "embedding" if inputs == "feedback" else "feedback"
    describe(
        f"trident_{other}",
        variant(f"trident_{other}", lambda: trident.optimize(trident.capture(step, *make_args(START))), mode=other),
        mode=other,
    )
    inplace = functools.partial(decode_step_inplace, cfg)
    describe(
        "trident_inplace",
        variant(
            "trident_inplace", lambda: trident.optimize(trident.capture(inplace, *make_args(START))), mode="embedding"
        ),
        mode="embedding",
    )

    def trident_with(**knob_values):
        # A/B: the same step optimized with other knob values (trident.knobs.scope).
        def build():
            with trident.knobs.scope(**knob_values):
                return trident.optimize(trident.capture(step, *make_args(START)))

        return build

    # without issue 25's passes (tools/knob_sets.py: no fused glue, no GEMV, Trident's attention
    # unmeasured, no PDL): what those passes change in this step. The knobs hold for the timed
    # calls too (a later miss plans its specialization with them).
    with trident.knobs.scope(**KNOBS["trident_untuned"]):
        variant("trident_untuned", lambda: trident.optimize(trident.capture(step, *make_args(START))))
    # the same region without graph replay (Note [Graph replay]): every call runs the host program
    describe("trident_no_graphs", variant("trident_no_graphs", trident_with(graphs="")))
    # every operator call boxed through the dispatcher (no views, constants, typed or gemm paths)
    variant("trident_all_boxed", trident_with(native_paths="", graphs=""))
    # aten::mm through the dispatcher instead of cached cuBLASLt plans
    variant("trident_no_gemm", trident_with(native_paths="views,constants,typed,arena,release", graphs=""))
    # every allocation its own caching-allocator call instead of one arena per call
    variant("trident_no_arena", trident_with(native_paths="views,constants,typed,gemm,release", graphs=""))
    # clone / index_copy_ through ATen instead of Trident's Triton copy kernels; also run when
    # the default configuration failed, so that a Trident number exists either way
    variant("trident_no_copies", trident_with(triton_copies="", graphs=""), force="error" in res.get("trident", {}))
    variant("torch_compile", lambda: torch.compile(step))
    variant("torch_compile_cpp_wrapper", lambda: torch.compile(step, options={"cpp_wrapper": True}))
    variant("torch_compile_reduce_overhead", lambda: torch.compile(step, mode="reduce-overhead"))
    t = res.get("trident", {}).get("us_per_step")
    if t:
        res["ratios"] = {
            f"{k}_over_trident": res[k]["us_per_step"] / t
            for k in ("eager", "torch_compile", "torch_compile_cpp_wrapper", "torch_compile_reduce_overhead")
            if "us_per_step" in res.get(k, {})
        }
        if "us_per_step" in res.get("graph_floor", {}):
            res["ratios"]["trident_over_graph_floor"] = t / res["graph_floor"]["us_per_step"]
            ng = res.get("trident_no_graphs", {}).get("us_per_step")
            if ng:
                res["ratios"]["trident_no_graphs_over_graph_floor"] = ng / res["graph_floor"]["us_per_step"]
    times = {k: v.get("us_per_step") for k, v in res.items() if isinstance(v, dict) and k not in ("config", "ratios")}
    print(name, batch, json.dumps({"us_per_step": times, "ratios": res.get("ratios")}), flush=True)
    return res


def _graph_replay(step, make_args):
    """The step captured once at a fixed position; replay = the device floor (no host work)."""
    static = make_args(START)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(*static)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(*static)

    def replay(*_):
        graph.replay()
        return out

    return replay


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench_decode.json")
    ap.add_argument("--models", default="llama,qwen")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--variants", default="", help="comma list to run (default all)")
    ap.add_argument("--profile", default="trident,trident_untuned,graph_floor",
                    help="comma list of variants whose device time is profiled (CUDA)")
    ap.add_argument("--inputs", default="feedback", choices=("feedback", "embedding"),
                    help="how the loop makes the hidden state: the previous output, or an embedding lookup")
    args = ap.parse_args()
    deadline = time.time() + args.budget_s
    result = {
        "commit": os.environ.get("TRIDENT_COMMIT", "unknown"),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "method": "us/step: wall time of `steps` decode steps, inputs made in the loop as a caller does "
        "(hidden state: previous output or embedding lookup; a new position tensor each step), synchronized, / steps; "
        "median of reps",
        "cases": {},
    }
    for model in args.models.split(","):
        for batch in map(int, args.batches.split(",")):
            result["cases"][f"{model}_b{batch}"] = run_case(
                model, MODELS[model], batch, args.steps, args.reps, deadline, args.device,
                tuple(v for v in args.variants.split(",") if v), args.inputs, tuple(args.profile.split(",")),
            )
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2, default=str)


if __name__ == "__main__":
    main()
