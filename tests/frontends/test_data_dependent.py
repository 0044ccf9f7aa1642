"""Data-dependent values through every door (issue 24): `.item()`, `.tolist()`, a branch on a
tensor's value, a `nonzero`-sized output. Each call returns eager's result; a value a region
cannot hold cuts the region (with the reason in explain()), a branch on data runs eagerly in
trident.compile (reason logged) and breaks the graph in the backend; trident.capture refuses a
branch with a TridentError that names the user's line and says what to do, never torch's
internal exception. A function whose trace needs a data-dependent value goes through
torch.compile(backend="trident") from trident.compile (Note [Data-dependent calls through
Dynamo]), and the trace that failed leaves no fake tensor in the library's memos (Note [A failed
trace leaves no fake tensors behind])."""

from __future__ import annotations

import collections

import pytest
import torch
import triton
from torch._subclasses import FakeTensor

import trident
from tests import kernels as K
from tests.kernels import axpy


def scaled_by_max(x, y):  # .item(): a float only the data gives
    z = axpy(x, y)
    return z * z.max().item()


def shifted_by_first(x, y):  # .tolist()
    z = axpy(x, y)
    return z + z[:2].tolist()[0]


def branch_on_sum(x, y):  # bool(t): control flow on data
    z = axpy(x, y)
    if bool(z.sum() > 0):
        return z * 2
    return z - 1


def positives_squared(x, y):  # nonzero: an output whose size only the data gives
    z = axpy(x, y)
    idx = torch.nonzero(z > 0).flatten()
    return axpy(z[idx], z[idx])


CASES = [scaled_by_max, shifted_by_first, branch_on_sum, positives_squared]


def _door(door, fn, x, y):
    if door == "optimize":
        return trident.optimize(trident.capture(fn, x, y))
    if door == "compile":
        return trident.compile(fn)
    torch._dynamo.reset()
    return torch.compile(fn, backend="trident")


@pytest.mark.parametrize("door", ["optimize", "compile", "backend"])
@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_data_dependent_values_give_eager_results(fn, door):
    torch.manual_seed(0)
    x, y = torch.randn(100), torch.randn(100)
    if door == "optimize" and fn is branch_on_sum:
        with pytest.raises(trident.CaptureError) as info:
            _door(door, fn, x, y)
        text = str(info.value)
        assert "test_data_dependent.py" in text and "bool(z.sum() > 0)" in text, text
        assert "trident.compile(fn) serves such calls through torch.compile(fn, backend='trident')" in text, text
        assert "Traceback" not in text and len(text.splitlines()) == 2, text
        return
    g = _door(door, fn, x, y)
    for seed in range(4):
        torch.manual_seed(seed)
        x, y = torch.randn(100), torch.randn(100)
        torch.testing.assert_close(g(x, y), fn(x, y))
    if door == "compile":
        text = trident.explain(g)
        if fn is branch_on_sum:
            assert "0 capture(s)" in text and "raised at" in text and "test_data_dependent.py" in text, text
            assert "went through torch.compile(backend='trident')" in text, text
        else:
            assert "1 capture(s)" in text, text
    if door == "optimize" and fn in (scaled_by_max, shifted_by_first):
        assert "traced non-tensor value (SymFloat)" in trident.explain(g) or "SymInt" in trident.explain(g)


_MEMO: collections.deque = collections.deque(maxlen=4)  # flash-linear-attention's tensor_cache
_TABLE: dict = {}  # a module-level dict memo: never swept (its entries may hold fake tensors)


def _lengths(mask):
    """The row lengths of a mask, memoized by argument identity, as fla's `tensor_cache` does."""
    for args, result in _MEMO:
        if args[0] is mask:
            return result
    result = mask.sum(-1)
    _MEMO.append(((mask,), result))
    return result


def _kept(mask, on_device: bool):
    """The positions a mask keeps. `on_device`: counted from a kernel's output, a value only the
    device knows before the call runs (no guard can compute it from the inputs: Dynamo's route);
    otherwise from the mask itself (a capture specializes the count behind a guard)."""
    m = mask.flatten()
    if on_device:
        m = m.to(torch.float32)
        seen = torch.empty_like(m)
        K.axpy_kernel[(1,)](m, m, seen, m.numel(), 0.5, BLOCK=64)
        m = seen
    return torch.nonzero(m).flatten()


