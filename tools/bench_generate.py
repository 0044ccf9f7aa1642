"""Hugging Face `generate()` as users call it: Llama-3.2-1B and Qwen2-0.5B shapes (random
weights, bf16, batch 1), plain and with Liger-Kernel's Triton kernels, 64 new tokens after a
16-token prompt, greedy, with the default DynamicCache and with `cache_implementation="static"`,
ALL in one run per (model, kernels) case:

  static cache
    eager             generation_config.disable_compile = True (no automatic compile)
    hf_compile        what generate() does by itself: torch.compile(model.__call__, Inductor,
                      mode="reduce-overhead") around the forward
    trident_compile   model.forward = trident.compile(model.forward), generate() as it is (its
                      automatic compile around it included: Dynamo calls Trident's function);
                      Trident's defaults: the ATen glue fused (Note [Fused glue]), products of
                      few rows and decode attention on Trident's kernels where measured faster,
                      programmatic dependent launch on sm_90+
    trident_untuned   trident_compile without those four (TRIDENT_FUSE_GLUE='',
                      TRIDENT_DECODE_MATMULS='', TRIDENT_DECODE_ATTENTION=cuda, TRIDENT_PDL='': the
                      defaults before e3252af's measurement): their gain is trident_untuned / trident_compile
    trident_no_pdl    trident_compile with TRIDENT_PDL='' (no programmatic dependent launch, Note
                      [Programmatic dependent launch], the default until 2026-12-05): its gain alone
                      is trident_no_pdl / trident_compile
    trident_cache_apart trident_compile with TRIDENT_CACHE_ATTENTION=0 (each layer's cache write its
                      own launch, Note [The cache write inside the attention]): the gain of the
                      write inside the attention is trident_cache_apart / trident_compile
    trident_config    generation_config.compile_config = CompileConfig(backend="trident")
  dynamic cache (generate() never compiles these by itself)
    eager             generate() as it is
    eager_reordered   eager with cuBLAS's bf16 reductions in fp32 (both caches; only when
                      --variants names it): where its tokens part from eager's is the model's own
                      sensitivity to a legitimate change of summation order, against which the
                      other variants' partings are read
    inductor_forward  model.forward = torch.compile(model.forward)
    trident_compile   model.forward = trident.compile(model.forward)
    trident_untuned   the same without the fused glue, decode matmuls and measured attention
    trident_no_pdl    trident_compile with TRIDENT_PDL=''
    trident_backend   model.forward = torch.compile(model.forward, backend="trident")
  floors
    graph_floor       the eager static-cache decode step replayed as one CUDA graph
                      (tools/bench_hf.py graph_floor): device time plus a copy in
    generate_own      generate()'s own time per token: generate() with the eager forward,
                      synchronized as it returns, less the time inside it (static and dynamic).
                      A forward returning precomputed logits (`generate_own_stub`, this
                      variant's definition until 08422b3) leaves the cache empty, so generate() skips its
                      cache-dependent work: on the CPU (tiny Qwen2, 24 layers, static) 0.22
                      ms/token where the real cache costs 0.63
    graph_generate    generate() itself with a forward that runs the prefill eagerly and replays
                      the eager decode step as one CUDA graph at static input buffers (static
                      cache; `GraphStep`): the floor of generate()'s token, both parts in one call
                      The floors run without HF's automatic compile, as eager does (before 9399712
                      generate_own and graph_generate ran under it: Dynamo traced their wrappers)

    python tools/bench_generate.py --out results/bench_generate.json [--models llama,qwen2] [--kernels plain,liger]

flash-linear-attention (a third-party library of Triton kernels for recurrent models), as its
README runs it (`AutoModelForCausalLM` from a config, `model.generate(input_ids)`; random weights,
GLA at 1.3B-like shapes: hidden 2048, 24 layers, 4 heads):

    python tools/bench_generate.py --models gla --kernels fla --caches dynamic

runs the dynamic-cache variants (its models have no static cache) and, as `graph_floor`, its
decode step without an attention mask (no unpadding) replayed as one CUDA graph, the argmax and
the token's copy in included (`recurrent_floor`); `x_floor` is then each variant over it plus
generate()'s own per-token time (`generate_own`, dynamic), as for the static floor.

Per variant: generate() is called 4 times with the same prompt; `first_call_s` is the first
call (compiles, captures), `ms_per_token` the median of calls 2-4 (wall time / 64 new tokens,
synchronized); the tokens of every call are compared with eager's (bf16: where they part, the
first differing step is reported). Target (issue 22): static <= 1.15 x (graph_floor +
generate_own) (`x_floor`; `x_graph_generate` against graph_generate), below every torch.compile
path; dynamic >= 4x faster than eager. Issue 25: the
case's `hbm_floor_ms_per_token` (weights and mean KV cache read once at the card's peak
bandwidth, `hbm_bytes_per_s` in the JSON) and each variant's `hbm_fraction` of it.
Each case runs in its own process; --device cpu --tiny runs a smoke test on a small config.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten
from transformers.cache_utils import Cache, StaticCache

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tools.bench_hf import Loop, build_model, capture_eager_step, choices, graph_floor, hbm_floor_ms  # noqa: E402
from tools.device_time import device_split, hbm_bytes_per_s, kernel_event, timeline  # noqa: E402
from tools.knob_sets import KNOBS, for_device  # noqa: E402

PROMPT = 16
NEW = 64
CALLS = 4
STATIC = ("eager", "eager_reordered", "hf_compile", "trident_compile", "trident_untuned", "trident_no_pdl",
          "trident_cache_apart", "trident_config", "graph_generate")
DYNAMIC = ("eager", "eager_reordered", "inductor_forward", "trident_compile", "trident_untuned", "trident_no_pdl", "trident_backend")
OPT_IN = ("eager_reordered",)  # run only when --variants names them (a diagnosis, not a baseline)
# The variants of the eager forward: they run without HF's automatic compile (run_variant)
EAGER_FORWARD = ("eager", "eager_reordered", "generate_own", "generate_own_stub", "graph_generate")


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def _generate(model, ids, cache: str, **extra):
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, **extra)
    if cache == "static":
        kw["cache_implementation"] = "static"
    return model.generate(ids, **kw)


def _timed(model, ids, cache, dev, **extra):
    out, secs = [], []
    for _ in range(CALLS):
        if isinstance(model.forward, _Inside):
            model.forward.per_call.append(0.0)
        _sync(dev)
        t = time.perf_counter()
        toks = _generate(model, ids, cache, **extra)
        _sync(dev)
        secs.append(time.perf_counter() - t)
        out.append(toks)
    return out, secs


class _Inside:
    """The model's eager forward, synchronized as it returns, timing itself per generate() call
    (`generate_own`: what generate() spends outside it is its own per-token cost, with the
    real cache's state, masks and positions)."""

    def __init__(self, forward, dev):
        functools.update_wrapper(self, forward)  # generate() reads forward's signature
        self.forward, self.dev, self.per_call = forward, dev, [0.0]

    def __call__(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return self.forward(*args, **kwargs)
        finally:
            _sync(self.dev)
            self.per_call[-1] += time.perf_counter() - t


_CACHE = object()  # where GraphStep's recorded output held the cache object


def _is_cache(x) -> bool:
    return isinstance(x, Cache)


class GraphStep:
    """generate()'s own floor (`graph_generate`, installed by `use_graph_step`): the forward
    generate() calls runs prompts eagerly and replays the eager one-token step as one CUDA graph,
    recorded on the second such step (the first runs eagerly and warms Triton's and cuBLAS's
    choices) at static copies of the call's tensors. The StaticCache is one the variant owns and
    resets before each generate() (HF makes a new one per call otherwise, at addresses a graph
    cannot know): its tensors are written in place by the graph as by eager, and their addresses
    are part of the recording's key with every other leaf of the arguments' structure (shapes,
    dtypes, strides, ints, flags); a key that changes records anew (`graphs_recorded`). The
    cache part of the key is taken once per cache object (a StaticCache keeps its tensors once
    made), so a step costs a flatten, a comparison and the copies in. HF answers
    is_cuda_stream_capturing() False while recording, so the graph holds eager's code paths (as
    tools/bench_hf.py graph_floor does; HF's capture-time paths where eager's cannot be captured,
    said in `paths`). On the CPU the recording runs the warm-up and the state's restore, and a
    "replay" runs the eager forward on the static copies; the output goes back through the same
    rebuild as on the GPU."""

    def __init__(self, forward, dev):
        functools.update_wrapper(self, forward)
        self.forward, self.dev = forward, dev
        self.key = self.graph = self.out_spec = self.paths = None
        self.static: list = []
        self.out_flat: list = []
        self.warm, self.recorded, self.replays = set(), 0, 0
        self._cache_seen = self._cache_key = None

    @staticmethod
    def _cache_tensors(leaves) -> list:
        return [t for c in leaves if _is_cache(c) for layer in getattr(c, "layers", ())
                for t in vars(layer).values() if isinstance(t, torch.Tensor)]

    def _flat(self, args, kwargs):
        leaves, spec = tree_flatten((args, kwargs), is_leaf=_is_cache)
        tensors = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        facts = tuple((x.shape, x.stride(), x.dtype, x.device) if isinstance(x, torch.Tensor)
                      else type(x) if _is_cache(x) else x for x in leaves)
        caches = tuple(x for x in leaves if _is_cache(x))
        if caches != self._cache_seen:
            self._cache_seen = caches
            self._cache_key = tuple((t.data_ptr(), tuple(t.shape)) for t in self._cache_tensors(leaves))
        return leaves, spec, tensors, (spec, facts, self._cache_key)

    def __call__(self, *args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or ids.shape[-1] != 1:
            return self.forward(*args, **kwargs)  # a prompt: eager
        leaves, spec, tensors, key = self._flat(args, kwargs)
        if key != self.key:
            if key not in self.warm:  # this step's first sighting runs eagerly
                self.warm.add(key)
                return self.forward(*args, **kwargs)
            self._record(leaves, spec, tensors, key)
        for i, static in zip(tensors, self.static):
            static.copy_(leaves[i])
        self.replays += 1
        if self.dev == "cuda":
            self.graph.replay()
        else:
            self._keep(self._run_static(leaves, spec, tensors))
        # the output with the call's own cache where the recording's was (HF reads the next
        # step's cache from it; the recording call's cache object is not kept alive)
        cache = next((x for x in leaves if _is_cache(x)), None)
        return tree_unflatten([cache if x is _CACHE else x for x in self.out_flat], self.out_spec)

    def _keep(self, out):
        flat, self.out_spec = tree_flatten(out, is_leaf=_is_cache)
        self.out_flat = [_CACHE if _is_cache(x) else x for x in flat]

    def _run_static(self, leaves, spec, tensors):
        leaves = list(leaves)
        for i, static in zip(tensors, self.static):
            leaves[i] = static
        args, kwargs = tree_unflatten(leaves, spec)
        return self.forward(*args, **kwargs)

    def _record(self, leaves, spec, tensors, key):
        self.key, self.graph, self.recorded = key, None, self.recorded + 1
        self.static = [leaves[i].clone() for i in tensors]
        state = self._cache_tensors(leaves)
        saved = [t.clone() for t in state]

        def restore():
            for t, v in zip(state, saved):
                t.copy_(v)

        self.graph, out, self.paths = capture_eager_step(lambda: self._run_static(leaves, spec, tensors),
                                                         restore, self.dev)
        restore()  # the capture ran nothing: the state is the call's own
        if out is not None:
            self._keep(out)


def use_graph_step(model, cfg, dev):
    """Installs `graph_generate` on `model`: its forward a GraphStep, and each generate() given
    one StaticCache the variant owns, reset before the call (its addresses stay put, so one
    recording serves every call and prompt of a length that fits)."""
    cache = StaticCache(config=cfg, max_cache_len=PROMPT + NEW)
    model.forward = GraphStep(model.forward, dev)
    generate = model.generate

    def generate_with_own_cache(*args, **kwargs):
        kwargs.pop("cache_implementation", None)
        cache.reset()
        return generate(*args, past_key_values=cache, **kwargs)

    model.generate = generate_with_own_cache
    return model.forward


def _tokens_vs(want, got) -> dict:
    w, g = want[0, PROMPT:].tolist(), got[0, PROMPT:].tolist()
    first = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), None)
    return {"tokens_equal": first is None, **({"first_differing_step": first} if first is not None else {})}


def _logits_check(want, got) -> dict:
    """Where the tokens of a generate(..., output_logits=True) part from eager's: the logits at
    that step (max |variant - eager| / max |eager|) and eager's margin between its token and the
    variant's (a near-tie at bf16 when small against the logits' rounding)."""
    w, g = want.sequences[0, PROMPT:].tolist(), got.sequences[0, PROMPT:].tolist()
    first = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), None)
    upto = len(w) if first is None else first + 1
    rel = [((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
           for a, b in zip(got.logits[:upto], want.logits[:upto])]
    out = {"tokens_equal": first is None, "max_rel_logit_diff_until_parting": max(rel)}
    if first is not None:
        e = want.logits[first][0].float()
        out.update(first_differing_step=first, rel_logit_diff_there=rel[first],
                   eager_margin_there=(e[w[first]] - e[g[first]]).item(), eager_logit_max_there=e.abs().max().item())
    return out


def _profile(run, dev) -> dict:
    """Where one call of `run` (a generate() of NEW tokens, or NEW replays of a floor's graph)
    spends its time: device time and kernels per token, the device
    time split by part of the step (matmuls, attention, user kernels, Trident's, fused glue,
    ATen glue, copies), the idle time between kernels and what each part adds to the span of the
    kernels (tools/device_time.timeline), the top device kernels, and the top host operators by
    self time."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    _sync(dev)
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        run()
        _sync(dev)
        wall = time.perf_counter() - t
    dev_rows, host_rows = [], []
    for e in prof.key_averages():
        if kernel_event(e):
            us = getattr(e, "self_device_time_total", 0) or 0
            if us > 0:
                dev_rows.append((us / NEW, e.count / NEW, e.key))
        elif e.self_cpu_time_total > 0:
            host_rows.append((e.self_cpu_time_total / NEW, e.count / NEW, e.key))
    dev_rows.sort(reverse=True)
    host_rows.sort(reverse=True)
    busy = sum(r[0] for r in dev_rows)
    return {
        "device_us_per_token": round(busy, 1),
        "kernels_per_token": round(sum(r[1] for r in dev_rows), 1),
        "wall_us_per_token": round(wall / NEW * 1e6, 1),  # the profiler's own overhead included
        "device_split_per_token": device_split(dev_rows),
        # the device's idle time between kernels, the span, what each part adds to it (under PDL kernels overlap)
        **{f"{k}_per_token" if k != "exposed_top" else k: v for k, v in timeline(prof, NEW).items()},
        "top_device": [{"us": round(u, 1), "n": round(c, 2), "name": k[:100]} for u, c, k in dev_rows[:10]],
        "top_host_self": [{"us": round(u, 1), "n": round(c, 2), "name": k[:100]} for u, c, k in host_rows[:15]],
    }


def _host_profile(model, ids, cache, dev) -> dict:
    """Where the host's time goes in one generate() call, per token: the time spent inside the
    model's forward (issue time: nothing synchronized inside) against generate()'s own, the
    native services of every SCM call (trident.profile), and the Python functions with the most
    self time (cProfile, which slows Python down: read it as proportions)."""
    import cProfile
    import pstats

    import trident

    forward, spent = model.forward, [0.0]

    @functools.wraps(forward)  # generate() reads forward's signature to pick its keywords
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return forward(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t

    model.forward = timed
    try:
        _sync(dev)
        t = time.perf_counter()
        _generate(model, ids, cache)
        _sync(dev)
        total = time.perf_counter() - t
    finally:
        model.forward = forward
    with trident.profile() as native:
        _generate(model, ids, cache)
    _sync(dev)
    py = cProfile.Profile()
    py.enable()
    _generate(model, ids, cache)
    py.disable()
    _sync(dev)
    rows = sorted(pstats.Stats(py).stats.items(), key=lambda kv: -kv[1][2])[:25]
    return {"ms_per_token": round(total / NEW * 1e3, 4), "forward_issue_ms_per_token": round(spent[0] / NEW * 1e3, 4),
            "native_per_token": _per_token(native)[:25],
            "python_self_us_per_token": [
                {"fn": f"{os.path.basename(k[0])}:{k[1]}({k[2]})", "us": round(v[2] / NEW * 1e6, 1),
                 "calls_per_token": round(v[1] / NEW, 2)} for k, v in rows]}


def _per_token(native) -> list:
    """trident.profile rows per generated token (its own table is per SCM call)."""
    return [{"kind": r.kind, "name": r.name[:60], "calls_per_token": round(r.calls / NEW, 2),
             "us_per_call": round(r.us_per_call, 3), "us_per_token": round(r.ns / NEW / 1e3, 2)}
            for r in native.grouped()]


def _build(kind: str, kernels: str, dev: str, dt, tiny: bool):
    """bench_hf's models, or flash-linear-attention's GLA (`--models gla --kernels fla`)."""
    if kind != "gla":
        return build_model(kind, kernels, dev, dt, tiny)
    if kernels != "fla":
        raise SystemExit("--models gla runs with --kernels fla: flash-linear-attention's own Triton kernels")
    import fla.models  # registers its models with transformers' Auto classes
    from transformers import AutoModelForCausalLM

    shapes = dict(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=256) if tiny else dict(
        hidden_size=2048, num_hidden_layers=24, num_heads=4, vocab_size=32000)
    cfg = fla.models.GLAConfig(**shapes)
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg)
    return cfg, model.to(dt).eval()


def run_variant(kind, kernels, cache, name, args) -> dict:
    import trident
    from transformers import CompileConfig, GenerationConfig
    from trident.frontends.dynamo import compiled_graphs

    dev = args.device
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    cfg, model = _build(kind, kernels, dev, dt, args.tiny)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=g).to(dev)
    model.generation_config = GenerationConfig.from_model_config(cfg)
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        model.generation_config.disable_compile = True
        want = _generate(model, ids, cache)  # eager's tokens
        want_logits = _generate(model, ids, cache, return_dict_in_generate=True, output_logits=True)
        # the eager forward's own variants run without HF's automatic compile: under it, Dynamo
        # would trace the floors' wrappers (graph breaks at their syncs, its guards counted as
        # generate()'s own time, a CUDA graph recorded inside a compiled frame)
        model.generation_config.disable_compile = name in EAGER_FORWARD
        start = len(compiled_graphs())
        forward = model.forward
        if name in KNOBS:  # a trident.compile variant: its knobs (tools/knob_sets.py) for this process's rest
            trident.knobs.scope(**for_device(name, dev)).__enter__()
            model.forward = trident.compile(model.forward)
        elif name == "trident_backend":
            model.forward = torch.compile(model.forward, backend="trident")
        elif name == "inductor_forward":
            model.forward = torch.compile(model.forward)
        elif name == "trident_config":
            model.generation_config.compile_config = CompileConfig(backend="trident")
        elif name == "eager_reordered":  # the model's own sensitivity to a summation order
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        elif name == "generate_own":
            model.forward = inside = _Inside(forward, dev)
        elif name == "graph_generate":
            step = use_graph_step(model, cfg, dev)
        elif name == "generate_own_stub":
            logits = forward(input_ids=ids[:, -1:]).logits  # one step's logits, returned every call

            def stub(input_ids=None, past_key_values=None, **_):
                from transformers.modeling_outputs import CausalLMOutputWithPast

                return CausalLMOutputWithPast(logits=logits.expand(input_ids.shape[0], -1, -1),
                                              past_key_values=past_key_values)

            model.forward = stub
        if dev != "cuda" and name in ("hf_compile", "trident_config"):
            model.generation_config.compile_config = model.generation_config.compile_config or CompileConfig()
            model.generation_config.compile_config._compile_all_devices = True
        outs, secs = _timed(model, ids, cache, dev)
        if name == "graph_generate":  # counted over the timed calls
            recorded, replays, paths = step.recorded, step.replays, step.paths
        if name == "generate_own":  # the time outside the (synchronized) forward
            secs = [s - spent for s, spent in zip(secs, inside.per_call[-len(secs):])]
        if not name.startswith("generate_own"):
            check = _logits_check(want_logits, _generate(model, ids, cache, return_dict_in_generate=True,
                                                         output_logits=True))
        prof = _profile(lambda: _generate(model, ids, cache), dev) if name in args.profile.split(",") else None
        host = _host_profile(model, ids, cache, dev) if name in args.host_profile.split(",") else None
    r = {"first_call_s": round(secs[0], 2), "ms_per_token": statistics.median(secs[1:]) / NEW * 1e3,
         "ms_per_token_samples": [round(s / NEW * 1e3, 4) for s in secs[1:]],
         # issue 22: faster than eager from the second generate() on, which the median hides
         "second_call_ms_per_token": round(secs[1] / NEW * 1e3, 4), "last_call_ms_per_token": round(secs[-1] / NEW * 1e3, 4)}
    if name == "graph_generate":
        r["graphs_recorded"], r["graph_replays"], r["hf_code_paths"] = recorded, replays, paths
    if kind != "gla":  # issue 25: the HBM floor from every variant, not only from a run with graph_floor
        r["hbm_floor_ms_per_token"] = hbm_floor_ms(model, cfg, PROMPT + NEW / 2)["hbm_floor_ms_per_token"]
    if not name.startswith("generate_own"):
        checks = [_tokens_vs(want, o) for o in outs]
        r["tokens"] = checks[0] if all(c == checks[0] for c in checks) else checks
        r["logits_check"] = check
    if prof is not None:
        r["profile"] = prof
    if host is not None:
        r["host"] = host
    if name in KNOBS or name in ("trident_backend", "trident_config"):
        opts = list(model.forward.captures.values()) if name in KNOBS else [
            opt for gr in compiled_graphs()[start:] for opt in gr.captures.values()]
        r["regions"] = [_regions_summary(opt) for opt in opts]
    if name in KNOBS:
        r["captures"], r["eager_calls"] = len(model.forward.captures), model.forward.eager_calls
        r["eager_log"] = list(model.forward.eager_log)[-4:]
        # Note [Data-dependent calls through Dynamo]: the calls trident.compile sent through Dynamo
        r["dynamo_calls"], r["dynamo_reason"] = model.forward.dynamo_calls, model.forward.dynamo_reason
        if model.forward.dynamo_calls:
            graphs = compiled_graphs()[start:]
            r["dynamo_graphs"] = len(graphs)
            r["dynamo_captures"] = sum(len(gr.captures) for gr in graphs)
            r["dynamo_eager_calls"] = sum(gr.eager_calls for gr in graphs)
    if name in ("trident_backend", "trident_config"):
        graphs = compiled_graphs()[start:]
        r["dynamo_graphs"] = len(graphs)
        r["captures"] = sum(len(gr.captures) for gr in graphs)
        r["eager_calls"] = sum(gr.eager_calls for gr in graphs)
    return r


def _regions_summary(opt) -> dict:
    """A capture's regions: calls served, graph replays, and how many regions replayed a graph."""
    import trident

    from trident.runtime import SCMRuntime

    info = trident.cache_info(opt)
    programs = [SCMRuntime.get(r).program for r in opt.meta.get("trident_regions", ())]
    launches = [s.kernel_name for p in programs for s in p.launches]
    return {"symbolic": bool(opt.meta.get("trident_symbolic")), "regions": len(info),
            "choices": choices(trident.explain(opt)),
            "launches": len(launches), "fused_glue_launches": sum(n.startswith("triton_") for n in launches),
            "steps": sum(len(p.steps) for p in programs),
            "hits": sum(v["hits"] for v in info.values()),
            "graph_replays": sum(v.get("graph_replays", 0) for v in info.values()),
            "regions_replaying": sum(1 for v in info.values() if v.get("graph_replays", 0)),
            "cuts": len(opt.meta.get("trident_cuts", ()))}


def _layer_states(cache) -> list:
    """flash-linear-attention's per-layer state dicts (`layers[i].state` in its HF-style Cache,
    `states[i]` in its older one)."""
    if hasattr(cache, "layers"):
        return [d for d in (getattr(layer, "state", None) for layer in cache.layers) if isinstance(d, dict)]
    return [d for d in getattr(cache, "states", []) if isinstance(d, dict)]


def recurrent_floor(kind, kernels, args) -> dict:
    """flash-linear-attention's decode step replayed as one CUDA graph, per token: the prompt's
    prefill eager, then the step without an attention mask (generate() passes one, and the
    layers then unpad by it with nonzero, which no graph holds) captured at a static token
    buffer; each token replays it, takes the argmax and copies it in. The step's state is
    replaced by new tensors in the graph's pool, so replays read the captured state: the device
    time of a step, not a continued generation."""
    dev = args.device
    cfg, model = _build(kind, kernels, dev, torch.bfloat16, args.tiny)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=g).to(dev)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        static_tok = tok.clone()

        def step():
            return model(input_ids=static_tok, past_key_values=cache, use_cache=True).logits

        held = [dict(d) for d in _layer_states(cache)]  # the graph's inputs, alive while it replays
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = step()
        def tokens():
            for _ in range(NEW):
                graph.replay()
                static_tok.copy_(logits[:, -1:].argmax(-1))

        times = []
        for _ in range(5):
            _sync(dev)
            t = time.perf_counter()
            tokens()
            _sync(dev)
            times.append((time.perf_counter() - t) / NEW * 1e3)
        prof = _profile(tokens, dev) if "graph_floor" in args.profile.split(",") else None
    del held
    weights = sum(p.numel() * p.element_size() for p in model.parameters()
                  if p is not model.get_input_embeddings().weight)
    state = 2 * sum(t.numel() * t.element_size() for d in _layer_states(cache)
                    for t in d.values() if isinstance(t, torch.Tensor))  # read and written once a step
    return {"ms_per_token": statistics.median(times), "ms_per_token_samples": [round(v, 4) for v in times],
            "hbm_floor_ms_per_token": (weights + state) / hbm_bytes_per_s() * 1e3, "weight_bytes": weights,
            "state_bytes_per_step": state, **({"profile": prof} if prof else {})}


def run_floor(kind, kernels, args) -> dict:
    """The eager static-cache decode step replayed as one CUDA graph, per token."""
    if kind == "gla":
        return recurrent_floor(kind, kernels, args)
    dev = args.device
    cfg, model = build_model(kind, kernels, dev, torch.bfloat16, args.tiny)
    loop = Loop(model, cfg, dev, torch.bfloat16)
    with torch.no_grad():
        cache, tok, pos = loop.prefill()
        fwd = graph_floor(loop, cache, tok, pos)
        loop.steps(fwd, cache, tok, pos, 8)
        times = []
        for _ in range(5):
            _sync(dev)
            t = time.perf_counter()
            loop.steps(fwd, cache, tok, pos, NEW)
            _sync(dev)
            times.append((time.perf_counter() - t) / NEW * 1e3)
    return {"ms_per_token": statistics.median(times), "ms_per_token_samples": [round(v, 4) for v in times],
            **hbm_floor_ms(model, cfg, PROMPT + NEW / 2)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="results/bench_generate.json")
    p.add_argument("--models", default="llama,qwen2")
    p.add_argument("--kernels", default="plain,liger")
    p.add_argument("--caches", default="static,dynamic")
    p.add_argument("--variants", default="", help="a subset of variant names (both caches)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--budget-s", type=int, default=300, help="per variant process")
    p.add_argument("--calls", type=int, default=4, help="generate() calls per variant (the first is warm-up)")
    p.add_argument("--profile", default="", help="variants whose generate() call is profiled (torch.profiler); "
                   "graph_floor: the recurrent (gla) floor's replays")
    p.add_argument("--host-profile", default="", help="variants whose host time is split (forward, native, Python)")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)  # child: kind,kernels,cache,variant
    args = p.parse_args()
    global CALLS
    CALLS = args.calls
    if args.one:
        kind, kernels, cache, name = args.one.split(",")
        r = run_floor(kind, kernels, args) if name == "graph_floor" else run_variant(kind, kernels, cache, name, args)
        print(json.dumps(r))
        return
    pick = set(args.variants.split(",")) if args.variants else None
    results = {"commit": os.environ.get("TRIDENT_COMMIT", ""), "device": args.device, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "", "hbm_bytes_per_s": hbm_bytes_per_s(),
               "prompt": PROMPT,
               "new_tokens": NEW, "calls": CALLS, "cases": {}}
    for kind in args.models.split(","):
        for kernels in args.kernels.split(","):
            case = results["cases"].setdefault(f"{kind}+{kernels}", {})
            jobs = []
            for cache in args.caches.split(","):
                if kind == "gla" and cache == "static":
                    continue  # flash-linear-attention's models have no static cache
                names = (STATIC if cache == "static" else DYNAMIC) + ("generate_own", "generate_own_stub")
                jobs += [(cache, n) for n in names if (pick is None and n not in OPT_IN) or (pick and n in pick)]
            if args.device == "cuda" and (pick is None or "graph_floor" in pick):
                jobs.append(("dynamic" if kind == "gla" else "static", "graph_floor"))
            for cache, name in jobs:
                cmd = [sys.executable, __file__, "--one", f"{kind},{kernels},{cache},{name}", "--device", args.device]
                cmd += (["--tiny"] if args.tiny else []) + ["--profile", args.profile, "--host-profile", args.host_profile]
                cmd += ["--calls", str(args.calls)]
                began = time.perf_counter()
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.budget_s)
                    r = json.loads(proc.stdout.strip().splitlines()[-1])
                except subprocess.TimeoutExpired:
                    r = {"error": f"over the budget of {args.budget_s} s"}
                except Exception:  # noqa: BLE001 - a failed variant is reported, the others still run
                    r = {"error": proc.stderr[-1500:]}
                r["wall_s"] = round(time.perf_counter() - began, 1)  # the whole process: plans device calls
                case.setdefault(cache, {})[name] = r
                _finish(case)
                _write(results, args.out)  # after every variant: a cut run keeps what it measured
                # the numbers first: a log cut to its width still shows them
                print(kind, kernels, cache, name, f"ms_per_token={r.get('ms_per_token')} first_call_s="
                      f"{r.get('first_call_s')} x_floor={r.get('x_floor')} speedup={r.get('speedup_vs_eager')}",
                      json.dumps(r)[:300], flush=True)


