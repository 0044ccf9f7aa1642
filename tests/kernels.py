"""Triton kernels and the functions that launch them, in the styles users write.

Shared by the tests, the demo and the benchmarks (Triton needs kernels defined in files).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)


@triton.jit
def scale_rows_kernel(x_ptr, out_ptr, rows, cols, stride_row, scale, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # 2D grid: one program per (row block, column block).
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    mask = (r < rows) & (c < cols)
    x = tl.load(x_ptr + r * stride_row + c, mask=mask)
    tl.store(out_ptr + r * stride_row + c, x * scale * (r + 1).to(x.dtype), mask=mask)


@triton.jit
def inplace_mul_kernel(x_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor, mask=mask)


@triton.jit
def bias_act_kernel(x_ptr, bias_ptr, out_ptr, n, RELU: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if bias_ptr is not None:
        x = x + tl.load(bias_ptr + offs, mask=mask)
    if RELU:
        x = tl.maximum(x, 0.0)
    tl.store(out_ptr + offs, x, mask=mask)


@triton.jit
def int_ops_kernel(x_ptr, out_ptr, n, shift, stride, flip, BLOCK: tl.constexpr):
    # int scalars (shift, stride == 1 folded by Triton to a constexpr) and a bool scalar.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs * stride, mask=mask)
    y = x + shift
    y = tl.where(flip, -y, y)
    tl.store(out_ptr + offs, y, mask=mask)


def axpy(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    axpy_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n, 2.5, BLOCK=128)
    return out


def axpy_ref(x, y):
    return 2.5 * x + y


def two_kernels(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t = torch.empty_like(x)
    n = x.numel()
    axpy_kernel[(triton.cdiv(n, 64),)](x, y, t, n, 0.5, BLOCK=64, num_warps=2)
    out = torch.zeros_like(x)
    axpy_kernel[(triton.cdiv(n, 256),)](t, x, out, n, -1.0, BLOCK=256)
    return out


def two_kernels_ref(x, y):
    return -1.0 * (0.5 * x + y) + x


def scale_rows(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    rows, cols = x.shape
    grid = (triton.cdiv(rows, 16), triton.cdiv(cols, 32))
    scale_rows_kernel[grid](x, out, rows, cols, x.stride(0), 0.25, BLOCK_R=16, BLOCK_C=32)
    return out


def scale_rows_ref(x):
    r = torch.arange(1, x.shape[0] + 1, dtype=x.dtype, device=x.device)[:, None]
    return x * 0.25 * r


def inplace_mul(x: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    inplace_mul_kernel[(triton.cdiv(n, 128),)](x, n, 3.0, BLOCK=128)
    return x * 1.0


def inplace_mul_ref(x):
    x.mul_(3.0)
    return x * 1.0


def bias_act(x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.numel()
    with_bias = torch.empty_like(x)
    bias_act_kernel[(triton.cdiv(n, 128),)](x, bias, with_bias, n, RELU=True, BLOCK=128)
    no_bias = torch.empty_like(x)
    bias_act_kernel[(triton.cdiv(n, 128),)](x, None, no_bias, n, False, BLOCK=128)
    return with_bias, no_bias


def bias_act_ref(x, bias):
    return torch.relu(x + bias), x.clone()


def int_ops(x: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    out = torch.empty_like(x)
    int_ops_kernel[(triton.cdiv(n, 64),)](x, out, n, 7, 1, True, BLOCK=64)
    return out


def int_ops_ref(x):
    return -(x + 7)


@triton_op("trident_tests::axpy_op", mutates_args={})
def axpy_op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    wrap_triton(axpy_kernel)[(triton.cdiv(n, 128),)](x, y, out, n, 2.5, BLOCK=128)
    return out


def via_triton_op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return axpy_op(x, y) * 2


def via_triton_op_ref(x, y):
    return (2.5 * x + y) * 2


def via_wrap_triton(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    wrap_triton(axpy_kernel)[(triton.cdiv(n, 128),)](x, y, out, n, 2.5, BLOCK=128)
    return out


@triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["x_ptr"])
def unspecialized_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def unspecialized(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    unspecialized_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
    return out


# @triton.autotune / @triton.heuristics (Note [Autotuned launches]). Grids depend on the config.
def tuning_configs():
    return [
        triton.Config({"BLOCK": 32}, num_warps=1),
        triton.Config({"BLOCK": 64}, num_warps=2),
        triton.Config({"BLOCK": 256}, num_warps=4),
    ]


def _scaled(kernel, x, factor):
    """out = factor * x by `kernel`, its grid from the config's BLOCK."""
    out = torch.empty_like(x)
    n = x.numel()
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n, factor)
    return out


