"""A recurrent (linear-attention style) decode model written the way real Triton libraries keep
state: a cache object whose per-layer dicts get a NEW state tensor every step (made by a
Triton kernel, out of place), and a Python int counting tokens, read as a position. Used by the
CPU tests (tests/frontends/test_state.py) and the GPU benchmark (tools/bench_recurrent.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def decay_update_kernel(state_ptr, k_ptr, v_ptr, out_ptr, D: tl.constexpr, decay, BLOCK: tl.constexpr):
    # out[b, i, j] = decay * state[b, i, j] + k[b, i] * v[b, j]; one program per (b, i) row
    row = tl.program_id(0)
    b = row // D
    i = row % D
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    s = tl.load(state_ptr + row * D + offs, mask=mask).to(tl.float32)
    k = tl.load(k_ptr + b * D + i).to(tl.float32)
    v = tl.load(v_ptr + b * D + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + row * D + offs, (decay * s + k * v).to(out_ptr.dtype.element_ty), mask=mask)


class RecurrentCache:
    """Per layer a dict {"recurrent_state": [B, D, D]} replaced on every update; `seen` counts
    tokens in a Python int (as a library's Cache does)."""

    def __init__(self):
        self.states: list = []
        self.seen = 0

    def update(self, layer: int, state: torch.Tensor) -> None:
        if len(self.states) <= layer:
            self.states.append({"recurrent_state": state})
        else:
            self.states[layer]["recurrent_state"] = state
        if layer == 0:
            self.seen += 1


class RecurrentLayer(torch.nn.Module):
    def __init__(self, dim: int, decay: float):
        super().__init__()
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.k = torch.nn.Linear(dim, dim, bias=False)
        self.v = torch.nn.Linear(dim, dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)
        self.decay = decay

    def forward(self, x, cache: RecurrentCache, index: int):
        b, d = x.shape
        # bounded as a real model's normalized projections are: |state| <= 1 / (1 - decay)
        q, k, v = torch.tanh(self.q(x)) * d**-0.5, torch.tanh(self.k(x)) * d**-0.5, torch.tanh(self.v(x))
        old = cache.states[index]["recurrent_state"] if index < len(cache.states) else x.new_zeros(b, d, d)
        new = torch.empty_like(old)
        decay_update_kernel[(b * d,)](old, k.contiguous(), v.contiguous(), new, d, self.decay,
                                      BLOCK=triton.next_power_of_2(d))
        cache.update(index, new)
        return x + self.o(torch.bmm(new, q.unsqueeze(-1)).squeeze(-1))


class RecurrentModel(torch.nn.Module):
    """`layers` recurrent layers; a learned position table indexed by the cache's Python counter."""

    def __init__(self, dim: int = 16, layers: int = 3, max_positions: int = 256):
        super().__init__()
        self.layers = torch.nn.ModuleList(RecurrentLayer(dim, 0.9 - 0.1 * i) for i in range(layers))
        self.positions = torch.nn.Parameter(torch.randn(max_positions, dim) * 0.1)

    def forward(self, x, cache: RecurrentCache):
        x = x + self.positions[cache.seen]
        for i, layer in enumerate(self.layers):
            x = layer(x, cache, i)
        return torch.tanh(x)


def decode(step, model_dim: int, steps: int, batch: int = 1, device="cpu", dtype=torch.float32, seed: int = 0):
    """Greedy-style decode: each step's input is the previous step's output (a fresh tensor)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, model_dim, generator=g).to(device=device, dtype=dtype)
    cache = RecurrentCache()
    outs = []
    with torch.no_grad():
        for _ in range(steps):
            x = step(x, cache)
            outs.append(x)
    return outs, cache
