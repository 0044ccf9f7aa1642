"""Per-token decode latency of Hugging Face Llama-3.2-1B and Qwen2-0.5B (their configs' shapes,
random weights, bf16, batch 1, StaticCache), plain and with Liger-Kernel's Triton kernels
(`apply_liger_kernel_to_llama/qwen2`: rope, rms_norm, swiglu), ALL in one run:

  eager                     model.forward
  compile_default           torch.compile(model.forward)
  compile_reduce_overhead   torch.compile(model.forward, mode="reduce-overhead")
  trident_backend           torch.compile(model.forward, backend="trident")
  trident_compile           trident.compile(model.forward), Trident's defaults (ATen glue fused into
                            Inductor-generated kernels; products of few rows and decode attention
                            on Trident's kernels where measured faster; programmatic dependent launch)
  trident_untuned           the same without those four (fuse_glue='', decode_matmuls='',
                            decode_attention='cuda', pdl='': the defaults before e3252af's measurement)
  trident_no_pdl            trident_compile with TRIDENT_PDL='' (no programmatic dependent launch, the
                            default until 2026-12-05): the gain of PDL is trident_no_pdl / trident_compile
  trident_pdl_own           trident_compile with TRIDENT_PDL_USER_KERNELS=0: only Trident's and Inductor's
                            kernels programmatic, user kernels in ordinary order (the gain of their waiting
                            twins, Note [A user kernel made to wait], is trident_pdl_own / trident_compile)
  trident_cache_apart       trident_compile with TRIDENT_CACHE_ATTENTION=0 (the cache write its own
                            launch): the gain of the write inside the attention is
                            trident_cache_apart / trident_compile
  graph_floor               the eager decode step captured once in a torch.cuda.CUDAGraph; each
                            step copies the token and position in and replays (no host work
                            beyond that: the floor of any host-side optimization)

    python tools/bench_hf.py --out results/bench_hf.json [--models llama,qwen2] [--kernels plain,liger]

Used as HF's generate uses a compiled forward: the prefill runs eagerly, each decode step calls
the variant's forward with the token the previous step produced (argmax of its logits, on the
device: a fresh tensor every step) and a new cache_position tensor (`pos + 1`), keyword
arguments and the StaticCache as HF passes them. ms/token = wall time of `steps` consecutive
steps (synchronized before and after) / steps, median over `reps`, after a 64-token greedy check
that is also the warm-up. The check: from a fresh cache and the same prompt, 64 greedy tokens
equal eager's; where they part, the logits at the first differing step are compared (bf16:
max |variant - eager| / max |eager|).

Issue 25's limit beside the floor: each case's `hbm_floor_ms_per_token` (every weight a step
multiplies and the KV cache at the timed steps' mean context, read once at the card's peak
bandwidth, `hbm_bytes_per_s` in the JSON: tools/device_time.py) and each variant's `hbm_fraction` of it; a profiled variant (--profile) also gives its
kernels per step, its device time by part (matmuls, attention, user kernels, Trident's, fused
glue, ATen glue, copies) and the idle time between kernels.

Each (model, kernels) case runs in its own process (no compiled state, graph pool or Liger patch
carries over), one after another, all in this one run. --device cpu --tiny runs a smoke test of
the whole script on a small config.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import transformers.utils.import_utils as hf_imports

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tools.device_time import hbm_bytes_per_s, profile_device  # noqa: E402
from tools.knob_sets import KNOBS, for_device  # noqa: E402

VARIANTS = ("eager", "graph_floor", "trident_compile", "trident_untuned", "trident_no_pdl", "trident_pdl_own",
            "trident_cache_apart",
            "trident_backend", "compile_default", "compile_reduce_overhead")

PROMPT = 64  # prompt tokens (prefilled eagerly)
CHECK = 64  # greedy tokens compared with eager's (also the warm-up)
MAX_CACHE = 512


def configs(tiny: bool):
    from transformers import LlamaConfig, Qwen2Config

    if tiny:
        small = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
        return {"llama": LlamaConfig(**small), "qwen2": Qwen2Config(**small)}
    # meta-llama/Llama-3.2-1B and Qwen/Qwen2-0.5B config.json (shapes, rope, eps, tied embeddings)
    llama = LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192},
    )
    qwen2 = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True,
    )
    return {"llama": llama, "qwen2": qwen2}


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def build_model(kind: str, kernels: str, dev: str, dt, tiny: bool):
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    cfg = configs(tiny)[kind]
    torch.manual_seed(0)
    with torch.device(dev):
        model = (LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM)(cfg)
    model = model.to(dt).eval()
    if kernels == "liger":
        import liger_kernel.transformers as liger

        apply = liger.apply_liger_kernel_to_llama if kind == "llama" else liger.apply_liger_kernel_to_qwen2
        apply(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False,
              model=model)
    return cfg, model


class Loop:
    """The decode loop of a caller: eager prefill of the prompt, then steps through `forward`."""

    def __init__(self, model, cfg, dev, dt):
        from transformers import StaticCache

        self.model, self.cfg, self.dev, self.dt = model, cfg, dev, dt
        self.StaticCache = StaticCache
        g = torch.Generator().manual_seed(1)
        self.prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=g).to(dev)

    def prefill(self):
        cache = self.StaticCache(config=self.cfg, max_cache_len=MAX_CACHE)
        logits = self.model(input_ids=self.prompt, past_key_values=cache, use_cache=True,
                            cache_position=torch.arange(PROMPT, device=self.dev)).logits
        return cache, logits[:, -1:].argmax(-1), torch.tensor([PROMPT], device=self.dev)

    @staticmethod
    def steps(forward, cache, tok, pos, n, keep=None):
        for _ in range(n):
            logits = forward(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
            tok = logits[:, -1:].argmax(-1)  # the next input: a fresh tensor, as generate makes it
            pos = pos + 1  # a new position tensor each step
            if keep is not None:
                keep.append((tok, logits[:, -1].float()))
        return tok, pos


class _Out:
    def __init__(self, logits):
        self.logits = logits


def capture_eager_step(run, restore, dev: str, warmups: int = 1):
    """Records `run()` (one eager decode step) as one CUDA graph: `warmups` runs on a side stream
    first (Triton compiles, cuBLAS picks), then `restore()` (the warm-up advanced the cache) and
    the recording. HF takes other code paths while a CUDA stream captures (transformers'
    is_tracing() is true then: the causal mask is built where eager skips it); the floor is the
    EAGER step, so it is recorded with is_cuda_stream_capturing() answering False, and with HF's
    capture-time paths only where eager's cannot be captured (said in the returned `paths`).
    Returns (graph, the recorded call's output, paths). On the CPU it runs the warm-ups and the
    restore and returns (None, None, paths): the callers then run `run` eagerly per step."""
    capturing = hf_imports.is_cuda_stream_capturing

    def capture(eager_paths: bool):
        if eager_paths:
            hf_imports.is_cuda_stream_capturing = lambda: False
        try:
            side = torch.cuda.Stream() if dev == "cuda" else None
            if side is not None:
                side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                for _ in range(warmups):
                    run()
            if side is not None:
                torch.cuda.current_stream().wait_stream(side)
            restore()
            if dev != "cuda":
                return None, None
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = run()
            return graph, out
        finally:
            hf_imports.is_cuda_stream_capturing = capturing

    try:
        graph, out = capture(eager_paths=True)
        if dev != "cuda":
            return graph, out, "eager's (on the CPU nothing is recorded)"
        return graph, out, "eager's (is_cuda_stream_capturing answered False while capturing)"
    except Exception as e:  # noqa: BLE001 - eager's paths cannot be captured: HF's capture-time ones
        if dev != "cuda":
            raise
        torch.cuda.synchronize()
        graph, out = capture(eager_paths=False)
        return graph, out, f"HF's capture-time paths (eager's failed to capture: {type(e).__name__}: {str(e)[:200]})"


def graph_floor(loop: Loop, cache, tok, pos):
    """The eager step captured in a CUDA graph at static token/position buffers (the cache is
    written in place by the graph, as by eager); each call copies its inputs in and replays."""
    model = loop.model
    static_tok, static_pos = tok.clone(), pos.clone()
    # The cache's whole state: keys, values and the length counter HF 5's StaticLayer keeps on
    # the device (`cumulative_length`, advanced in place by every step: it decides where a
    # step writes and which positions it attends to). The warm-up and the self-check's eager
    # step advance it; restoring keys and values alone would capture the graph positions later.
    tensors = [t for layer in cache.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    saved = [t.clone() for t in tensors]

    def run():
        return model(input_ids=static_tok, past_key_values=cache, cache_position=static_pos, use_cache=True)

    def restore():
        for t, v in zip(tensors, saved):
            t.copy_(v)

    # The floor is the EAGER step (capture_eager_step); the self-check compares the first replay
    # with the eager step from the same cache state.
    restore()
    want = run().logits[:, -1].float()
    restore()
    graph, out, paths = capture_eager_step(run, restore, "cuda", warmups=2)
    logits = out.logits
    graph.replay()
    got = logits[:, -1].float()
    self_check = {"hf_code_paths": paths,
                  "first_replay_vs_eager_rel_diff": ((got - want).abs().max() / want.abs().max()).item()}
    print("graph_floor self-check", self_check, flush=True)
    for t, v in zip(tensors, saved):
        t.copy_(v)

    def forward(input_ids, past_key_values, cache_position, use_cache=True):
        assert past_key_values is cache
        static_tok.copy_(input_ids)
        static_pos.copy_(cache_position)
        graph.replay()
        return _Out(logits)

    forward.self_check = self_check
    return forward


def compare(keep, ref) -> dict:
    toks = [int(t.item()) for t, _ in keep]
    want = [int(t.item()) for t, _ in ref]
    first = next((i for i, (a, b) in enumerate(zip(toks, want)) if a != b), None)
    upto = len(toks) if first is None else first + 1
    rel = [((a - b).abs().max() / b.abs().max()).item() for (_, a), (_, b) in zip(keep[:upto], ref[:upto])]
    out = {"tokens_equal": first is None, "tokens_compared": len(toks), "max_rel_logit_diff": max(rel)}
    if first is not None:
        out["first_differing_step"] = first
        out["rel_logit_diff_at_first_difference"] = rel[first]
        logits = ref[first][1][0]
        out["eager_margin_at_first_difference"] = (logits[want[first]] - logits[toks[first]]).item()
    return out


def hbm_floor_ms(model, cfg, context: float) -> dict:
    """Issue 25: the least time a decode token can take on this GPU at batch 1 -- every weight a
    step multiplies with read once (the lm_head's too when tied to the embedding, whose lookup
    reads one row), plus the KV cache of `context` tokens (the timed steps' mean) -- at peak HBM
    bandwidth."""
    embed = model.get_input_embeddings().weight
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed)
    head = model.get_output_embeddings().weight
    weights += head.numel() * head.element_size() if head is embed else 0
    weights += embed.shape[1] * embed.element_size()  # the looked-up row
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * heads * head_dim * context * embed.element_size()
    return {"hbm_floor_ms_per_token": (weights + kv) / hbm_bytes_per_s() * 1e3, "weight_bytes": weights,
            "kv_bytes_mean": int(kv)}


def profile_steps(loop, fwd, cache, tok, pos, n: int = 8) -> dict:
    """Where a step's device time goes: torch.profiler over n steps (kernels inside CUDA graph
    replays included): kernels and device µs per step, the split by part of the step and the idle
    time between kernels (tools/device_time.py), the top kernels. On the CPU (smoke test) the
    same over CPU operators, without the split."""
    from torch.profiler import ProfilerActivity, profile

    if loop.dev == "cuda":  # issue 25 item 4: kernels, device time by part, idle (tools/device_time.py)
        p = profile_device(lambda: loop.steps(fwd, cache, tok, pos, n), n)
        return {"steps": n, "device_us_per_step": p["device_us"], "kernels_per_step": p["kernels"],
                "device_split_per_step": p["device_split"], "idle_us_per_step": p["idle_us"],
                "span_us_per_step": p["span_us"], "wall_us_per_step": p["wall_us"],
                "exposed_split_per_step": p["exposed_split"], "top": p["top"], "exposed_top": p["exposed_top"]}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loop.steps(fwd, cache, tok, pos, n)
    rows = sorted(((e.self_cpu_time_total / n, e.count / n, e.key) for e in prof.key_averages()
                   if e.self_cpu_time_total > 0), reverse=True)
    return {
        "steps": n,
        "device_us_per_step": round(sum(r[0] for r in rows), 1),
        "kernels_per_step": round(sum(r[1] for r in rows), 1),
        "top": [{"us": round(us, 1), "n": round(c, 2), "name": name[:100]} for us, c, name in rows[:12]],
    }


def run_case(kind: str, kernels: str, args) -> dict:
    import trident
    from trident.frontends.dynamo import compiled_graphs

    dev = args.device
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    deadline = time.time() + args.case_budget_s
    t0 = time.time()
    cfg, model = build_model(kind, kernels, dev, dt, args.tiny)
    loop = Loop(model, cfg, dev, dt)
    res: dict = {
        "model": kind, "kernels": kernels, "dtype": str(dt), "batch": 1, "prompt": PROMPT, "max_cache_len": MAX_CACHE,
        "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
        "build_s": round(time.time() - t0, 1),
        # issue 25 item 4: the least a token can take at peak HBM bandwidth, KV at the timed steps' mean context
        **hbm_floor_ms(model, cfg, PROMPT + CHECK + args.steps * args.reps / 2),
    }
    only = [v for v in args.variants.split(",") if v] or list(VARIANTS)
    ref = None
    with torch.no_grad():
        for key in VARIANTS:
            if key not in only and key != "eager":  # eager: every check's reference
                continue
            if key == "graph_floor" and dev != "cuda":
                res[key] = {"skipped": "CUDA graphs need the GPU"}
                continue
            if time.time() > deadline:
                res[key] = {"skipped": "this case's time budget was spent (--case-budget-s)"}
                continue
            torch._dynamo.reset()
            n_graphs = len(compiled_graphs())
            scope = trident.knobs.scope(**for_device(key, dev))
            scope.__enter__()  # read when the variant's captures are optimized (its first steps)
            try:
                t0 = time.time()
                cache, tok, pos = loop.prefill()
                if key == "eager":
                    fwd = model.forward
                elif key == "graph_floor":
                    fwd = graph_floor(loop, cache, tok, pos)
                elif key in KNOBS:
                    fwd = trident.compile(model.forward)
                elif key == "trident_backend":
                    fwd = torch.compile(model.forward, backend="trident")
                elif key == "compile_default":
                    fwd = torch.compile(model.forward)
                else:
                    fwd = torch.compile(model.forward, mode="reduce-overhead")
                keep: list = []
                tok, pos = loop.steps(fwd, cache, tok, pos, 2, keep)  # compiles / captures
                _sync(dev)
                entry = {"setup_s": round(time.time() - t0, 1)}
                tok, pos = loop.steps(fwd, cache, tok, pos, CHECK - 2, keep)
                if key == "eager":
                    ref = keep
                entry["check"] = compare(keep, ref)
                samples = []
                for _ in range(args.reps):
                    _sync(dev)
                    t1 = time.perf_counter_ns()
                    tok, pos = loop.steps(fwd, cache, tok, pos, args.steps)
                    _sync(dev)
                    samples.append((time.perf_counter_ns() - t1) / args.steps / 1e6)
                entry["ms_per_token"] = statistics.median(samples)
                entry["hbm_fraction"] = round(res["hbm_floor_ms_per_token"] / entry["ms_per_token"], 3)
                entry["ms_per_token_samples"] = samples
                if key in args.profile.split(","):
                    entry["profile"] = profile_steps(loop, fwd, cache, tok, pos)
                if key == "graph_floor":
                    entry["self_check"] = fwd.self_check
                if key.startswith("trident"):
                    entry["trident"] = _trident_facts(trident, fwd, compiled_graphs()[n_graphs:], key)
                res[key] = entry
                print(kind, kernels, key, json.dumps({k: v for k, v in entry.items() if k != "trident"}), flush=True)
            except Exception as e:  # a mode that fails is reported as its result
                res[key] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
                print(kind, kernels, key, "ERROR", res[key]["error"], flush=True)
            finally:
                scope.__exit__(None, None, None)
                fwd = None
                torch._dynamo.reset()
                with open(args.out, "w") as f:  # what is done so far survives a kill of the run
                    json.dump(res, f, indent=2, default=str)
    ms = {k: v["ms_per_token"] for k, v in res.items() if isinstance(v, dict) and "ms_per_token" in v}
    ratios = {}
    floor = ms.get("graph_floor")
    for t in (*KNOBS, "trident_backend"):
        if t not in ms:
            continue
        if floor:
            ratios[f"{t}_over_graph_floor"] = ms[t] / floor
        for b in ("eager", "compile_default", "compile_reduce_overhead"):
            if b in ms:
                ratios[f"{b}_over_{t}"] = ms[b] / ms[t]
    res["ratios"] = ratios
    return res


def choices(text: str) -> list:
    """explain()'s lines on what each decode product and attention runs on, with every time
    measured (the sections "decode matmuls:" and "decode attention:"): the per-config times
    say which GEMV configurations win on this GPU."""
    out, keep = [], False
    for line in text.splitlines():
        if not line.startswith(" "):
            keep = line in ("decode matmuls:", "decode attention:")
        if keep:
            out.append(line.strip())
    return out


def _trident_facts(trident, fwd, graphs, key) -> dict:
    """How the calls were served: cache_info of every capture (hits, misses, graph replays)."""
    if key in KNOBS:  # trident.compile variants
        return {"captures": len(fwd.captures), "eager_calls": fwd.eager_calls, "cache_info": trident.cache_info(fwd),
                "choices": choices(trident.explain(fwd))}
    return {
        "dynamo_graphs": len(graphs),
        "eager_calls": sum(g.eager_calls for g in graphs),
        "cache_info": {f"graph{i}": trident.cache_info(g) for i, g in enumerate(graphs)},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench_hf.json")
    ap.add_argument("--models", default="llama,qwen2")
    ap.add_argument("--kernels", default="plain,liger")
    ap.add_argument("--variants", default="", help="comma list (default: all); eager always runs")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--case-budget-s", type=float, default=280, help="no new variant starts after this")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="small configs (smoke test, e.g. with --device cpu)")
    ap.add_argument("--profile", default="", help="comma list of variants to profile (device time per kernel)")
    ap.add_argument("--case", default="", help=argparse.SUPPRESS)  # one case in this process: kind:kernels
    args = ap.parse_args()
    if args.case:
        kind, kernels = args.case.split(":")
        res = run_case(kind, kernels, args)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2, default=str)
        return
    import transformers

    result = {
        "commit": os.environ.get("TRIDENT_COMMIT", "unknown"),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "hbm_bytes_per_s": hbm_bytes_per_s(),  # the floor's peak: the card's own (tools/device_time.py)
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "method": __doc__.split("\n\n")[2].replace("\n", " "),
        "cases": {},
    }
    try:
        import importlib.metadata as md

        result["liger_kernel"] = md.version("liger-kernel")
        result["triton"] = md.version("triton")
    except Exception:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for kind in args.models.split(","):
        for kernels in args.kernels.split(","):
            part = f"{args.out}.{kind}_{kernels}.part"
            cmd = [sys.executable, __file__, "--case", f"{kind}:{kernels}", "--out", part, "--device", args.device,
                   "--variants", args.variants, "--steps", str(args.steps), "--reps", str(args.reps),
                   "--case-budget-s", str(args.case_budget_s), "--profile", args.profile] + (["--tiny"] if args.tiny else [])
            rc = subprocess.run(cmd).returncode
            try:
                with open(part) as f:
                    result["cases"][f"{kind}_{kernels}"] = json.load(f)
                os.remove(part)
            except (OSError, ValueError):
                result["cases"][f"{kind}_{kernels}"] = {"error": f"the case's process exited with {rc}"}
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2, default=str)
    summary = {  # ms/token (fraction of the HBM floor)
        c: {k: f"{v['ms_per_token']:.3f} ({v['hbm_fraction']:.0%})" for k, v in r.items()
            if isinstance(v, dict) and k in VARIANTS and "hbm_fraction" in v}
        for c, r in result["cases"].items()
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
