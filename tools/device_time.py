"""Issue 25 item 4 for every decode benchmark: the limit a step's time is measured against (the
HBM floor: every byte a step must read, at the GPU's peak bandwidth, `hbm_bytes_per_s`) and where a step's device
time goes -- torch.profiler's kernels by part of the step (matmuls, attention, user kernels,
Trident's, fused glue, ATen glue, copies), kernels per step and the idle time between them, and
under programmatic dependent launch (kernels overlapping) what each adds to the step (`critical_path`).
Used by tools/bench_hf.py, bench_generate.py, bench_decode.py and bench_recurrent.py."""

from __future__ import annotations

import importlib
import pkgutil
import time

import torch
from torch.autograd import DeviceType

# Peak memory bandwidth by the device's name (NVIDIA's data sheets), first match; the H200's
# (issue 25's targets are set on it) for any other device and on the CPU
PEAKS = (("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12),
         ("A100-SXM4-80GB", 2.039e12), ("A100 80GB PCIe", 1.935e12), ("A100", 1.555e12))
H200_BYTES_PER_S = 4.8e12


def hbm_bytes_per_s(name: "str | None" = None) -> float:
    """Peak HBM bandwidth of the GPU named `name` (default: the current CUDA device; the H200's
    where there is none or the name is not in PEAKS): the HBM floor of a run is that of the card
    it ran on (an H100's is 70 % of an H200's)."""
    if name is None:
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return next((peak for key, peak in PEAKS if key in name), H200_BYTES_PER_S)


def hbm_floor_us(nbytes: float) -> float:
    """Microseconds to read `nbytes` once at the current GPU's peak HBM bandwidth."""
    return nbytes / hbm_bytes_per_s() * 1e6


def trident_kernel_names() -> set:
    """The @triton.jit kernels Trident itself emits (trident/kernels/: copies, cache writes,
    decode attention)."""
    import trident.kernels as tk
    from triton.runtime.jit import JITFunction

    names = set()
    for info in pkgutil.iter_modules(tk.__path__):
        module = importlib.import_module(f"trident.kernels.{info.name}")
        names |= {v.__name__ for v in vars(module).values() if isinstance(v, JITFunction)}
    return names


_MATMUL = ("nvjet", "gemm", "gemv", "xmma", "cutlass", "cublas", "splitk", "gemmk1")
_ATTENTION = ("flash", "fmha", "cudnn", "attention", "sdpa", "softmax_warp")


def device_category(name: str, trident_kernels: set) -> str:
    """Issue 25 item 4: which part of a step a device kernel is -- 'matmul' (cuBLAS/cuBLASLt,
    CUTLASS, Trident's GEMVs), 'attention' (SDPA backends, Trident's decode attention), 'trident'
    (Trident's own copy and cache-write kernels), 'fused_glue' (Inductor-generated, `triton_poi_/per_/red_`),
    'user' (any other Triton kernel: the model's or a library's), 'copy' (memcpy/memset) or
    'glue' (ATen's elementwise, reduction and indexing kernels)."""
    low = name.lower()
    bare = name.split("(")[0].split()[-1] if name.split("(")[0].split() else name
    if low.startswith(("memcpy", "memset")):
        return "copy"
    if bare in trident_kernels:  # its decode attention, its GEMVs (choose_matmuls), its copies
        return "attention" if "attention" in bare else ("matmul" if bare.startswith("gemv") else "trident")
    if any(k in low for k in _ATTENTION):  # first: flash's split-KV kernels say "splitkv"
        return "attention"
    if any(k in low for k in _MATMUL):
        return "matmul"
    if bare.startswith(("triton_poi_", "triton_per_", "triton_red_")):
        return "fused_glue"
    if "::" not in name and "<" not in name and " " not in name:
        return "user"  # a Triton kernel is its function's bare name; CUDA C++ kernels have a signature
    return "glue"


def device_split(rows) -> dict:
    """Device time and kernels per step (or token) by part: rows of (us, count, kernel name)."""
    ours = trident_kernel_names()
    split: dict = {}
    for us, count, name in rows:
        part = split.setdefault(device_category(name, ours), {"us": 0.0, "kernels": 0.0})
        part["us"] += us
        part["kernels"] += count
    return {k: {"us": round(v["us"], 1), "kernels": round(v["kernels"], 2)}
            for k, v in sorted(split.items(), key=lambda kv: -kv[1]["us"])}


def critical_path(kernels) -> tuple:
    """Each kernel's share of the device's busy span: `kernels` are (start, end, name) in
    microseconds, on one GPU. Under programmatic dependent launch a kernel starts while the one
    before it still runs and waits inside (its own duration then counts that wait): what it adds
    to the step is its end less the latest end before it (`exposed`), and the device idles only
    where a kernel starts after every earlier one ended (`gaps`). Returns ({name: exposed us},
    gap us, span us); the exposed times and the gaps sum to the span."""
    exposed: dict = {}
    gaps = 0.0
    first = last = None
    for start, end, name in sorted(kernels):
        if last is None:
            first, last = start, start
        gaps += max(0.0, start - last)
        exposed[name] = exposed.get(name, 0.0) + max(0.0, end - max(start, last))
        last = max(last, end)
    return exposed, gaps, (last - first) if last is not None else 0.0


def kernel_event(e) -> bool:
    """A profiler event (or average) of device work: on CUDA and no user annotation (a
    `record_function` range torch lists on the device too, spanning the kernels inside it)."""
    return e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)