@triton.jit
def _scale_body(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor, mask=mask)


@triton.autotune(configs=tuning_configs(), key=["n"])
@triton.jit
def tuned_scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    _scale_body(x_ptr, out_ptr, n, factor, BLOCK)


def tuned_scale(x):
    return _scaled(tuned_scale_kernel, x, 3.0)


def _drop_first(configs, nargs, **kwargs):
    return configs[1:]


@triton.autotune(configs=tuning_configs(), key=["n"], prune_configs_by={"early_config_prune": _drop_first})
@triton.jit
def pruned_scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    _scale_body(x_ptr, out_ptr, n, factor, BLOCK)


def pruned_scale(x):
    return _scaled(pruned_scale_kernel, x, 2.0)


@triton.autotune(
    configs=[triton.Config({"BLOCK": 32}, pre_hook=lambda nargs: None), triton.Config({"BLOCK": 64})], key=["n"]
)
@triton.jit
def hooked_scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    _scale_body(x_ptr, out_ptr, n, factor, BLOCK)


def hooked_scale(x):
    return _scaled(hooked_scale_kernel, x, 2.0)


@triton.autotune(configs=tuning_configs(), key=["n"], reset_to_zero=["out_ptr"])
@triton.jit
def tuned_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # out[0] += sum(x): accumulates, so timing it needs reset_to_zero
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0)))


def tuned_sum(x):
    out = torch.zeros(1, device=x.device, dtype=x.dtype)
    n = x.numel()
    tuned_sum_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    return out


@triton.heuristics(
    {
        "EVEN": lambda args: args["n"] % args["BLOCK"] == 0,
        "WIDE": lambda args: args["x_ptr"].dtype == torch.float64,
    }
)
@triton.jit
def heuristic_double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr, WIDE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        x = tl.load(x_ptr + offs)
    else:
        x = tl.load(x_ptr + offs, mask=offs < n)
    if WIDE:
        y = x * 2.0
    else:
        y = (x.to(tl.float32) * 2.0).to(x.dtype)
    if EVEN:
        tl.store(out_ptr + offs, y)
    else:
        tl.store(out_ptr + offs, y, mask=offs < n)


def heuristic_double(x):
    out = torch.empty_like(x)
    n = x.numel()
    heuristic_double_kernel[(triton.cdiv(n, 64),)](x, out, n, BLOCK=64)
    return out


@triton.heuristics({"EVEN": lambda args: args["n"] % 16 == 0})  # before tuning: no BLOCK yet
@triton.autotune(configs=tuning_configs(), key=["n"])
@triton.jit
def heuristic_tuned_kernel(x_ptr, out_ptr, n, factor, EVEN: tl.constexpr, BLOCK: tl.constexpr):
    _scale_body(x_ptr, out_ptr, n, factor, BLOCK)


def heuristic_tuned(x):
    return _scaled(heuristic_tuned_kernel, x, 0.5)


@triton.autotune(configs=tuning_configs(), key=[])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def tuned_heuristic_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    _scale_body(x_ptr, out_ptr, n, factor, BLOCK)


def tuned_heuristic(x):
    return _scaled(tuned_heuristic_kernel, x, 4.0)


GLOBAL_SCALE = tl.constexpr(3.0)  # a module global the kernel reads: Triton guards its value


@triton.jit
def scale_by_global_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * GLOBAL_SCALE, mask=mask)


def scale_by_global(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    scale_by_global_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)
    return out


@triton.jit
def store_where_kernel(x_ptr, out_ptr, n, INTO_X: tl.constexpr, BLOCK: tl.constexpr):
    # which tensor the kernel writes depends on a constexpr
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask) * 2
    if INTO_X:
        tl.store(x_ptr + offs, v, mask=mask)
    else:
        tl.store(out_ptr + offs, v, mask=mask)
