"""Python registrations of torch.ops.trident.*: the fake kernels used by FX tracing,
torch.compile and opcheck. The real kernels (CPU, CUDA) are native (csrc/module.cpp)."""

from __future__ import annotations

import torch
from torch._subclasses.functional_tensor import FunctionalTensorMode

from . import native  # noqa: F401  (loads the library that defines the ops)
from .scm_module import SCMRuntime


@torch.library.register_fake("trident::scm")
def _scm_fake(region: int, mutated, inputs):
    return SCMRuntime.get(region).fake(mutated, inputs)


def _clone_strided(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).copy_(t)


@torch.library.register_fake("trident::scm_functional")
def _scm_functional_fake(region: int, mutated, inputs):
    clones = [_clone_strided(t) for t in mutated]
    return SCMRuntime.get(region).fake(clones, inputs) + clones


def _scm_functionalize(mode, op, types, args, kwargs):
    """Under functionalization (AOT autograd, torch.compile, opcheck) trident.scm becomes
    its functional form plus copies into the written inputs, which functionalization turns
    into input mutations of the functional graph."""
    region, mutated, inputs = args
    with mode:
        results = torch.ops.trident.scm_functional.default(region, mutated, inputs)
        n_out = len(results) - len(mutated)
        for t, new in zip(mutated, results[n_out:]):
            t.copy_(new)
        return results[:n_out]


torch.library.register_torch_dispatch("trident::scm", FunctionalTensorMode, _scm_functionalize)


@torch.library.register_fake("trident::triton_launch")
def _triton_launch_fake(launch: int, reads, writes):
    return [w.clone() for w in writes]
