"""Python registrations of torch.ops.trident.*: the fake kernels used by FX tracing,
torch.compile and opcheck. The real kernels (CPU, CUDA) are native (csrc/module.cpp)."""

from __future__ import annotations

import torch
from torch._subclasses.functional_tensor import FunctionalTensorMode

from ..errors import GuardError
from . import native  # noqa: F401  (loads the library that defines the ops)
from .scm_module import SCMRuntime


@torch.library.register_fake("trident::scm")
def _scm_fake(region: int, mutated, inputs):
    _refuse_meta(region, [*mutated, *inputs])
    return SCMRuntime.get(region).fake(mutated, inputs)


def _refuse_meta(region: int, tensors) -> None:
    """The fake kernel also serves the Meta dispatch key: a caller's own meta tensor (no data,
    no fake mode around it) gets here instead of the native kernel. Eager operators refuse meta
    inputs of a real computation; so does a region (Note [Inputs with too little storage])."""
    for t in tensors:
        if type(t) is torch.Tensor and t.is_meta:
            rt = SCMRuntime.get(region)
            names = [i.name for i in rt.program.inputs]
            k = next(i for i, u in enumerate(tensors) if u is t)
            raise GuardError(
                f"input {names[k]!r} of region {rt.program.name!r} is a meta tensor, which holds no data (eager "
                "operators refuse it too); nothing ran. Pass a tensor on the device the graph was captured for.",
                region=rt.program.name,
            )


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
