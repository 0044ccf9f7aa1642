"""A small LLM decode step built the way users write one: own Triton kernels for RMSNorm,
rotary embedding, SiLU-and-multiply and the residual add; ATen for matmuls, attention and the
KV-cache writes; views in between. Shared by tests/test_decode_step.py and tools/bench_decode.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * n + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    tl.store(out_ptr + row * n + offs, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rotary_kernel(x_ptr, cos_ptr, sin_ptr, HALF: tl.constexpr):
    # In place on one head of x (program id = head): (x1, x2) -> (x1 c - x2 s, x2 c + x1 s).
    head = tl.program_id(0)
    offs = tl.arange(0, HALF)
    base = x_ptr + head * 2 * HALF
    x1 = tl.load(base + offs).to(tl.float32)
    x2 = tl.load(base + HALF + offs).to(tl.float32)
    c = tl.load(cos_ptr + offs).to(tl.float32)
    s = tl.load(sin_ptr + offs).to(tl.float32)
    tl.store(base + offs, (x1 * c - x2 * s).to(x_ptr.dtype.element_ty))
    tl.store(base + HALF + offs, (x2 * c + x1 * s).to(x_ptr.dtype.element_ty))


@triton.jit
def silu_mul_kernel(gu_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # Row program_id(1) of gu = [gate | up] (2n wide) -> silu(gate) * up (n wide).
    row = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(gu_ptr + row * 2 * n + offs, mask=mask).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * n + n + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + row * n + offs, (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def residual_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + tl.load(y_ptr + offs, mask=mask), mask=mask)


@dataclass(frozen=True)
class Config:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    max_seq: int = 32
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def make_weights(cfg: Config, device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.1):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    hd = cfg.head_dim
    layers = []
    for _ in range(cfg.layers):
        layers += [
            1.0 + w(cfg.hidden),  # ln1
            w(cfg.heads * hd, cfg.hidden),  # wq
            w(cfg.kv_heads * hd, cfg.hidden),  # wk
            w(cfg.kv_heads * hd, cfg.hidden),  # wv
            w(cfg.hidden, cfg.heads * hd),  # wo
            1.0 + w(cfg.hidden),  # ln2
            w(2 * cfg.intermediate, cfg.hidden),  # gate_up
            w(cfg.hidden, cfg.intermediate),  # down
        ]
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    angles = torch.arange(cfg.max_seq, dtype=torch.float32)[:, None] * inv[None, :]
    return layers, angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)


def make_caches(cfg: Config, device, dtype=torch.float32, batch: int = 1):
    shape = (batch, cfg.kv_heads, cfg.max_seq, cfg.head_dim)
    return [torch.zeros(shape, device=device, dtype=dtype) for _ in range(2 * cfg.layers)]


def _rmsnorm(cfg, x, w):
    out = torch.empty_like(x)
    rmsnorm_kernel[(x.shape[0],)](x, w, out, x.shape[-1], cfg.eps, BLOCK=triton.next_power_of_2(x.shape[-1]))
    return out


def _add(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    residual_add_kernel[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)
    return out


def decode_step(cfg: Config, x, pos, cos_table, sin_table, *caches_and_weights):
    """One token per sequence (x: [batch, hidden]) through `cfg.layers` layers, all sequences
    at position `pos`; writes the KV caches ([batch, kv_heads, max_seq, head_dim]) in place."""
    return decode_layers(cfg, cfg.heads, cfg.kv_heads, cfg.intermediate, None, x, pos, cos_table, sin_table,
                         *caches_and_weights)


def decode_layers(cfg: Config, H: int, KV: int, I: int, reduce, x, pos, cos_table, sin_table, *caches_and_weights):
    """decode_step's layers over H query heads, KV key/value heads and I intermediate columns
    (all of them, or one tensor-parallel rank's: tests/tp_decode_model.py), `reduce` (None: none)
    applied to the attention output's and the MLP's partial projections."""
    hd = cfg.head_dim
    B = x.shape[0]
    caches = caches_and_weights[: 2 * cfg.layers]
    weights = caches_and_weights[2 * cfg.layers:]
    cos = cos_table.index_select(0, pos)
    sin = sin_table.index_select(0, pos)
    mask = (torch.arange(cfg.max_seq, device=x.device) <= pos).view(1, 1, 1, cfg.max_seq)
    for layer in range(cfg.layers):
        ln1, wq, wk, wv, wo, ln2, w_gu, w_down = weights[8 * layer: 8 * layer + 8]
        k_cache, v_cache = caches[2 * layer], caches[2 * layer + 1]
        h = _rmsnorm(cfg, x, ln1)
        q = torch.nn.functional.linear(h, wq)
        k = torch.nn.functional.linear(h, wk)
        v = torch.nn.functional.linear(h, wv)
        rotary_kernel[(B * H,)](q, cos, sin, HALF=hd // 2)
        rotary_kernel[(B * KV,)](k, cos, sin, HALF=hd // 2)
        k_cache.index_copy_(2, pos, k.view(B, KV, 1, hd))
        v_cache.index_copy_(2, pos, v.view(B, KV, 1, hd))
        kk = k_cache[:, :, None].expand(B, KV, H // KV, cfg.max_seq, hd).reshape(B, H, cfg.max_seq, hd)
        vv = v_cache[:, :, None].expand(B, KV, H // KV, cfg.max_seq, hd).reshape(B, H, cfg.max_seq, hd)
        attn = torch.nn.functional.scaled_dot_product_attention(q.view(B, H, 1, hd), kk, vv, attn_mask=mask)
        o = torch.nn.functional.linear(attn.reshape(B, H * hd), wo)
        x = _add(x, o if reduce is None else reduce(o))
        gu = torch.nn.functional.linear(_rmsnorm(cfg, x, ln2), w_gu)
        act = torch.empty(B, I, device=x.device, dtype=x.dtype)
        silu_mul_kernel[(triton.cdiv(I, 128), B)](gu, act, I, BLOCK=128)
        d = torch.nn.functional.linear(act, w_down)
        x = _add(x, d if reduce is None else reduce(d))
    return x


def decode_step_reference(cfg: Config, x, pos, cos_table, sin_table, *caches_and_weights):
    """The same math in plain PyTorch (no Triton), for checking."""
    hd, H, KV = cfg.head_dim, cfg.heads, cfg.kv_heads
    B = x.shape[0]
    caches = caches_and_weights[: 2 * cfg.layers]
    weights = caches_and_weights[2 * cfg.layers:]
    cos = cos_table.index_select(0, pos)
    sin = sin_table.index_select(0, pos)

    def rms(t, w):
        t32 = t.float()
        return (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + cfg.eps) * w.float()).to(t.dtype)

    def rope(t, heads):
        t = t.view(B * heads, 2, hd // 2).float()
        x1, x2 = t[:, 0], t[:, 1]
        c, s = cos.float(), sin.float()
        return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=1).reshape(B, heads * hd).to(x.dtype)

    mask = (torch.arange(cfg.max_seq, device=x.device) <= pos).view(1, 1, 1, cfg.max_seq)
    for layer in range(cfg.layers):
        ln1, wq, wk, wv, wo, ln2, w_gu, w_down = weights[8 * layer: 8 * layer + 8]
        k_cache, v_cache = caches[2 * layer], caches[2 * layer + 1]
        h = rms(x, ln1)
        q = rope(h @ wq.t(), H)
        k = rope(h @ wk.t(), KV)
        v = h @ wv.t()
        k_cache.index_copy_(2, pos, k.view(B, KV, 1, hd))
        v_cache.index_copy_(2, pos, v.view(B, KV, 1, hd))
        kk = k_cache.repeat_interleave(H // KV, dim=1)
        vv = v_cache.repeat_interleave(H // KV, dim=1)
        attn = torch.nn.functional.scaled_dot_product_attention(q.view(B, H, 1, hd), kk, vv, attn_mask=mask)
        x = x + attn.reshape(B, H * hd) @ wo.t()
        gu = rms(x, ln2) @ w_gu.t()
        g, u = gu[:, : cfg.intermediate].float(), gu[:, cfg.intermediate:].float()
        x = x + ((g * torch.sigmoid(g) * u).to(x.dtype)) @ w_down.t()
    return x


def check_steps_against_reference(cfg: Config, opt, weights, cos, sin, positions, device="cpu", batch: int = 1):
    """Runs `opt` (an optimized decode_step) and decode_step_reference from identical zeroed
    caches over `positions`; outputs and every cache must agree after each step."""
    caches, ref_caches = make_caches(cfg, device, batch=batch), make_caches(cfg, device, batch=batch)
    positions = list(positions)
    # every step's inputs held until the end: each step sees a fresh token and position tensor
    xs = [torch.randn(batch, cfg.hidden, device=device) for _ in positions]
    ps = [torch.tensor([p], device=device) for p in positions]
    for x, pos in zip(xs, ps):
        got = opt(x, pos, cos, sin, *caches, *weights)
        want = decode_step_reference(cfg, x.clone(), pos, cos, sin, *ref_caches, *weights)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for c, r in zip(caches, ref_caches):
            torch.testing.assert_close(c, r, rtol=1e-4, atol=1e-4)


def misaligned(t: torch.Tensor, elements: int = 1) -> torch.Tensor:
    """t's values in a tensor whose data starts `elements` elements past a 16-byte boundary:
    Triton's key changes for kernels that read it (a miss)."""
    per16 = 16 // t.element_size()
    base = torch.empty(t.numel() + per16, dtype=t.dtype, device=t.device)
    shift = (elements - (base.data_ptr() // t.element_size()) % per16) % per16
    out = base[shift: shift + t.numel()].view_as(t)
    out.copy_(t)
    assert out.data_ptr() % 16 == (elements * t.element_size()) % 16
    return out


def decode_call(layers: int, device) -> tuple:
    """(the decode step of `layers` layers, float32, batch 1, and its arguments: a hidden state,
    position 0, the rotary tables, the caches and the weights) -- what the tools time."""
    import functools

    cfg = Config(layers=layers)
    weights, cos, sin = make_weights(cfg, device)
    caches = make_caches(cfg, device)
    x = torch.randn(1, cfg.hidden, device=device)
    pos = torch.tensor([0], device=device)
    return functools.partial(decode_step, cfg), [x, pos, cos, sin, *caches, *weights]
