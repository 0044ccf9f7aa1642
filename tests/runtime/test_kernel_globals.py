"""The Python globals a kernel reads (Triton's used_global_vals): kernel[grid] refuses to launch
a kernel after one changed; the optimized module checks them on every call the same way."""

from __future__ import annotations

import pytest
import torch
import triton.language as tl

import trident
from tests import kernels as K


def test_changed_kernel_global_is_refused_like_triton(device, monkeypatch):
    x = torch.randn(300, device=device)
    opt = trident.optimize(trident.capture(K.scale_by_global, x))
    torch.testing.assert_close(opt(x), 3.0 * x)
    torch.testing.assert_close(K.scale_by_global(x), 3.0 * x)  # compiled eagerly as well
    monkeypatch.setattr(K, "GLOBAL_SCALE", tl.constexpr(5.0))
    with pytest.raises(RuntimeError, match="Global variable GLOBAL_SCALE has changed"):
        K.scale_by_global(x)  # Triton's own check
    with pytest.raises(trident.GuardError, match="reads the global 'GLOBAL_SCALE', which was constexpr.3.0. when"):
        opt(x)
    monkeypatch.undo()
    torch.testing.assert_close(opt(x), 3.0 * x)  # restored: served again


def test_kernels_without_globals_watch_nothing(device):
    from trident.optimize import _kernel_globals

    x, y = torch.randn(64, device=device), torch.randn(64, device=device)
    opt = trident.optimize(trident.capture(K.axpy, x, y))
    assert _kernel_globals(opt) == []