class Unpadded(torch.nn.Module):
    """A recurrent layer as flash-linear-attention writes one: the tokens the attention mask
    keeps are gathered (nonzero: a data-dependent count T), a kernel runs over them with a block
    size computed from T (a Triton constexpr: no one graph holds it), the state is replaced."""

    def __init__(self, on_device: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(16, 16)
        self.on_device = on_device  # the mask goes through a kernel first (_kept)

    def forward(self, x, attention_mask, state):
        q_len = x.shape[1]
        keep = _kept(attention_mask[:, -q_len:], self.on_device)
        lengths = _lengths(attention_mask)
        _TABLE.setdefault(q_len, [q_len])  # a memo entry made once per length (a log appended to on
        # every call would be state the function changes: Note [Module attributes a trace rebinds])
        if not hasattr(self, "tables"):
            self.tables = {}  # an attribute made lazily, a dict of tensors
        self.tables.setdefault(q_len, torch.ones(1))
        h = self.proj(x).reshape(-1, 16).index_select(0, keep).contiguous()
        out = torch.empty_like(h)
        n = h.numel()
        block = max(16, triton.next_power_of_2(n))  # a constexpr from the data
        K.axpy_kernel[(triton.cdiv(n, block),)](h, h, out, n, 0.5, BLOCK=block)
        state["h"] = state["h"] * 0.5 + out.sum(0)
        return out * lengths.sum(), state


def _steps(layer, door):
    """generate()-like: a prompt, then one token per step with a mask one longer each time."""
    state = {"h": torch.zeros(16)}
    outs = []
    for step in range(6):
        q_len = 4 if step == 0 else 1
        x = torch.randn(1, q_len, 16, generator=torch.Generator().manual_seed(step))
        mask = torch.ones(1, 4 + step, dtype=torch.long)
        out, state = door(x, mask, state)
        outs.append(out)
    return outs, state


def test_trident_compile_specializes_a_count_the_inputs_give():
    """Note [Values a trace specializes]: the nonzero count of the mask is a value the inputs
    give, so the captures specialize it behind a guard (the prompt's count 4, the steps' 1) and no
    call goes through Dynamo; outputs and state are eager's, the memo keeps no fake tensor. Under
    no_grad, as generate() runs (trident.scm has no derivative: docs/limits.md, inference only)."""
    torch._dynamo.reset()
    layer = Unpadded()
    want, want_state = _steps(layer, layer)
    _MEMO.clear()
    compiled = trident.compile(layer)
    with torch.no_grad():
        got, state = _steps(layer, compiled)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(state["h"], want_state["h"])
    fn = compiled._compiled
    text = trident.explain(compiled)
    assert fn.dynamo_calls == 0 and fn.eager_calls <= 2 and len(fn.captures) == 2, text
    assert "nonzero count at" in text and "test_data_dependent.py" in text and "== 1 (specialized" in text, text
    assert not [e for e in _MEMO if any(isinstance(t, FakeTensor) for t in (*e[0], e[1]))]
    # a second generate(): the prompt's capture (count 4) and the steps' (count 1) serve it, each
    # refused by the other's guard once, none made again
    with torch.no_grad():
        got, state = _steps(layer, compiled)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert len(fn.captures) == 2 and fn.dynamo_calls == 0, trident.explain(compiled)


def test_trident_compile_serves_a_data_dependent_function_through_dynamo():
    """The count comes from a kernel's output: no guard can compute it before the call runs."""
    torch._dynamo.reset()
    layer = Unpadded(on_device=True)
    want, want_state = _steps(layer, layer)
    _MEMO.clear()
    compiled = trident.compile(layer)
    got, state = _steps(layer, compiled)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(state["h"], want_state["h"])
    fn = compiled._compiled
    # the first prompt runs eagerly (Note [Captured after its first call]); its capture, tried
    # at the next call, fails on the block size: from then on the family goes through Dynamo
    assert fn.dynamo_calls >= 4 and fn.eager_calls <= 2 and not fn.captures, trident.explain(compiled)
    text = trident.explain(compiled)
    assert "went through torch.compile(backend='trident')" in text and "the trace decides on a tensor's values" in text
    assert "through torch.compile: graph" in text, text  # the backend captured the graphs between the breaks
    assert not [e for e in _MEMO if any(isinstance(t, FakeTensor) for t in (*e[0], e[1]))]
    torch._dynamo.reset()


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_failed_capture_leaves_no_fake_tensor_in_memos(dynamic):
    """The static trace fails at nonzero; the symbolic one traces, and planning fails on the
    block size (a data-dependent UnsupportedError, never torch's exception). Either way the
    memo loses the trace's entries and keeps the caller's. Without the cleanup Dynamo, compiling
    the function next, inlined the memo and failed on its fake tensor ("unhashable type:
    non-nested SymInt")."""
    layer = Unpadded(on_device=True)
    mask = torch.ones(1, 5, dtype=torch.long)
    _MEMO.clear()
    _MEMO.append(((mask,), mask.sum(-1)))  # an entry of the caller's: kept
    compiled = trident.compile(layer, dynamic=dynamic)._compiled
    call = (torch.randn(1, 1, 16), torch.ones(1, 5, dtype=torch.long), {"h": torch.zeros(16)})
    from trident.frontends.compile import _Call

    with pytest.raises((trident.CaptureError, trident.UnsupportedError)) as info:
        compiled._capture(_Call(call, {}, dynamic), "key", dynamic=dynamic, dynamic_ints=())
    assert info.value.data_dependent, info.value
    assert "GuardOnDataDependentSymNode" in str(info.value) or "DynamicOutputShape" in str(info.value)
    assert len(_MEMO) == 1 and _MEMO[0][0][0] is mask
    # namespaces are never swept: the module's globals stay (the first sweep deleted `_TABLE`
    # from the globals, and the next eager call failed with NameError); the module comes out of
    # the trace as it went in (Note [Module attributes a trace rebinds]): the lazily made
    # `tables` was the traced call's, made again by the next real one
    assert "_TABLE" in globals() and not hasattr(layer, "tables")
    want, _ = layer(*call)
    torch.testing.assert_close(want, Unpadded(on_device=True)(*call)[0])


class Packed:
    """A library's own cache object."""

    def __init__(self, h):
        self.state = {"h": h}


def repack(x, cache):
    """Returns a new object holding tensors, made from the one passed in (flash-linear-attention's
    models turn generate()'s DynamicCache into a Cache of their own at the prefill)."""
    h = cache.state["h"] if isinstance(cache, Packed) else torch.zeros(x.shape[-1])
    out = torch.empty_like(x)
    n = x.numel()
    K.axpy_kernel[(triton.cdiv(n, 64),)](x, x, out, n, 0.5, BLOCK=64)
    return out + h, Packed(h + out.sum(0))


def test_a_new_object_holding_tensors_goes_through_dynamo():
    """A capture returned the trace's object, its tensors fake, on every call (generate() then
    failed in its stopping check with a GuardOnDataDependentSymNode); the family now goes through
    torch.compile(backend="trident"), which makes the object per call."""
    torch._dynamo.reset()
    compiled = trident.compile(repack)
    for step in range(4):
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(step))
        out, packed = compiled(x, None)
        want, want_packed = repack(x, None)
        torch.testing.assert_close(out, want)
        assert type(packed.state["h"]) is torch.Tensor and packed is not want_packed
        torch.testing.assert_close(packed.state["h"], want_packed.state["h"])
    assert compiled.dynamo_calls >= 2 and not compiled.captures
    assert "returns a Packed it made during the call" in trident.explain(compiled)
    torch._dynamo.reset()


