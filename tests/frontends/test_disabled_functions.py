"""torch.compiler.disable()d functions of libraries under torch.compile(backend="trident") (Note
[Disabled functions under backend="trident"]): a call stays in the graph for Trident to trace when
its compile-time run changes no Python state it can reach; it stays a graph break, the state put
back, when it does; TRIDENT_DYNAMO_TRACE_DISABLED overrides the check both ways."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch._dynamo.utils import counters
from torch._subclasses import FakeTensor

import trident
from tests.frontends import fake_lib
from trident import knobs
from trident.frontends.dynamo import compiled_graphs

LIB = "tests.frontends.fake_lib"


@pytest.fixture(autouse=True)
def fresh():
    """The default knob, a fresh Dynamo and a fresh library: reloading it makes new function
    objects (no verdict from an earlier test) and empty state."""
    importlib.reload(fake_lib)
    torch._dynamo.reset()
    counters.clear()
    with knobs.scope(dynamo_trace_disabled=None):
        yield
    torch._dynamo.reset()
    counters.clear()


class AxpyModel(torch.nn.Module):
    """A model whose kernel sits behind a library's disabled dispatcher."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x, y):
        h = torch.relu(self.proj(x))
        return fake_lib.axpy_dispatch(h, y, 2.0) * 3 - 1


def _axpy_model_reference(model, x, y):
    return fake_lib.axpy_reference(torch.relu(model.proj(x)), y, 2.0) * 3 - 1


def _inputs(n=3):
    torch.manual_seed(1)
    return [(torch.randn(8, 64), torch.randn(8, 64)) for _ in range(n)]


def _breaks() -> dict:
    return dict(counters["graph_break"])


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _scm_nodes(opt) -> int:
    return sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes)


def test_pure_dispatcher_stays_in_one_graph():
    """(1) The default: a dispatcher launching a Triton kernel between ATen ops, its memo of
    plain data cold, is one Dynamo graph with the model around it; Trident captures the launch;
    the memo is filled as eager's first call fills it (kept, not undone)."""
    model = AxpyModel().eval()
    with torch.no_grad():
        torch.compile(model, backend="eager")(*_inputs(1)[0])
        assert _graphs() == 2 and _breaks()  # plain Dynamo breaks the graph at the disabled call
        torch._dynamo.reset()
        counters.clear()
        fake_lib.BLOCKS.clear()

        start = len(compiled_graphs())
        compiled = torch.compile(model, backend="trident")
        for x, y in _inputs():
            torch.testing.assert_close(compiled(x, y), _axpy_model_reference(model, x, y))
    assert not _breaks(), _breaks()
    assert _graphs() == 1
    (graph,) = compiled_graphs()[start:]
    assert graph.eager_calls == 0
    (opt,) = graph.captures.values()
    assert _scm_nodes(opt) >= 1 and "launch axpy_kernel" in trident.explain(compiled)
    assert fake_lib.BLOCKS == {(torch.float32, 512): 64}


def test_memo_of_tensors_stays_a_graph_break():
    """(2) A dispatcher that keeps a scratch tensor per shape: its compile-time run would leave a
    fake tensor in the memo. It stays a graph break, the memo is put back, and afterwards holds
    the real tensor eager's calls stored."""

    def fn(x, y):
        return fake_lib.workspace_dispatch(torch.sin(x), y) * 3

    compiled = torch.compile(fn, backend="trident")
    for x, y in _inputs():
        torch.testing.assert_close(compiled(x, y), (2.0 * torch.sin(x) + y) * 3)
    (reason,) = _breaks()
    assert reason.startswith(
        f"{LIB}.workspace_dispatch writes {LIB}.WORKSPACES[(512, torch.float32, device(type='cpu'))] "
        "(a new memo entry: a fake tensor): it stays a graph break"
    ), reason
    assert f"TRIDENT_DYNAMO_TRACE_DISABLED=+{LIB}" in reason
    assert _graphs() == 2
    (buf,) = fake_lib.WORKSPACES.values()
    assert isinstance(buf, torch.Tensor) and not isinstance(buf, FakeTensor)


def test_module_counter_stays_a_graph_break():
    """(2) A dispatcher that counts its calls in a module global: a graph break, and the count is
    eager's (the compile-time bump put back; later frames do not run it at compile time)."""

    def fn(x):
        return fake_lib.counted_dispatch(torch.sin(x)) + 1

    def other(x):
        return fake_lib.counted_dispatch(x * 2) - 1

    compiled, compiled_other = torch.compile(fn, backend="trident"), torch.compile(other, backend="trident")
    calls = 0
    for x, _ in _inputs(4):
        torch.testing.assert_close(compiled(x), torch.sin(x) * 2 + 2)
        torch.testing.assert_close(compiled_other(x), x * 4)
        calls += 2
    assert fake_lib.CALLS == calls
    # the first frame gets the verdict; the second, compiled after it, Dynamo's own break
    ours, dynamos = sorted(_breaks(), key=lambda reason: not reason.startswith(LIB))
    assert ours.startswith(f"{LIB}.counted_dispatch writes {LIB}.CALLS (a counter: 0 -> 1): it stays a graph break"), (
        ours
    )
    assert "`torch.compiler.disable()`d function" in dynamos and "writes" not in dynamos, dynamos


