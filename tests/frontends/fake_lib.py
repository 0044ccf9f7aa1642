"""A small kernel library for test_disabled_functions.py: torch.compiler.disable()d dispatchers
as libraries write them, pure and stateful (Note [Disabled functions under backend="trident"]).
A module of its own, outside torch, as a library's would be; the tests reload it for fresh
functions and state."""

from __future__ import annotations

import torch
import triton

from tests import kernels as K

BLOCKS: dict = {}  # (dtype, numel) -> block size: a memo of plain data, as Liger's _AVAILABLE_MEMO
WORKSPACES: dict = {}  # (numel, dtype, device) -> a scratch tensor reused across calls
CALLS = 0  # calls of counted_dispatch


def _block(x: torch.Tensor) -> int:
    key = (x.dtype, x.numel())
    block = BLOCKS.get(key)
    if block is None:
        block = BLOCKS[key] = 64 if x.numel() < 4096 else 256
    return block


@torch.compiler.disable
def axpy_dispatch(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    """Pure: a Triton launch between ATen ops; its helper fills a memo of plain data."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    block = _block(x)
    K.axpy_kernel[(triton.cdiv(n, block),)](x, y, out, n, alpha, BLOCK=block)
    return torch.relu(out) + 1


def axpy_reference(x, y, alpha):
    return torch.relu(alpha * x + y) + 1


@torch.compiler.disable
def workspace_dispatch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Stateful: keeps a scratch tensor per shape (a fake tensor, were it kept from a fake run)."""
    key = (x.numel(), x.dtype, x.device)
    buf = WORKSPACES.get(key)
    if buf is None:
        buf = WORKSPACES[key] = torch.empty_like(x)
    n = x.numel()
    K.axpy_kernel[(triton.cdiv(n, 64),)](x, y, buf, n, 2.0, BLOCK=64)
    return buf.clone()


@torch.compiler.disable
def counted_dispatch(x: torch.Tensor) -> torch.Tensor:
    """Stateful: counts its calls in a module global."""
    global CALLS
    CALLS += 1
    return x * 2 + 1


@torch.compiler.disable
def norm_dispatch(x: torch.Tensor):
    """Pure; returns `(y, None, rstd)`, as flash-linear-attention's norms do (an RMSNorm has no
    mean): tensors and a None."""
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    scaled = (x * rstd).contiguous()
    out = torch.empty_like(scaled)
    n = scaled.numel()
    K.axpy_kernel[(triton.cdiv(n, 64),)](scaled, scaled, out, n, 1.0, BLOCK=64)
    return out, None, rstd


@torch.compiler.disable
def shape_of(x: torch.Tensor) -> int:
    """Pure, but returns a Python int: not a call a graph can keep."""
    return x.shape[0] * 2


def make_counter():
    """A disabled function counting its calls in a closure variable; (function, read count)."""
    calls = 0

    @torch.compiler.disable
    def counted(x):
        nonlocal calls
        calls += 1
        return x + 1

    return counted, lambda: calls


class Scaler:
    """An object whose bound method a library disables: its state is reachable through `self`."""

    def __init__(self):
        self.seen: list = []

    def scale(self, x):
        self.seen.append(tuple(x.shape))
        return x * 3
