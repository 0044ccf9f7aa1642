"""trident.compile: capture on the first call per input signature (Note [What trident.compile
guards]); keyword and nested arguments, module state, new shapes, parameter reassignment."""

from __future__ import annotations

import torch
import triton

import trident
from tests import kernels as K


def _axpy(x, y, alpha):
    out = torch.empty_like(x)
    K.axpy_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), alpha, BLOCK=64)
    return out


def test_keyword_and_nested_arguments_and_new_shapes():
    def f(x, pair, *, opts):
        a, b = pair
        return _axpy(x, a, opts["alpha"]) + b

    compiled = trident.compile(f, dynamic=False)
    for n in (100, 300):  # a new shape: a new capture, never an error
        x, a, b = torch.randn(n), torch.randn(n), torch.randn(n)
        for alpha in (2.0, 2.0, 2.0, -1.0):
            torch.testing.assert_close(compiled(x, (a, b), opts={"alpha": alpha}), alpha * x + a + b)
    # a signature's first call runs eagerly, its second captures: (n, 2.0) captured, (n, -1.0) eager once
    assert len(compiled.captures) == 2 and compiled.eager_calls == 4
    for opt in compiled.captures.values():
        (stats,) = trident.cache_info(opt).values()
        assert stats["misses"] == 0


def test_new_sizes_get_one_symbolic_capture():
    def f(x, pair, *, opts):
        a, b = pair
        return _axpy(x, a, opts["alpha"]) + b

    compiled = trident.compile(f)  # dynamic=None: symbolic once sizes change (Note [Symbolic sizes])
    for n in (100, 300, 301, 4000, 77):
        x, a, b = torch.randn(n), torch.randn(n), torch.randn(n)
        for alpha in (2.0, 2.0, 2.0, -1.0):
            torch.testing.assert_close(compiled(x, (a, b), opts={"alpha": alpha}), alpha * x + a + b)
    # per alpha (a value of the signature): its first call eager; alpha=2.0: a static capture of
    # n=100, then one symbolic capture for every later size; alpha=-1.0: its n=100 call captured
    # statically when the next (another family) comes (Note [Captured after its first call]),
    # then one symbolic capture
    assert compiled.eager_calls == 2
    symbolic = [opt for opt in compiled.captures.values() if opt.meta["trident_symbolic"]]
    assert len(compiled.captures) == 4 and len(symbolic) == 2
    for opt in symbolic:
        (stats,) = trident.cache_info(opt).values()
        assert stats["specializations"] <= 2  # n % 16 == 0 or not (4000 % 16 == 0)
    assert "symbolic sizes:" in trident.explain(compiled)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("bias2", torch.randn(16))

    def forward(self, x):
        return _axpy(self.lin(x), self.bias2.expand(x.shape[0], 16).contiguous(), 2.0)


def _net_reference(m, x):
    return 2.0 * m.lin(x) + m.bias2


def test_module_state_updates_and_reassignment():
    m = _Net().eval()
    m.forward = trident.compile(m.forward)
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(m(x), _net_reference(m, x))  # eager, then captured
        torch.testing.assert_close(m(x), _net_reference(m, x))
        m.lin.weight.mul_(3.0)  # in place: seen without a new capture
        torch.testing.assert_close(m(x), _net_reference(m, x))
        assert len(m.forward.captures) == 1
        m.lin.weight = torch.nn.Parameter(torch.randn(16, 16))  # reassigned: captured again
        for _ in range(2):
            torch.testing.assert_close(m(x), _net_reference(m, x))
        m.register_buffer("bias2", torch.zeros(16))
        for _ in range(2):
            torch.testing.assert_close(m(x), _net_reference(m, x))
    assert len(m.forward.captures) == 1 and m.forward.eager_calls == 3  # stale captures dropped


def test_explain_and_cache_info_of_a_compiled_function():
    compiled = trident.compile(lambda x, y: _axpy(x, y, 2.0))
    x, y = torch.randn(64), torch.randn(64)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, y), 2.0 * x + y)
    text = trident.explain(compiled)
    assert text.startswith(
        "1 capture(s); 1 call(s) ran eagerly\nthe latest eager calls (1), why each ran eagerly:\n"
        "  the first call of this function: it runs eagerly, state made on a first call then exists\n"
        "structure checks: 1 generated (the hit path checks the argument structure with them instead of walking the "
        "arguments; TRIDENT_LOG=misses says why a structure got none)\n"
        "capture 0:\n1 region(s)"
    )
    (info,) = trident.cache_info(compiled).values()
    (stats,) = info.values()
    assert stats["hits"] == 2 and stats["misses"] == 0  # the second call captured, then ran it