def prefill_or_step(x, cache):
    """A library's generate() pattern: the prefill (no cache yet) returns a Cache it makes, the
    steps update the one they are passed and return it."""
    out = torch.empty_like(x)
    n = x.numel()
    K.axpy_kernel[(triton.cdiv(n, 64),)](x, x, out, n, 0.5, BLOCK=64)
    if cache is None:
        return out, Packed(out.sum(0))
    cache.state["h"] = cache.state["h"] * 0.5 + out.sum(0)
    return out, cache


def test_an_object_made_per_call_runs_eagerly_once_the_function_has_captures():
    """Note [Objects made per call]: the steps are one capture; the prefill family, refused for
    the object it makes, runs eagerly from then on (through Dynamo its frames would recompile as
    library memos change under the captured calls), with that reason; results are eager's."""
    torch._dynamo.reset()
    compiled = trident.compile(prefill_or_step)
    for call in range(3):  # three generate()s
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(call))
        out, cache = compiled(x, None)
        want, want_cache = prefill_or_step(x, None)
        torch.testing.assert_close(out, want)
        for step in range(4):
            x = torch.randn(1, 8, generator=torch.Generator().manual_seed(10 * call + step))
            out, got = compiled(x, cache)
            want, want_cache = prefill_or_step(x, want_cache)
            assert got is cache
            torch.testing.assert_close(out, want)
            torch.testing.assert_close(cache.state["h"], want_cache.state["h"])
    text = trident.explain(compiled)
    assert len(compiled.captures) == 1 and compiled.dynamo_calls == 0, text
    assert "Objects made per call" in text, text
    torch._dynamo.reset()


