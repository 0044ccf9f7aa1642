"""Diagnostic (issue 22): why a generate() call after the first is slow. Per call: wall time,
per-step host times, and for the chosen call a cProfile of the top cumulative functions; then
explain() of the compiled forward. Run on the GPU: python3 tools/diag_calls.py --out OUT.json"""
import argparse, cProfile, json, os, pstats, sys, time
import torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tools.bench_hf import build_model  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--model", default="llama")
p.add_argument("--kernels", default="plain")
p.add_argument("--cache", default="dynamic")
p.add_argument("--calls", type=int, default=3)
p.add_argument("--profile-call", type=int, default=1)
a = p.parse_args()
import trident  # noqa: E402
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList  # noqa: E402
os.environ.setdefault("TRIDENT_TUNING_DIR", "")  # a first call measures, as a first run (Note [Kept measurements])

dev = "cuda"
cfg, model = build_model(a.model, a.kernels, dev, torch.bfloat16, False)
model.generation_config = GenerationConfig.from_model_config(cfg)
model.generation_config.pad_token_id = 0
model.generation_config.disable_compile = True
ids = torch.randint(0, cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1)).to(dev)
for k, v in {"TRIDENT_FUSE_GLUE": "cuda", "TRIDENT_DECODE_MATMULS": "cuda", "TRIDENT_DECODE_ATTENTION": "measured"}.items():
    os.environ.setdefault(k, v)
fn = trident.compile(model.forward)
model.forward = fn


class Stamp(StoppingCriteria):
    def __init__(self):
        self.t = []

    def __call__(self, input_ids, scores, **kw):
        self.t.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


res = {"calls": []}
with torch.no_grad():
    for i in range(a.calls):
        st = Stamp()
        kw = dict(max_new_tokens=64, min_new_tokens=64, do_sample=False, stopping_criteria=StoppingCriteriaList([st]))
        if a.cache == "static":
            kw["cache_implementation"] = "static"
        prof = cProfile.Profile() if i == a.profile_call else None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        model.generate(ids, **kw)
        if prof:
            prof.disable()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        steps = [round((b - x) * 1e3, 2) for x, b in zip([t0] + st.t[:-1], st.t)]
        row = {"wall_s": round(wall, 3), "step_ms": steps}
        if prof:
            rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][3])[:45]
            row["top_cum"] = [f"{v[3]:.3f}s cum {v[2]:.3f}s self n={v[1]} {os.path.basename(k[0])}:{k[1]}({k[2]})" for k, v in rows]
        res["calls"].append(row)
        print(f"call {i}: {wall:.2f}s; slowest steps {sorted(steps)[-5:]}", flush=True)
    try:
        res["explain"] = trident.explain(fn)
    except Exception as e:  # noqa: BLE001
        res["explain"] = f"explain failed: {e!r}"
json.dump(res, open(a.out, "w"), indent=1)
for r in res["calls"]:
    for line in r.get("top_cum", []):
        print(line)
print(res["explain"][:6000])