def test_hits_check_tensors_natively_only(monkeypatch):
    """After a capture, a call's tensors are checked by native guards (torch's TensorGuards) and
    the SCM's: Python computes no tensor facts on a hit; a new dtype, size or layout fails the
    native guards and takes the miss path (a new signature: eager once, then its own capture)."""
    from trident.frontends import compile as compile_module

    facts_calls = []
    plain = compile_module.signature

    def counting(leaves, tensor_facts=True):
        if tensor_facts:
            facts_calls.append(1)
        return plain(leaves, tensor_facts)

    monkeypatch.setattr(compile_module, "signature", counting)
    compiled = trident.compile(_axpy, dynamic=False)
    x, y = torch.randn(200), torch.randn(200)
    compiled(x, y, 2.0)
    compiled(x, y, 2.0)  # captured
    facts_calls.clear()
    for _ in range(5):
        x = torch.randn(200)
        torch.testing.assert_close(compiled(x, y, 2.0), 2.0 * x + y)
    assert facts_calls == []  # hits: no tensor facts computed in Python
    (opt,) = compiled.captures.values()
    assert trident.cache_info(opt)["region0"]["hits"] == 6
    for other in (torch.randn(200, dtype=torch.float64), torch.randn(300), torch.randn(400)[::2]):
        other_y = torch.randn(other.shape[0], dtype=other.dtype)
        want = _axpy(other, other_y, 2.0)  # eager's (the kernel reads a strided x as dense memory)
        for _ in range(3):  # eager, capture, hit
            torch.testing.assert_close(compiled(other, other_y, 2.0), want)
    assert len(compiled.captures) == 4 and compiled.eager_calls == 4
    assert len(facts_calls) == 6  # the two calls of each new signature that missed


def test_symbolic_capture_serves_new_sizes_and_strided_inputs_get_their_own():
    compiled = trident.compile(_axpy)
    x, y = torch.randn(200), torch.randn(200)
    for _ in range(2):  # eager, static capture
        compiled(x, y, 2.0)
    for n in (300, 301, 512):  # one symbolic capture, no eager call
        a, b = torch.randn(n), torch.randn(n)
        torch.testing.assert_close(compiled(a, b, 2.0), 2.0 * a + b)
    assert compiled.eager_calls == 1 and len(compiled.captures) == 2
    # a strided input: the symbolic trace had stride 1 (static); that capture raises before it
    # runs anything, and the call gets a static capture of its own
    other = torch.randn(400)[::2]
    other_y = torch.randn(200)
    torch.testing.assert_close(compiled(other, other_y, 2.0), _axpy(other, other_y, 2.0))
    assert len(compiled.captures) == 3
    torch.testing.assert_close(compiled(other, other_y, 2.0), _axpy(other, other_y, 2.0))
    assert len(compiled.captures) == 3
    # a new dtype: a new family, eager first as always
    d, e = torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)
    torch.testing.assert_close(compiled(d, e, 2.0), 2.0 * d + e)
    assert compiled.eager_calls == 2


def test_python_fallback_guards_agree_with_torchs_tensor_guards():
    """_FactGuards (for torch builds without TensorGuards' interface) against TensorGuards on
    tensors of other dtypes, sizes, strides, offsets and ranks."""
    from trident.frontends.compile import _FactGuards, _tensor_guards

    base = torch.randn(4, 6)
    variants = [base, base.clone(), base.double(), base.t(), base[:, ::2], base[1:], base.reshape(24),
                torch.randn(4, 6).contiguous(), torch.randn(6, 4).t(), base.half(), base.unsqueeze(0)]
    for captured in variants[:4]:
        native, fallback = _tensor_guards([captured]), _FactGuards([captured])
        assert not isinstance(native, _FactGuards)
        for t in variants:
            assert native.check(t) == fallback.check(t), (captured.shape, captured.stride(), t.shape, t.stride(), t.dtype)


class _Counter:
    def __init__(self):
        self.layers = [_Layer()]


class _Layer:
    def __init__(self):
        self.calls = 0  # a Python int the function reads and advances (HF's sliding-window layers do)


def test_python_scalars_of_objects_passed_are_state():
    """A traced call reads an object's Python scalars: replaying a capture with the values it
    saw would compute with the old ones. An int that changes between calls is made symbolic
    (Note [State the function is passed]): counts 0, 1 and the first of "2 or more" run
    eagerly (each a new structure's first call), then ONE symbolic capture serves every later count, and
    the counter it advances is written back to the caller's object after each call."""

    table = torch.arange(16.0)

    def f(x, y, state):
        layer = state.layers[0]
        out = _axpy(x * table.select(0, layer.calls), y, 1.0)  # the count as a position
        layer.calls += 1
        return out

    compiled = trident.compile(f)
    state = _Counter()
    x, y = torch.randn(100), torch.randn(100)
    for i in range(8):
        torch.testing.assert_close(compiled(x, y, state), i * x + y)
    assert state.layers[0].calls == 8
    # counts 0 and 1 are captured when the next call comes (Note [Captured after its first
    # call]); count 2's first call is served by the symbolic capture made at count 3
    assert len(compiled.captures) == 3 and compiled.eager_calls == 3
    assert sum(opt.meta["trident_symbolic"] for opt in compiled.captures.values()) == 1
    assert "state.layers[0].calls: 1 -> 2" in "\n".join(compiled.eager_log)
    # a state that stays put is captured as before: eager once, captured, then hits
    reads = trident.compile(lambda x, y, state: _axpy(x, y, float(state.layers[0].calls) + 1.0))
    steady = _Counter()
    for _ in range(4):
        torch.testing.assert_close(reads(x, y, steady), x + y)
    assert len(reads.captures) == 1 and reads.eager_calls == 1
    steady.layers[0].calls = 2  # changed between calls: a new signature, eager's result
    torch.testing.assert_close(reads(x, y, steady), 3.0 * x + y)
