"""Python registrations of torch.ops.trident.*: the fake kernels used by FX tracing,
torch.compile and opcheck. The real kernels (CPU, CUDA) are native (csrc/module.cpp)."""

from __future__ import annotations

import torch

from . import native  # noqa: F401  (loads the library that defines the ops)
from .scm_module import SCMRuntime


@torch.library.register_fake("trident::scm")
def _scm_fake(region: int, mutated, inputs):
    return SCMRuntime.get(region).fake(mutated, inputs)


@torch.library.register_fake("trident::triton_launch")
def _triton_launch_fake(launch: int, reads, writes):
    return [w.clone() for w in writes]
