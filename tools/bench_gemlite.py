"""GemLite (a quantized Triton matmul library) as its README uses it, through Trident: a stack of
Llama-3.2-1B-shaped MLPs whose nn.Linear layers are replaced by the README's helper
(`A16W8_INT8(device, dtype).from_linear(layer)`: int8 weights, fp16 activations; or
`A8W8_INT8_dynamic`: activations quantized per call), one decode token a call: the input is a
fresh embedding lookup of a new token id each call, as a decode loop makes it.

    python tools/bench_gemlite.py --out results/bench_gemlite.json [--layers 4]
        [--processors A16W8_INT8,A8W8_INT8_dynamic]

Per processor, in one process: eager, `trident.compile`, torch.compile (default and
reduce-overhead) and the CUDA-graph floor (the eager step recorded once, the fresh input copied
in before each replay): median us a call over --calls calls after warm-up, and the largest
difference of each variant's output from eager's (the same kernels: expected 0). GPU only
(GemLite asks CUDA for the device at import)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trident  # noqa: E402

HIDDEN, INTER, VOCAB = 2048, 8192, 128256


class MLPStack(torch.nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.gate = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, INTER, bias=False) for _ in range(layers))
        self.up = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, INTER, bias=False) for _ in range(layers))
        self.down = torch.nn.ModuleList(torch.nn.Linear(INTER, HIDDEN, bias=False) for _ in range(layers))

    def forward(self, token):
        x = self.embed(token)
        for gate, up, down in zip(self.gate, self.up, self.down):
            x = x + down(torch.nn.functional.silu(gate(x)) * up(x))
        return x


def _quantize(model: MLPStack, processor: str, dtype) -> MLPStack:
    # here, not at the top: GemLite asks CUDA for the device at import, and --help runs anywhere
    from gemlite import helper  # GemLite's README: `from gemlite.helper import *`

    for mods in (model.gate, model.up, model.down):
        for i, layer in enumerate(mods):
            mods[i] = getattr(helper, processor)(device="cuda:0", dtype=dtype).from_linear(layer)
    return model


def _time(fn, tokens, warmup: int) -> list:
    for t in tokens[:warmup]:
        fn(t)
    torch.cuda.synchronize()
    out = []
    for t in tokens[warmup:]:
        t0 = time.perf_counter()
        fn(t)
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _floor(model, first):
    """The eager step recorded once as a CUDA graph; each call copies its token in and replays."""
    static = first.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            model(static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(static)

    def run(token):
        static.copy_(token)
        graph.replay()
        return out

    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench_gemlite.json")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--processors", default="A16W8_INT8,A8W8_INT8_dynamic")
    ap.add_argument("--variants", default="eager,trident_compile,torch_compile,reduce_overhead,graph_floor")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=30)
    args = ap.parse_args()
    dtype = torch.float16
    report = {"commit": os.environ.get("TRIDENT_COMMIT", "unknown"), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "method": " ".join(sys.argv), "cases": {}}
    for processor in args.processors.split(","):
        torch.manual_seed(0)
        model = _quantize(MLPStack(args.layers).to("cuda", dtype).eval(), processor, dtype)
        n = args.warmup + args.calls
        tokens = [torch.randint(0, VOCAB, (1, 1), device="cuda") for _ in range(n)]
        probe = torch.randint(0, VOCAB, (1, 1), device="cuda")
        case = {}
        with torch.no_grad():
            want = model(probe).clone()
            for variant in args.variants.split(","):
                entry = {}
                try:
                    if variant == "eager":
                        fn = model
                    elif variant == "trident_compile":
                        fn = trident.compile(model.forward)
                    elif variant == "torch_compile":
                        fn = torch.compile(model.forward)
                    elif variant == "reduce_overhead":
                        fn = torch.compile(model.forward, mode="reduce-overhead")
                    else:
                        fn = _floor(model, tokens[0])
                    for i in (0, 1):  # trident.compile runs its first call eagerly and captures at the second
                        t0 = time.perf_counter()
                        fn(tokens[i])
                        torch.cuda.synchronize()
                        entry[("first", "second")[i] + "_call_s"] = round(time.perf_counter() - t0, 2)
                    samples = _time(fn, tokens, args.warmup)
                    entry["us_per_call"] = round(statistics.median(samples), 2)
                    entry["max_abs_diff_vs_eager"] = (fn(probe).float() - want.float()).abs().max().item()
                    if variant == "trident_compile":
                        entry["eager_calls"] = fn.eager_calls
                        entry["explain_head"] = trident.explain(fn).splitlines()[:12]
                except Exception as e:  # noqa: BLE001 - a variant that fails is the finding
                    entry["error"] = f"{type(e).__name__}: {str(e)[:1500]}"
                case[variant] = entry
                print(processor, variant, {k: v for k, v in entry.items() if k != "explain_head"}, flush=True)
        floor = case.get("graph_floor", {}).get("us_per_call")
        for entry in case.values():
            if floor and "us_per_call" in entry:
                entry["x_floor"] = round(entry["us_per_call"] / floor, 3)
        report["cases"][processor] = case
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({p: {v: e.get("us_per_call", e.get("error", "")[:80]) for v, e in c.items()}
                      for p, c in report["cases"].items()}, indent=1))


if __name__ == "__main__":
    main()
