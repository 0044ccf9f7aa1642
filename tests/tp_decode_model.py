"""The decode step of tests/decode_model.py with tensor parallelism, the way Megatron-style code
writes it: attention heads and the MLP's intermediate columns split across ranks (q/k/v and
gate/up column-parallel, o and down row-parallel), an all-reduce after the attention output and
after the MLP, the same Triton kernels (RMSNorm, rotary, SiLU-mul, residual add) on each rank.
Shared by tests/test_tensor_parallel.py and tools/bench_tp.py.

`shard(cfg, weights, caches, rank, world)` cuts the unsharded decode_step's weights and caches,
so a rank's outputs can be checked against decode_step_reference on the full model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tests.decode_model import Config, decode_layers


@dataclass(frozen=True)
class TP:
    rank: int
    world: int
    collective: str = "inplace"  # "inplace": dist.all_reduce(t); "functional": funcol + wait_tensor


def shard(cfg: Config, weights, caches, rank: int, world: int):
    """(local weights, local caches) of `rank`: heads and intermediate columns split in `world`."""
    if cfg.heads % world or cfg.kv_heads % world or cfg.intermediate % world:
        raise ValueError(f"heads {cfg.heads}, kv_heads {cfg.kv_heads}, intermediate {cfg.intermediate} "
                         f"must divide by the world size {world}")
    I = cfg.intermediate
    out = []
    for layer in range(cfg.layers):
        ln1, wq, wk, wv, wo, ln2, w_gu, w_down = weights[8 * layer: 8 * layer + 8]
        gate, up = w_gu[:I], w_gu[I:]
        out += [
            ln1,
            wq.chunk(world, 0)[rank].contiguous(),
            wk.chunk(world, 0)[rank].contiguous(),
            wv.chunk(world, 0)[rank].contiguous(),
            wo.chunk(world, 1)[rank].contiguous(),
            ln2,
            torch.cat([gate.chunk(world, 0)[rank], up.chunk(world, 0)[rank]]).contiguous(),
            w_down.chunk(world, 1)[rank].contiguous(),
        ]
    return out, [c.chunk(world, 1)[rank].clone() for c in caches]


def _reduce(tp: TP, t: torch.Tensor) -> torch.Tensor:
    if tp.world == 1:
        return t
    if tp.collective == "functional":
        import torch.distributed._functional_collectives as funcol

        return funcol.wait_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD))
    dist.all_reduce(t)
    return t


def tp_decode_step(cfg: Config, tp: TP, x, pos, cos_table, sin_table, *caches_and_weights):
    """decode_step on this rank's shard (shard()): x [batch, hidden] replicated on every rank."""
    return decode_layers(cfg, cfg.heads // tp.world, cfg.kv_heads // tp.world, cfg.intermediate // tp.world,
                         functools.partial(_reduce, tp), x, pos, cos_table, sin_table, *caches_and_weights)
