"""python -m trident.demo: capture a function of Triton launches, optimize it, show every
stage (captured graph, optimized graph, SCM specializations and guards, hit/miss counts) and
check the results against eager. Runs on CUDA when available, else on the CPU (Triton's
interpreter behind Trident's native launch path)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import trident


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)


@triton.jit
def relu_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    out = torch.empty_like(x)
    axpy_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n, 2.0, BLOCK=256)
    relu_kernel[(triton.cdiv(n, 256),)](out, n, BLOCK=256)
    return out + 1


def reference(x, y):
    return torch.relu(2.0 * x + y) + 1


def banner(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)))


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, y = torch.randn(4096, device=device), torch.randn(4096, device=device)
    gm = trident.capture(step, x, y)
    banner(f"captured graph ({device})")
    print(gm.code.strip())
    opt = trident.optimize(gm)
    banner("optimized graph: one trident.scm call per region")
    print(opt.code.strip())
    for _ in range(3):
        x, y = torch.randn_like(x), torch.randn_like(y)
        torch.testing.assert_close(opt(x, y), reference(x, y))
    # A misaligned view: Triton would specialize differently, so the SCM misses once,
    # compiles the new specialization natively selectable from then on.
    xs = torch.randn(4097, device=device)[1:]
    torch.testing.assert_close(opt(xs, y), reference(xs, y))
    torch.testing.assert_close(opt(xs, y), reference(xs, y))
    banner("SCM IR: specializations and guards")
    print(trident.scm_text(opt).strip())
    banner("explain")
    print(trident.explain(opt).strip())
    banner("cache_info")
    for region, stats in trident.cache_info(opt).items():
        print(region, {k: stats[k] for k in ("hits", "misses", "specializations")})
    print("\nresults equal eager: OK")


if __name__ == "__main__":
    main()