def test_closure_and_self_state_stay_graph_breaks():
    """(2) State reached through a closure cell and through `self` of a disabled bound method."""
    counted, read_calls = fake_lib.make_counter()
    scaler = fake_lib.Scaler()
    scale = torch.compiler.disable(scaler.scale)

    def fn(x):
        return scale(counted(x)) - 1

    compiled = torch.compile(fn, backend="trident")
    inputs = _inputs()
    for x, _ in inputs:
        torch.testing.assert_close(compiled(x), (x + 1) * 3 - 1)
    assert read_calls() == len(inputs)
    assert scaler.seen == [(8, 64)] * len(inputs)
    reasons = "\n".join(_breaks())
    assert "writes closure variable calls of make_counter.<locals>.counted (a counter: 0 -> 1)" in reasons, reasons
    assert f"{LIB}.Scaler.scale writes self.seen (a list: 0 -> 1 items)" in reasons, reasons


def test_result_of_tensors_and_none_stays_in_one_graph():
    """A disabled function returning `(y, None, rstd)` stays in the graph (it was a graph break
    at every flash-linear-attention norm)."""

    def fn(x):
        y, mean, rstd = fake_lib.norm_dispatch(torch.sin(x))
        assert mean is None
        return y * rstd

    def reference(x):
        h = torch.sin(x)
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return 2 * h * rstd * rstd

    start = len(compiled_graphs())
    compiled = torch.compile(fn, backend="trident")
    for x, _ in _inputs(2):
        torch.testing.assert_close(compiled(x), reference(x))
    assert not _breaks(), _breaks()
    assert _graphs() == 1
    (graph,) = compiled_graphs()[start:]
    assert graph.eager_calls == 0 and "launch axpy_kernel" in trident.explain(compiled)


def test_result_that_is_not_tensors_stays_a_graph_break():
    def fn(x):
        h = torch.sin(x)
        return h + fake_lib.shape_of(h)

    compiled = torch.compile(fn, backend="trident")
    for x, _ in _inputs(2):
        torch.testing.assert_close(compiled(x), torch.sin(x) + 16)
    assert _breaks() and _graphs() == 2


@pytest.mark.parametrize("value", [f"-{LIB}", "-tests", "-*", f"+tests,-{LIB}", "0", "", "off", "none"])
def test_knob_breaks_the_graph_at_a_pure_dispatcher(value):
    """(3) '-prefix' (the longest prefix decides) and the off spellings: plain Dynamo's graph
    break at the pure dispatcher of test (1)."""
    model = AxpyModel().eval()
    with knobs.scope(dynamo_trace_disabled=value), torch.no_grad():
        compiled = torch.compile(model, backend="trident")
        for x, y in _inputs(2):
            torch.testing.assert_close(compiled(x, y), _axpy_model_reference(model, x, y))
    assert _graphs() == 2
    (reason,) = _breaks()
    assert "torch.compiler.disable" in reason and "writes" not in reason, reason


@pytest.mark.parametrize("value", [f"+{LIB}", LIB, "*", f"-tests,+{LIB}", f"auto,+{LIB}"])
def test_knob_keeps_a_stateful_dispatcher_at_the_users_word(value):
    """(3) '+prefix' (a bare prefix and '*' too, as before) keeps the counting dispatcher in the
    graph unchecked: one graph, and its counter counts compile-time runs, not calls -- the state
    a compile-time run corrupts is the user's responsibility there."""

    def fn(x):
        return fake_lib.counted_dispatch(torch.sin(x)) + 1

    inputs = _inputs(5)
    with knobs.scope(dynamo_trace_disabled=value):
        compiled = torch.compile(fn, backend="trident")
        for x, _ in inputs:
            torch.testing.assert_close(compiled(x), torch.sin(x) * 2 + 2)
    assert not _breaks(), _breaks()
    assert _graphs() == 1
    assert 0 < fake_lib.CALLS < len(inputs)


def test_liger_dispatcher_with_a_cold_memo_stays_in_the_graph():
    """(4) Liger-Kernel's dispatcher under the default: its auto-select memo (implementation
    names, plain data) filled by the compile-time run is kept, and the call stays in the graph.
    tests/test_hf.py::test_greedy_decode_equals_eager[*-liger] covers whole models."""
    rope = pytest.importorskip("liger_kernel.transformers.rope")
    dispatch = importlib.import_module("liger_kernel.backends.dispatch")
    dispatch.clear_available_cache()

    def rotate_half(t):
        return torch.cat((-t[..., t.shape[-1] // 2 :], t[..., : t.shape[-1] // 2]), dim=-1)

    def fn(q, k, cos, sin):
        q, k = rope.liger_rotary_pos_emb(torch.relu(q), k, cos, sin)
        return q * 2, k + 1

    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    angles = torch.randn(1, 8, 8).repeat(1, 1, 2)
    cos, sin = angles.cos(), angles.sin()
    want_q = (torch.relu(q) * cos[:, None] + rotate_half(torch.relu(q)) * sin[:, None]) * 2
    want_k = k * cos[:, None] + rotate_half(k) * sin[:, None] + 1
    with torch.no_grad():
        got_q, got_k = torch.compile(fn, backend="trident")(q, k, cos, sin)
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)
    assert not _breaks(), _breaks()
    assert _graphs() == 1
    assert any(key[0] == "rope" for key in dispatch._AVAILABLE_MEMO)
