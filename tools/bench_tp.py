"""Tensor-parallel decode (issue 12, Note [Collectives in regions]): the decode step of
tests/tp_decode_model.py -- tests/decode_model.py's Triton RMSNorm, rotary, SiLU-mul and residual
kernels around column-parallel q/k/v and gate/up and row-parallel o and down linears, an
all-reduce after the attention output and after the MLP -- at Llama-3.2-1B shapes (16 layers,
hidden 2048, 32 heads, 8 KV heads, intermediate 8192), bf16, batch 1, one rank per GPU, launched
by torchrun:

    torchrun --nproc-per-node 2 tools/bench_tp.py --out results/bench_tp.json
    torchrun --nproc-per-node 2 tools/bench_tp.py --device cpu --tiny --steps 6   # gloo smoke run

Variants, all in the same run, each over the same steps (a fresh hidden state and position per
step, as a decode loop makes them): eager, torch.compile (default), torch.compile
mode="reduce-overhead", `trident.compile`, `torch.compile(backend="trident")`, and the floor: the
eager step recorded once into a CUDA graph (inputs copied into its buffers) and replayed. Timed
per step with the ranks synchronized (a barrier before each step), median over the warm steps;
rank 0 writes the JSON (with every rank's medians).
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
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.decode_model import Config, make_caches, make_weights  # noqa: E402
from tests.tp_decode_model import TP, shard, tp_decode_step  # noqa: E402
os.environ.setdefault("TRIDENT_TUNING_DIR", "")  # a first call measures, as a first run (Note [Kept measurements])

VARIANTS = ("eager", "compile", "compile_reduce_overhead", "trident_compile", "trident_backend", "graph_floor")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench_tp.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--variants", default="")
    ap.add_argument("--collective", default="inplace", choices=("inplace", "functional"))
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args()
    dev = args.device
    backend = "nccl" if dev == "cuda" else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if dev == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    import trident

    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    cfg = Config(max_seq=256) if args.tiny else Config(layers=16, hidden=2048, heads=32, kv_heads=8,
                                                       intermediate=8192, max_seq=256)
    weights, cos, sin = make_weights(cfg, dev, dt)
    local_weights, caches = shard(cfg, weights, make_caches(cfg, dev, dt), rank, world)
    del weights
    step = functools.partial(tp_decode_step, cfg, TP(rank, world, args.collective))
    result = {"commit": os.environ.get("TRIDENT_COMMIT", "unknown"), "torch": torch.__version__, "world": world,
              "backend": backend, "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
              "method": __doc__.split("\n\n")[0].replace("\n", " "), "variants": {}}

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()
        dist.barrier()

    for variant in [v for v in (args.variants.split(",") if args.variants else VARIANTS) if v]:
        if variant == "graph_floor" and dev != "cuda":
            continue
        torch._dynamo.reset()
        fn = step
        if variant == "compile":
            fn = torch.compile(step)
        elif variant == "compile_reduce_overhead":
            fn = torch.compile(step, mode="reduce-overhead")
        elif variant == "trident_compile":
            fn = trident.compile(step)
        elif variant == "trident_backend":
            fn = torch.compile(step, backend="trident")
        entry: dict = {"us": []}
        g = torch.Generator().manual_seed(5)
        t_start = time.perf_counter()
        try:
            with torch.no_grad():
                if variant == "graph_floor":
                    fn = _graph_floor(step, cfg, dev, dt, cos, sin, caches, local_weights)
                for t in range(args.warmup + args.steps):
                    x = torch.randn(1, cfg.hidden, generator=g).to(device=dev, dtype=dt)  # fresh, as a loop makes it
                    pos = torch.tensor([t % cfg.max_seq], device=dev)
                    sync()
                    t0 = time.perf_counter()
                    out = fn(x, pos, cos, sin, *caches, *local_weights)
                    if dev == "cuda":
                        torch.cuda.synchronize()
                    if t >= args.warmup:
                        entry["us"].append((time.perf_counter() - t0) * 1e6)
            entry["last_sum"] = float(out.float().sum())
        except Exception as e:  # a mode that fails is its result
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        entry["wall_s"] = time.perf_counter() - t_start
        if entry["us"]:
            entry["median_us"] = statistics.median(entry["us"])
        if variant.startswith("trident"):
            entry["trident"] = trident.cache_info(fn)
        medians = [None] * world
        dist.all_gather_object(medians, entry.get("median_us"))
        entry["median_us_per_rank"] = medians
        result["variants"][variant] = entry
        if rank == 0:
            print(variant, {k: v for k, v in entry.items() if k not in ("us", "trident")}, flush=True)
    floor = result["variants"].get("graph_floor", {}).get("median_us")
    eager = result["variants"].get("eager", {}).get("median_us")
    result["ratios"] = {
        **({f"{v}_over_floor": e["median_us"] / floor for v, e in result["variants"].items() if floor and "median_us" in e}),
        **({f"{v}_over_eager": e["median_us"] / eager for v, e in result["variants"].items() if eager and "median_us" in e}),
    }
    if rank == 0:
        print(json.dumps(result["ratios"], indent=1))
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    dist.destroy_process_group()


def _graph_floor(step, cfg, dev, dt, cos, sin, caches, weights):
    """The eager step recorded once into a CUDA graph (NCCL collectives included); a call copies
    its fresh inputs into the graph's buffers and replays it: what no host code can beat."""
    static_x = torch.zeros(1, cfg.hidden, device=dev, dtype=dt)
    static_pos = torch.zeros(1, device=dev, dtype=torch.long)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step(static_x, static_pos, cos, sin, *caches, *weights)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step(static_x, static_pos, cos, sin, *caches, *weights)

    def replay(x, pos, *rest):
        static_x.copy_(x)
        static_pos.copy_(pos)
        graph.replay()
        return static_out

    return replay


if __name__ == "__main__":
    main()
