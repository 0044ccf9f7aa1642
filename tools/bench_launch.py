"""Host cost per call of tiny Triton kernels: eager kernel[grid], torch.compile, Trident, a bare
cuLaunchKernel loop in C++, and CUDA-graph replay, all in ONE run on one GPU.

    python tools/bench_launch.py --out results/bench_launch.json

(a) one tiny kernel called from Python; (b) a region of 10 tiny kernels (one allocation, then
ten launches). Host µs per call = wall time of a loop of calls (launches enqueue, GPU idle
enough never to back-pressure) / calls; median over repetitions, after warm-up, with the device
synchronized before and after every timed loop. CUDA-graph replay is reported both as host cost
of a replay and as device time per replay (CUDA events), the device floor.
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
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import trident  # noqa: E402
from trident.lowering.host_plan import slot_bits  # noqa: E402
from trident.runtime import SCMRuntime  # noqa: E402
from trident.runtime import native  # noqa: E402
from trident.runtime.native import C  # noqa: E402
from trident.scm.ir import ValueRef  # noqa: E402

N = 1024
BLOCK = 1024


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.autotune(
    configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((256, 1), (512, 2), (1024, 4))], key=["n"]
)
@triton.jit
def tuned_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def one_tuned_kernel(x, y):
    """(c) an @triton.autotune kernel: eager pays the autotuner's per-call key and cache lookup."""
    out = torch.empty_like(x)
    tuned_add_kernel[lambda meta: (triton.cdiv(N, meta["BLOCK"]),)](x, y, out, N)
    return out


def one_kernel(x, y):
    out = torch.empty_like(x)
    add_kernel[(1,)](x, y, out, N, BLOCK=BLOCK)
    return out


def ten_kernels(x, y):
    out = torch.empty_like(x)
    add_kernel[(1,)](x, y, out, N, BLOCK=BLOCK)
    for _ in range(9):
        add_kernel[(1,)](out, y, out, N, BLOCK=BLOCK)
    return out


def host_us(fn, iters: int, reps: int, warmup: int = 50) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            fn()
        t1 = time.perf_counter_ns()
        torch.cuda.synchronize()
        samples.append((t1 - t0) / iters / 1e3)
    return statistics.median(samples)


def device_us_per_replay(graph, iters: int, reps: int) -> float:
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / iters)
    return statistics.median(samples)


def bare_launch_us(opt, x, y, out, iters: int, reps: int) -> float:
    """The region's launches through a C++ loop of cuLaunchKernel, same kernels and arguments."""
    (rid,) = opt.meta["trident_regions"]
    spec = SCMRuntime.get(rid).scm.specializations[0]
    # Region inputs in the op's order; every allocation -> `out`.
    by_index = dict(enumerate(_region_inputs(opt, x, y)))
    launches = []
    for plan in spec.launches:
        slots = []
        for p in plan.params:
            if isinstance(p.source, ValueRef):
                t = by_index[p.source.index] if p.source.kind == "input" else out
                slots.append(t.data_ptr())
            else:
                slots.append(slot_bits(p.ty, p.source))
        launches.append((native.register_launch(plan), *plan.step.grid, slots))  # its process-wide entry (memoized)
    dev = x.device.index or 0
    return native_loop_us(lambda n: C.bare_launch_loop(launches, dev, n), iters, reps)


def native_loop_us(loop_ns, iters: int, reps: int) -> float:
    """Median µs per iteration of a C++ loop that reports its own nanoseconds."""
    loop_ns(50)
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        ns = loop_ns(iters)
        torch.cuda.synchronize()
        samples.append(ns / iters / 1e3)
    return statistics.median(samples)


def trident_profile(opt, x, y, iters: int, reps: int) -> dict:
    """Where Trident's host time goes: each layer of the call peeled off in turn."""
    (rid,) = opt.meta["trident_regions"]
    node = next(n for n in opt.graph.nodes if n.target is torch.ops.trident.scm.default)
    inputs = _region_inputs(opt, x, y)
    n_mut = len(node.args[1])
    mutated, reads = inputs[:n_mut], inputs[n_mut:]
    op = torch.ops.trident.scm.default
    prof = {
        "gm_call": host_us(lambda: opt(x, y), iters, reps),
        "gm_forward": host_us(lambda: opt.forward(x, y), iters, reps),
        "torch_ops_call": host_us(lambda: op(rid, mutated, reads), iters, reps),
        "pybind_run": host_us(lambda: C.run(rid, inputs), iters, reps),
    }
    prof["native_loop"] = native_loop_us(lambda n: C.run_loop(rid, inputs, n), iters, reps)
    return prof


def _region_inputs(opt, x, y):
    node = next(n for n in opt.graph.nodes if n.target is torch.ops.trident.scm.default)
    names = [a.name for a in node.args[1]] + [a.name for a in node.args[2]]
    placeholders = [n.name for n in opt.graph.nodes if n.op == "placeholder"]
    by_name = dict(zip(placeholders, (x, y)))
    return [by_name[n] for n in names]


