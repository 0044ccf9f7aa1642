"""Note [Cluster launches]: a kernel compiled with num_ctas > 1 is launched as Triton's driver
launches it (cuLaunchKernelEx, clusters of num_ctas CTAs along x); the plan records it."""

from __future__ import annotations

import pytest
import torch
import triton

import trident
from tests import kernels as K
from trident.optimize import _regions


# num_ctas reaches a launch through a Config (wrap_triton refuses it as a launch argument)
_CLUSTERED = {
    n: triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_ctas=n)], key=[])(K.axpy_kernel) for n in (1, 2, 4)
}


def _axpy(x, y, num_ctas):
    out = torch.empty_like(x)
    n = x.numel()
    _CLUSTERED[num_ctas][(triton.cdiv(n, 256),)](x, y, out, n, 2.0)
    return out


@pytest.mark.parametrize("num_ctas", [1, 2, 4])
def test_cluster_kernel_is_planned_and_served(device, num_ctas):
    x, y = torch.randn(5000, device=device), torch.randn(5000, device=device)
    opt = trident.optimize(trident.capture(lambda a, b: _axpy(a, b, num_ctas), x, y))
    for _ in range(3):  # the first call and hits (graph replay included on CUDA)
        x, y = torch.randn(5000, device=device), torch.randn(5000, device=device)
        torch.testing.assert_close(opt(x, y), 2.0 * x + y)
    (rt,) = _regions(opt)
    (launch,) = rt.scm.specializations[0].launches
    assert launch.num_ctas == num_ctas
    if launch.compiled is not None:  # the cubin was compiled for clusters of that size
        assert launch.compiled.metadata.num_ctas == num_ctas
    assert (f"num_ctas={num_ctas} (clusters" in trident.explain(opt)) == (num_ctas > 1)
