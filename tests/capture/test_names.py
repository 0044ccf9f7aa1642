"""Note [The caller's names]: graph inputs, closed-over tensors, errors and explain() use the
names the caller wrote, through trident.capture and trident.compile."""

from __future__ import annotations

import functools

import pytest
import torch
import triton

import trident
from tests.kernels import axpy_kernel


def _axpy(x, y):
    out = torch.empty_like(x)
    axpy_kernel[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), 2.0, BLOCK=256)
    return out


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 0.5))
        self.table = [torch.randn(8)]  # a plain attribute holding a tensor

    def forward(self, hidden, *extra):
        return _axpy(self.proj(hidden).flatten() * self.scale.repeat(2) + self.table[0].repeat(2), extra[0])


def _placeholders(gm):
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def test_parameters_star_args_and_errors_use_the_callers_names():
    x, y = torch.randn(300), torch.randn(300)
    opt = trident.optimize(trident.capture(_axpy, x, y))
    assert _placeholders(opt) == ["x", "y"]
    with pytest.raises(trident.GuardError, match=r"input 'x' of region\d+: expected sizes \[300\]"):
        opt(torch.randn(301), y)
    star = trident.capture(lambda first, *rest: _axpy(first, rest[1]), x, 3, y)
    assert _placeholders(star) == ["first", "rest_0", "rest_1"]
    partial = trident.capture(functools.partial(_axpy, x), y)
    assert _placeholders(partial) == ["y"]


def test_closed_over_tensors_named_by_their_paths():
    block = _Block()
    hidden, other = torch.randn(2, 8), torch.randn(16)
    with torch.no_grad():
        gm = trident.capture(block.forward, hidden, other)  # bound method: the module is `self`
        assert _placeholders(gm) == ["hidden", "extra_0"]
        constants = {n.name for n in gm.graph.nodes if n.op == "get_attr"}
        assert {"self_proj_weight", "self_proj_bias", "self_scale", "self_table_0"} <= constants, constants

        def closure(h):  # closure variables and globals are searched too
            return block(h, other)

        constants = {n.name for n in trident.capture(closure, hidden).graph.nodes if n.op == "get_attr"}
        assert {"block_proj_weight", "block_scale", "other"} <= constants, constants
        opt = trident.optimize(trident.capture(closure, hidden))
        text = trident.explain(opt)
        assert "guard block_proj_weight: f32[8, 8]" in text and "guard h: f32[2, 8]" in text, text
        torch.testing.assert_close(opt(hidden), closure(hidden))


def test_trident_compile_names_arguments_keywords_and_pytree_paths():
    block = _Block()
    compiled = trident.compile(lambda inputs, *, bias: _axpy(inputs[0] + inputs[1], bias))
    a, b, c = torch.randn(300), torch.randn(300), torch.randn(300)
    for _ in range(2):  # the second call captures
        compiled((a, b), bias=c)
    (opt,) = compiled.captures.values()
    assert _placeholders(opt) == ["inputs_0", "inputs_1", "bias"]
    fwd = trident.compile(block.forward)
    with torch.no_grad():
        for _ in range(2):
            fwd(torch.randn(2, 8), torch.randn(16))
    (opt,) = fwd.captures.values()
    assert "guard self_proj_weight: f32[8, 8]" in trident.explain(opt)


def test_input_names_must_match_the_inputs():
    with pytest.raises(trident.CaptureError, match="input_names has 1 name.* for 2 example input"):
        trident.capture(_axpy, torch.randn(8), torch.randn(8), input_names=["only"])
    gm = trident.capture(_axpy, torch.randn(8), torch.randn(8), input_names=["left.side", "2nd"])
    assert _placeholders(gm) == ["left_side", "_2nd"]