def _finish(case: dict) -> None:
    """The ratios of a (model, kernels) case from what it has measured so far."""
    st, dy = case.get("static", {}), case.get("dynamic", {})
    floor, own = st.get("graph_floor", {}).get("ms_per_token"), st.get("generate_own", {}).get("ms_per_token")
    if floor and own:
        case["static_floor_ms_per_token"] = floor + own
        for r in st.values():
            if "ms_per_token" in r:
                r["x_floor"] = round(r["ms_per_token"] / (floor + own), 3)
    in_generate = st.get("graph_generate", {}).get("ms_per_token")
    if in_generate:  # generate() replaying the eager step's graph: both parts of the floor at once
        case["graph_generate_ms_per_token"] = in_generate
        for r in st.values():
            if "ms_per_token" in r:
                r["x_graph_generate"] = round(r["ms_per_token"] / in_generate, 3)
    # the floor's own (gla: its recurrent state's), else any variant's: every one reports the same weights
    hbm = st.get("graph_floor", {}).get("hbm_floor_ms_per_token") or dy.get("graph_floor", {}).get(
        "hbm_floor_ms_per_token") or next((r["hbm_floor_ms_per_token"] for r in list(st.values()) + list(dy.values())
                                           if "hbm_floor_ms_per_token" in r), None)
    if hbm:  # issue 25: the fraction of the HBM floor each variant reaches
        case["hbm_floor_ms_per_token"] = hbm
        for r in list(st.values()) + list(dy.values()):
            if "ms_per_token" in r:
                r["hbm_fraction"] = round(hbm / r["ms_per_token"], 3)
    recurrent = dy.get("graph_floor", {}).get("ms_per_token")  # flash-linear-attention's step
    dy_own = dy.get("generate_own", {}).get("ms_per_token")
    if recurrent and dy_own:  # as the static floor: the step's graph plus generate()'s own time
        case["dynamic_floor_ms_per_token"] = recurrent + dy_own
        for r in dy.values():
            if "ms_per_token" in r:
                r["x_floor"] = round(r["ms_per_token"] / (recurrent + dy_own), 3)
    eager = dy.get("eager", {}).get("ms_per_token")
    if eager:
        for r in dy.values():
            if "ms_per_token" in r:
                r["speedup_vs_eager"] = round(eager / r["ms_per_token"], 2)
    for cache in (st, dy):  # the second generate() against eager's median with the same cache
        base = cache.get("eager", {}).get("ms_per_token") or eager
        for r in cache.values():
            if base and r.get("second_call_ms_per_token"):
                r["second_call_vs_eager"] = round(base / r["second_call_ms_per_token"], 2)


def _write(results: dict, out: str) -> None:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
