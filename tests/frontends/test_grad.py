"""Note [Calls that need grad]: a capture has no derivative, so with grad enabled a call whose
tensors (arguments, parameters, closed-over tensors) require grad runs eagerly (its backward is
eager's); the same signature under no_grad is served. requires_grad is read per call (a
parameter unfrozen after a capture). Before, such calls were served by a capture and backward
silently gave no gradient."""

from __future__ import annotations

import torch

import trident
from tests import kernels as K


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        return K.axpy(x, x).sum() + self.lin(x).relu().sum()  # a Triton launch and a differentiable part


def _grads(run, model, x):
    model.zero_grad()
    run(x).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_a_training_step_runs_eagerly_and_its_gradients_are_eagers():
    torch.manual_seed(0)
    model = _Scaled()
    compiled = trident.compile(model)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        x = torch.randn(4, 32, generator=g)
        got, want = _grads(compiled, model, x), _grads(model, model, x)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert compiled.eager_calls == 4  # captured from its first call, never served with grad
    assert "requires grad: Trident is inference only" in trident.explain(compiled)
    with torch.no_grad():  # the same signature for inference: served
        for _ in range(3):
            x = torch.randn(4, 32, generator=g)
            torch.testing.assert_close(compiled(x), model(x))
    assert len(compiled.captures) == 1 and compiled.eager_calls == 4


def test_a_closed_over_parameter_is_never_served_with_grad_enabled():
    """A function reading a module it closes over: with grad enabled its calls run eagerly,
    under no_grad the capture serves them, and with grad enabled again it still does not."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 32)

    def fn(x):
        return lin(K.axpy(x, x)).relu().sum()

    compiled = trident.compile(fn)
    g = torch.Generator().manual_seed(1)

    def grads(run, x):
        lin.zero_grad()
        run(x).backward()
        return lin.weight.grad.clone()

    for _ in range(3):
        x = torch.randn(4, 32, generator=g)
        assert torch.equal(grads(compiled, x), grads(fn, x))
    assert compiled.eager_calls == 3
    assert "lin_weight (a tensor it closes over) requires grad" in trident.explain(compiled)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 32, generator=g)
            torch.testing.assert_close(compiled(x), fn(x))
    assert len(compiled.captures) == 1 and compiled.eager_calls == 3
    eager = compiled.eager_calls
    for _ in range(2):  # grad enabled again, the capture exists: not served
        x = torch.randn(4, 32, generator=g)
        assert torch.equal(grads(compiled, x), grads(fn, x))
    assert compiled.eager_calls == eager + 2


def test_requires_grad_is_read_per_call():
    """A frozen parameter (requires_grad False) is served with grad enabled; unfrozen after the
    capture, the next call runs eagerly and its gradient is eager's; frozen again, served again."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 32).requires_grad_(False)

    def fn(x):
        return lin(K.axpy(x, x)).relu().sum()

    compiled = trident.compile(fn)
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        x = torch.randn(4, 32, generator=g)
        torch.testing.assert_close(compiled(x), fn(x))
    assert len(compiled.captures) == 1 and compiled.eager_calls == 1
    lin.requires_grad_(True)  # unfrozen to fine-tune
    lin.zero_grad()
    x = torch.randn(4, 32, generator=g)
    compiled(x).backward()
    got = lin.weight.grad.clone()
    lin.zero_grad()
    fn(x).backward()
    assert torch.equal(got, lin.weight.grad) and compiled.eager_calls == 2
    lin.requires_grad_(False)
    torch.testing.assert_close(compiled(x), fn(x))
    assert compiled.eager_calls == 2