def measure(fn, name: str, iters: int, reps: int) -> dict:
    x = torch.randn(N, device="cuda")
    y = torch.randn(N, device="cuda")
    res: dict = {}
    ref = fn(x, y)
    res["eager_us"] = host_us(lambda: fn(x, y), iters, reps)

    compiled = torch.compile(fn)
    torch.testing.assert_close(compiled(x, y), ref)
    res["torch_compile_us"] = host_us(lambda: compiled(x, y), iters, reps)

    # Default configuration: graph replay where it pays off (Note [When a graph pays off]: not
    # for one kernel, yes for ten); then the same region with graphs off (every call runs the
    # native host program), which is what the bare cuLaunchKernel loop and the profile compare.
    opt = trident.optimize(trident.capture(fn, x, y))
    torch.testing.assert_close(opt(x, y), ref)
    res["trident_us"] = host_us(lambda: opt(x, y), iters, reps)
    torch.testing.assert_close(opt(x, y), ref)
    res["trident_cache_info"] = trident.cache_info(opt)
    res["trident_graphs"] = [line for line in trident.explain(opt).splitlines() if "graph" in line or "autotuned" in line]

    with trident.knobs.scope(graphs=""):
        opt = trident.optimize(trident.capture(fn, x, y))
    torch.testing.assert_close(opt(x, y), ref)
    res["trident_no_graphs_us"] = host_us(lambda: opt(x, y), iters, reps)

    out = torch.empty_like(x)
    res["bare_cuLaunchKernel_us"] = bare_launch_us(opt, x, y, out, iters, reps)
    res["trident_no_graphs_profile_us"] = trident_profile(opt, x, y, iters, reps)

    static_x, static_y = x.clone(), y.clone()
    fn(static_x, static_y)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(static_x, static_y)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out, ref)
    res["cuda_graph_replay_host_us"] = host_us(graph.replay, iters, reps)
    res["cuda_graph_replay_device_us"] = device_us_per_replay(graph, iters, reps)

    res["ratios"] = {
        "eager_over_trident": res["eager_us"] / res["trident_us"],
        "torch_compile_over_trident": res["torch_compile_us"] / res["trident_us"],
        "trident_over_bare": res["trident_us"] / res["bare_cuLaunchKernel_us"],
        "trident_no_graphs_over_bare": res["trident_no_graphs_us"] / res["bare_cuLaunchKernel_us"],
        "trident_over_graph_replay_host": res["trident_us"] / res["cuda_graph_replay_host_us"],
    }
    return res


def git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True, cwd=os.path.dirname(__file__)).strip()
    except Exception:
        return os.environ.get("TRIDENT_COMMIT", "unknown")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench_launch.json")
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--cases", default="one_kernel,ten_kernels,one_tuned_kernel")
    args = ap.parse_args()
    cases = args.cases.split(",")
    assert torch.cuda.is_available(), "bench_launch.py measures on a CUDA GPU"
    result = {
        "commit": os.environ.get("TRIDENT_COMMIT") or git_commit(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "method": "host us per call: median over reps of (wall time of `iters` calls / iters), warmed, synchronized before/after each loop",
    }
    fns = {"one_kernel": (one_kernel, 1), "ten_kernels": (ten_kernels, 4), "one_tuned_kernel": (one_tuned_kernel, 1)}
    for case in cases:
        fn, div = fns[case]
        result[case] = measure(fn, case, args.iters // div, args.reps)
    if "ten_kernels" in result:
        t = result["ten_kernels"]
        t["per_kernel"] = {k: t[k] / 10 for k in ("eager_us", "torch_compile_us", "trident_us", "trident_no_graphs_us", "bare_cuLaunchKernel_us")}
    if "one_tuned_kernel" in result:
        result["one_tuned_kernel"]["autotuner_cache"] = {str(k): str(c) for k, c in tuned_add_kernel.cache.items()}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"{'case':<12} {'eager':>8} {'compile':>8} {'trident':>8} {'no-graph':>8} {'bare':>8} {'graph(h)':>9} {'graph(d)':>9}")
    for case in cases:
        r = result[case]
        print(
            f"{case:<12} {r['eager_us']:8.2f} {r['torch_compile_us']:8.2f} {r['trident_us']:8.2f} {r['trident_no_graphs_us']:8.2f} "
            f"{r['bare_cuLaunchKernel_us']:8.2f} {r['cuda_graph_replay_host_us']:9.2f} {r['cuda_graph_replay_device_us']:9.2f}"
        )
    print(json.dumps({c: result[c]["ratios"] for c in cases}, indent=1))
    print(json.dumps({c: result[c]["trident_no_graphs_profile_us"] for c in cases}, indent=1))


if __name__ == "__main__":
    main()