class _UnpaddingLayer(torch.nn.Module):
    """A layer as flash-linear-attention writes one (Unpadded above), its state indexed by an
    int attribute: a graph break at nonzero under Dynamo, and the layer's resumed frame guards
    on `self.layer_idx`."""

    def __init__(self, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, mask, state: list):
        keep = _kept(mask[:, -x.shape[1]:], on_device=True)
        h = self.proj(x).reshape(-1, 8).index_select(0, keep).contiguous()
        out = torch.empty_like(h)
        n = h.numel()
        block = max(16, triton.next_power_of_2(n))  # a constexpr from the data
        K.axpy_kernel[(triton.cdiv(n, block),)](h, h, out, n, 0.5, BLOCK=block)
        state[self.layer_idx] = state[self.layer_idx] * 0.5 + out.sum()
        return x + 0.1 * out.reshape(x.shape)


class _UnpaddingModel(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(_UnpaddingLayer(i) for i in range(n))

    def forward(self, x, mask, state: list):
        for layer in self.layers:
            x = layer(x, mask, state)
        return x


@pytest.mark.parametrize("window", [False, True], ids=["compile_kwarg", "limit_window"])
def test_every_layer_of_a_dynamo_routed_model_is_compiled(window, monkeypatch, caplog):
    """Note [Recompiles per layer]: 12 layers told apart by `layer_idx` each get their entry of
    the layer's resumed frame; none runs eagerly past Dynamo's recompile limit (8), and the
    user's limit is the same after the calls. `window`: torch without torch.compile's
    recompile_limit (the process's limit raised while a call runs)."""
    from trident.frontends import compile as compile_mod

    if window:
        monkeypatch.setattr(compile_mod, "_COMPILE_TAKES_RECOMPILE_LIMIT", False)
    elif not compile_mod._COMPILE_TAKES_RECOMPILE_LIMIT:
        pytest.skip("this torch's torch.compile has no recompile_limit")
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _UnpaddingModel(12).eval()
    g = trident.compile(model.forward)
    limit = torch._dynamo.config.recompile_limit
    assert compile_mod.recompile_limit_for(model.forward) == limit * 12  # 12 layers (Linears, leaf modules, not counted)
    with torch.no_grad(), caplog.at_level("WARNING", logger="torch._dynamo"):
        for _ in range(4):
            x, mask = torch.randn(1, 5, 8), torch.ones(1, 5, dtype=torch.long)
            want_state, got_state = [torch.zeros(()) for _ in range(12)], [torch.zeros(()) for _ in range(12)]
            want = model(x, mask, want_state)
            torch.testing.assert_close(g(x, mask, got_state), want)
            torch.testing.assert_close(torch.stack(got_state), torch.stack(want_state))
    assert g.dynamo_calls >= 2, trident.explain(g)
    assert "recompile_limit" not in caplog.text, caplog.text
    assert torch._dynamo.config.recompile_limit == limit
    torch._dynamo.reset()
