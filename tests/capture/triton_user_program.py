"""A user's own Triton program, run in a fresh process by test_triton_interop.py:
    python -m tests.capture.triton_user_program {unset|before|after}
TRITON_INTERPRET=1 is set before importing Triton and Trident ("before"), after both imports
but before the kernels are defined ("after"), or not at all ("unset"). Prints one JSON line:
for each phase (eager before capture, Trident, eager after), "ok" or the error."""

from __future__ import annotations

import json
import os
import sys

mode = sys.argv[1]
if mode == "before":
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import trident  # noqa: E402

if mode == "after":
    os.environ["TRITON_INTERPRET"] = "1"


@triton.jit
def _scaled(v, s):
    return v * s


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, _scaled(tl.load(x_ptr + offs, mask=mask), s), mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def tuned_add_one(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def negate(x_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(x_ptr + offs, -tl.load(x_ptr + offs))
    else:
        mask = offs < n
        tl.store(x_ptr + offs, -tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def total_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))


def program(x):
    n = x.numel()
    y = torch.empty_like(x)
    scale_kernel[(triton.cdiv(n, 64),)](x, y, n, 3.0, BLOCK=64)
    z = torch.empty_like(x)
    tuned_add_one[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](y, z, n)
    negate[(triton.cdiv(n, 32),)](z, n, BLOCK=32)
    return z * 2


def reference(x):
    return -(x * 3.0 + 1.0) * 2


def untuned_program(x):
    # Triton cannot autotune without a driver of its own (TRITON_INTERPRET=1 or not): this part
    # runs eagerly under the interpreter first.
    y = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), 3.0, BLOCK=64)
    negate[(triton.cdiv(x.numel(), 32),)](y, x.numel(), BLOCK=32)
    return y


def reduction(x):
    # tl.sum is a @triton.jit device function, never hashed before in this process (a launch
    # once failed on that). Triton's own interpreter cannot run it when TRITON_INTERPRET=1 was
    # set after `import triton` (tl.sum is then compiled, the kernel interpreted): "after" mode.
    total = torch.empty(1, dtype=x.dtype)
    total_kernel[(1,)](x, total, x.numel(), BLOCK=128)
    return total


def untuned_reference(x):
    return -x * 3.0


def language_state() -> dict:
    """What Triton's interpreter patches while a kernel runs: triton.language, its core and math
    modules, and the tensor and dtype classes."""
    return {(owner.__name__, name): value
            for owner in (tl, tl.core, tl.math, tl.tensor, tl.dtype)
            for name, value in list(vars(owner).items())}


def still_patched(before: dict) -> list:
    """Names that eager launches left changed (Triton's interpreter once left
    triton.language.core patched after a kernel calling tl.sum)."""
    now = language_state()
    return sorted(f"{owner}.{name}" for (owner, name), value in before.items() if now.get((owner, name)) is not value)


def phase(fn, ref=reference) -> str:
    try:
        x = torch.randn(100)
        torch.testing.assert_close(fn(x), ref(x))
        return "ok"
    except Exception as e:  # reported, not raised: the test compares phases
        return f"{type(e).__name__}: {str(e)[:200]}"


pristine = language_state()
result = {
    "kernel_type": type(scale_kernel).__name__,
    "eager_reduction_first": phase(reduction, lambda x: x.sum().reshape(1)),
    "eager_untuned_before": phase(untuned_program, untuned_reference),
    "eager_before": phase(program),
}
result["patched_after_eager"] = still_patched(pristine)[:10]
opt = trident.optimize(trident.capture(program, torch.randn(100)))
result["trident"] = phase(opt)
result["scm_nodes"] = sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes)
result["eager_after"] = phase(program)
result["eager_untuned_after"] = phase(untuned_program, untuned_reference)
print(json.dumps(result))