def timeline(prof, per: int) -> dict:
    """From a torch.profiler run of `per` steps (or tokens) on CUDA, per unit: the device's idle
    time between the run's first and last kernel (`critical_path`'s gaps), that span, and what each
    part and kernel adds to it (`exposed_split`, `exposed_top`): under programmatic dependent launch
    kernels overlap and a kernel's own duration includes its wait. Each GPU's kernels are one
    timeline (summed over GPUs); `record_function` ranges the profiler lists as device events are
    no kernels."""

    per_device: dict = {}  # a timeline per GPU (every stream of one GPU on one timeline)
    for e in prof.events():
        if kernel_event(e) and e.time_range.end > e.time_range.start:
            per_device.setdefault(e.device_index, []).append((e.time_range.start, e.time_range.end, e.name))
    exposed, gaps, span, counts = {}, 0.0, 0.0, {}
    for kernels in per_device.values():
        one, one_gaps, one_span = critical_path(kernels)
        for name, us in one.items():
            exposed[name] = exposed.get(name, 0.0) + us
        gaps, span = gaps + one_gaps, span + one_span
        for _, _, name in kernels:
            counts[name] = counts.get(name, 0) + 1
    rows = sorted(((us / per, counts[name] / per, name) for name, us in exposed.items()), reverse=True)
    return {"idle_us": round(gaps / per, 1), "span_us": round(span / per, 1), "exposed_split": device_split(rows),
            "exposed_top": [{"us": round(u, 1), "n": round(c, 2), "name": k[:100]} for u, c, k in rows[:16]]}


def profile_device(run, per: int) -> dict:
    """Device time of one call of `run` (on CUDA), per unit (`per` steps or tokens in the call):
    device microseconds (every kernel's own duration) and kernels, the split by part, the top
    kernels, the call's wall time (profiler included) and `timeline`'s idle time, span and what
    each part and kernel adds to the span."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        run()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0) or 0
        if kernel_event(e) and us > 0:
            rows.append((us / per, e.count / per, e.key))
    rows.sort(reverse=True)
    busy = sum(r[0] for r in rows)
    return {"device_us": round(busy, 1), "kernels": round(sum(r[1] for r in rows), 1),
            "wall_us": round(wall / per * 1e6, 1), "device_split": device_split(rows),
            "top": [{"us": round(u, 1), "n": round(c, 2), "name": k[:100]} for u, c, k in rows[:12]],
            **timeline(prof, per)}
