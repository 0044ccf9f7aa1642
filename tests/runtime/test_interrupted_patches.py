"""Note [Interrupted patches] (trident/runtime/cpu_launcher.py): a KeyboardInterrupt while an
interpreted CPU launch patches triton.language, or while it restores it, leaves nothing patched;
later kernels (Trident's and eager Triton's) still compile and run."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter as interp

import trident
from tests import kernels as K


@triton.jit
def _double_kernel(x_ptr, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(x_ptr + o, tl.load(x_ptr + o, mask=o < n) * 2, mask=o < n)


def _language_state():
    return {(m.__name__, k): getattr(m, k) for m in (tl, tl.core, tl.math) for k in dir(m)} | {
        ("tensor", k): getattr(tl.tensor, k) for k in dir(tl.tensor) if not k.startswith("__")
    }


def _assert_all_works(opt, x, y):
    torch.testing.assert_close(opt(x, y), K.axpy_ref(x, y))
    z = torch.ones(16)
    _double_kernel[(1,)](z, 16, BLOCK=16)  # eager Triton, compiled after the interrupt
    torch.testing.assert_close(z, torch.full((16,), 2.0))


@pytest.mark.parametrize("where", ["patching", "restoring"])
@pytest.mark.parametrize("at", [1, 40, 150])
def test_an_interrupt_leaves_nothing_patched(where, at, monkeypatch):
    x, y = torch.randn(64), torch.randn(64)
    opt = trident.optimize(trident.capture(K.axpy, x, y))
    opt(x, y)
    before = _language_state()
    calls = [0]
    if where == "patching":
        real = interp._LangPatchScope.set_attr

        def set_attr(self, obj, name, value):
            calls[0] += 1
            if calls[0] == at:
                raise KeyboardInterrupt
            return real(self, obj, name, value)

        monkeypatch.setattr(interp._LangPatchScope, "set_attr", set_attr)
    else:
        real = interp._LangPatchScope.restore

        def restore(self):  # interrupted once, after undoing `at` changes
            calls[0] += 1
            if calls[0] == 1:
                for _ in range(min(at, len(self._changes))):
                    obj, name, original = self._changes.pop()
                    setattr(obj, name, original) if original is not interp._MISSING else delattr(obj, name)
                raise KeyboardInterrupt
            return real(self)

        monkeypatch.setattr(interp._LangPatchScope, "restore", restore)
    with pytest.raises((KeyboardInterrupt, RuntimeError)) as info:
        opt(x, y)
    if info.type is RuntimeError:  # through the native op: the interrupt is its cause
        assert "KeyboardInterrupt" in str(info.value)
    monkeypatch.undo()
    after = _language_state()
    assert [k for k, v in before.items() if after.get(k) is not v] == []
    _assert_all_works(opt, x, y)


from triton.language.extra import libdevice  # noqa: E402
from triton.language.extra.libdevice import tanh  # noqa: E402


@triton.jit
def _libdevice_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + o, mask=o < n, other=1.0)
    tl.store(out_ptr + o, libdevice.rsqrt(x) + tanh(x), mask=o < n)


@triton.jit
def _no_twin_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(out_ptr + o, libdevice.j0(tl.load(x_ptr + o, mask=o < n, other=1.0)), mask=o < n)


def _through_trident(kernel, x):
    def fn(x):
        out = torch.empty_like(x)
        kernel[(1,)](x, out, x.numel(), BLOCK=64)
        return out

    return trident.optimize(trident.capture(fn, x))(x)


def test_libdevice_twins_compute_on_the_cpu_and_are_put_back():
    """Note [libdevice under the interpreter]: libdevice called through its module and through a
    name the kernel's module imported computes on the CPU, launch after launch (the names to patch
    are remembered per module); a function without a twin says so; afterwards libdevice's
    attributes and the kernel module's names are the originals again."""
    before = dict(vars(libdevice))
    for _ in range(3):
        x = torch.rand(50) + 0.5
        torch.testing.assert_close(_through_trident(_libdevice_kernel, x), x.rsqrt() + x.tanh())
    with pytest.raises(Exception, match="libdevice.j0 has no twin"):
        _through_trident(_no_twin_kernel, torch.rand(50) + 0.5)
    assert dict(vars(libdevice)) == before and tanh.__module__ == "triton.language.extra.libdevice"
    assert globals()["tanh"] is before["tanh"]
