"""torch.compile(fn, backend="trident"): Dynamo captures, each graph is optimized by Trident
(Note [Dynamo graphs and static capture])."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
import triton

import trident
from tests import kernels as K
from trident import knobs
from trident.frontends.dynamo import compiled_graphs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _program(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    K.axpy_kernel[(triton.cdiv(n, 64),)](x, y, out, n, 2.0, BLOCK=64)
    return torch.relu(out) + 1


def _reference(x, y):
    return torch.relu(2.0 * x + y) + 1


def _graphs_since(start: int):
    return compiled_graphs()[start:]


def _scm_nodes(opt) -> int:
    return sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes)


@pytest.mark.parametrize("fullgraph", [True, False])
@pytest.mark.parametrize("dynamic", [False, None])
def test_compile_with_the_trident_backend(device, fullgraph, dynamic):
    start = len(compiled_graphs())
    compiled = torch.compile(_program, backend="trident", fullgraph=fullgraph, dynamic=dynamic)
    for n in (1000, 1000, 1000, 777, 777, 2048):  # new sizes: new captures, never an error
        x, y = torch.randn(n, device=device), torch.randn(n, device=device)
        torch.testing.assert_close(compiled(x, y), _reference(x, y))
    graphs = _graphs_since(start)
    assert graphs and all(g.eager_calls == 0 for g in graphs)
    captures = [opt for g in graphs for opt in g.captures.values()]
    assert sum(map(_scm_nodes, captures)) >= 1
    # each input signature is captured once; the launch and the ATen ops after it share a region
    assert len(captures) == len({(id(g), k) for g in graphs for k in g.captures})
    for opt in captures:
        # a static capture serves its one signature; a symbolic one (Note [Dynamic Dynamo graphs])
        # misses once where Triton's key changes (2048 % 16 == 0, unlike 777 and 1000)
        allowed = 1 if opt.meta["trident_symbolic"] else 0
        assert all(v["misses"] <= allowed for v in trident.cache_info(opt).values())


def test_graph_breaks_give_several_graphs_each_optimized(device):
    def broken(x, y):
        out = _program(x, y)
        if out.sum().item() > 0:  # data-dependent control flow: a graph break
            out = out * 2
        z = torch.empty_like(out)
        K.axpy_kernel[(triton.cdiv(out.numel(), 64),)](out, y, z, out.numel(), 0.5, BLOCK=64)
        return z

    def reference(x, y):
        out = _reference(x, y)
        if out.sum().item() > 0:
            out = out * 2
        return 0.5 * out + y

    start = len(compiled_graphs())
    compiled = torch.compile(broken, backend="trident")
    for _ in range(3):
        x, y = torch.randn(500, device=device), torch.randn(500, device=device)
        torch.testing.assert_close(compiled(x, y), reference(x, y))
    graphs = _graphs_since(start)
    assert len(graphs) >= 2
    assert sum(_scm_nodes(opt) for g in graphs for opt in g.captures.values()) >= 2


class _Scaled(torch.nn.Module):
    """A module with parameters and a buffer around a Triton kernel."""

    def __init__(self, n):
        super().__init__()
        self.proj = torch.nn.Linear(n, n)
        self.register_buffer("shift", torch.linspace(-1, 1, n))

    def forward(self, x):
        h = self.proj(x)
        out = torch.empty_like(h)
        K.axpy_kernel[(triton.cdiv(h.numel(), 64),)](h, self.shift.expand_as(h).contiguous(), out, h.numel(), 3.0, BLOCK=64)
        return out


def _module_reference(m, x):
    return 3.0 * m.proj(x) + m.shift


def test_module_parameters_and_in_place_updates(device):
    m = _Scaled(32).to(device).eval()
    compiled = torch.compile(m, backend="trident")
    x = torch.randn(4, 32, device=device)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), _module_reference(m, x))
        m.proj.weight.mul_(-2.0)  # in place: the graph reads the parameter as an input
        m.shift.add_(5.0)
        torch.testing.assert_close(compiled(x), _module_reference(m, x))


def test_grad_enabled_calls_run_the_graph_eagerly(device):
    """Trident is inference only: with grad enabled and parameters requiring grad, Dynamo's graph
    runs eagerly, so gradients are those of eager."""
    m = _Scaled(16).to(device)
    compiled = torch.compile(lambda x: m(x) + m.proj(x), backend="trident")  # a Triton launch has no gradient
    x = torch.randn(2, 16, device=device)
    compiled(x).sum().backward()
    want = m.proj.weight.grad.clone()
    m.zero_grad()
    (m(x) + m.proj(x)).sum().backward()  # eager (Triton's interpreter on the CPU)
    torch.testing.assert_close(want, m.proj.weight.grad)
    assert any(g.eager_calls and "inference only" in g.eager_log[-1] for g in compiled_graphs())


def test_captures_per_graph_are_bounded(caplog, monkeypatch):
    start = len(compiled_graphs())
    monkeypatch.setattr(logging.getLogger("trident.misses"), "propagate", True)  # to caplog, under TRIDENT_LOG too
    with (knobs.scope(captures="2", dynamo_symbolic="0"),  # static captures per signature
          caplog.at_level(logging.WARNING, logger="trident.misses")):
        compiled = torch.compile(_program, backend="trident", dynamic=True)
        for n in (100, 200, 300, 400):
            x, y = torch.randn(n), torch.randn(n)
            torch.testing.assert_close(compiled(x, y), _reference(x, y))
    (g,) = _graphs_since(start)
    assert len(g.captures) == 2 and g.eager_calls == 2 and "TRIDENT_CAPTURES=2" in g.eager_log[-1]
    # the input that changed, in Dynamo's name for it (issue 22: every eager call says why)
    assert "-> float32[400]" in g.eager_log[-1] and "float32[200] -> float32[300]" in g.eager_log[-2], g.eager_log
    said = [r.getMessage() for r in caplog.records if "(TRIDENT_CAPTURES) reached" in r.getMessage()]
    # once, though two calls overflowed; named by the frame Dynamo compiled
    door = "torch.compile(backend='trident') graph of _program (test_dynamo.py:"
    assert len(said) == 1 and said[0].startswith(door) and "2 captures (TRIDENT_CAPTURES) reached" in said[0] \
        and "TRIDENT_CAPTURES=4" in said[0], said


def test_backend_through_the_entry_point_without_importing_trident():
    """The trident-scm distribution names the backend in torch_dynamo_backends: torch.compile
    finds it in a process that never imports trident itself."""
    code = (
        "import torch, triton, sys\n"
        "from tests import kernels as K\n"
        "assert 'trident' not in sys.modules\n"
        "def f(x, y):\n"
        "    out = torch.empty_like(x)\n"
        "    K.axpy_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), 2.0, BLOCK=64)\n"
        "    return out\n"
        "c = torch.compile(f, backend='trident', fullgraph=True)\n"
        "x, y = torch.randn(300), torch.randn(300)\n"
        "torch.testing.assert_close(c(x, y), 2 * x + y)\n"
        "from trident.frontends.dynamo import compiled_graphs\n"
        "print(len(compiled_graphs()), sum(len(g.captures) for g in compiled_graphs()))\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1", "1"]


# Note [Disabled functions under backend="trident"]: a library's torch.compiler.disable()d
# launcher (Liger-Kernel 0.8.5 disables its op dispatcher) stays in the graph for Trident to trace.
@torch.compiler.disable
def _disabled_axpy(x, y, alpha):
    out = torch.empty_like(x)
    K.axpy_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), alpha, BLOCK=64)
    return out


def _around_disabled(x, y):
    h = torch.relu(x) + 1
    return _disabled_axpy(h, y, 2.0) * 3


def _around_disabled_reference(x, y):
    return (2.0 * (torch.relu(x) + 1) + y) * 3


def _dynamo_graphs(fn, backend, *args):
    """Calls torch.compile(fn, backend) once; returns (result, graphs Dynamo made)."""
    from torch._dynamo.utils import counters

    counters.clear()
    out = torch.compile(fn, backend=backend)(*args)
    return out, counters["stats"]["unique_graphs"]


@pytest.fixture
def trace_test_modules():
    with knobs.scope(dynamo_trace_disabled="liger_kernel,tests"):  # this module's disabled functions too
        yield


def test_disabled_function_stays_in_the_trident_graph(device, trace_test_modules):
    x, y = torch.randn(300, device=device), torch.randn(300, device=device)
    out, graphs = _dynamo_graphs(_around_disabled, "eager", x, y)
    assert graphs == 2  # Dynamo alone breaks the graph at the disabled call ...
    torch._dynamo.reset()
    start = len(compiled_graphs())
    compiled = torch.compile(_around_disabled, backend="trident", fullgraph=True)  # ... Trident keeps it
    for _ in range(3):
        x, y = torch.randn(300, device=device), torch.randn(300, device=device)
        torch.testing.assert_close(compiled(x, y), _around_disabled_reference(x, y))
    (g,) = _graphs_since(start)
    (opt,) = g.captures.values()
    assert _scm_nodes(opt) == 1  # the launch and the ATen ops around it: one region
    (stats,) = trident.cache_info(opt).values()
    assert stats["misses"] == 0 and stats["hits"] == 3


def test_disabled_functions_with_the_rule_off_or_excluded_break_the_graph(device):
    """By default a pure disabled function of any library stays in the graph (the checked rule,
    Note [Disabled functions under backend="trident"]); with the rule off, or its module
    excluded, it breaks the graph as under plain Dynamo."""
    x, y = torch.randn(300, device=device), torch.randn(300, device=device)
    for value, want in ((None, 1), ("", 2), ("-tests", 2)):
        with knobs.scope(**({} if value is None else {"dynamo_trace_disabled": value})):
            out, graphs = _dynamo_graphs(_around_disabled, "trident", x, y)
        torch.testing.assert_close(out, _around_disabled_reference(x, y))
        assert graphs == want, value
        torch._dynamo.reset()


@torch.compiler.disable
def _disabled_python_value(x):
    return int(x.sum().item() > 0)  # data-dependent, and not a tensor: Dynamo cannot keep the call


def test_disabled_function_dynamo_cannot_keep_breaks_the_graph(device, trace_test_modules):
    def fn(x):
        flag = _disabled_python_value(x * 2)
        return x + flag

    for sign in (1.0, -1.0):
        x = torch.full((8,), sign, device=device)
        out, graphs = _dynamo_graphs(fn, "trident", x)
        torch.testing.assert_close(out, x + (1 if sign > 0 else 0))
        assert graphs == 2
        torch._dynamo.reset()


def test_explain_and_cache_info_of_torch_compile_results(device):
    """trident.explain / cache_info take what torch.compile returned: a function (its graphs
    after a graph break included) or an OptimizedModule."""
    def broken(x, y):
        out = _program(x, y)
        torch._dynamo.graph_break()
        return out * 2

    compiled = torch.compile(broken, backend="trident")
    x, y = torch.randn(300, device=device), torch.randn(300, device=device)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, y), 2 * _reference(x, y))
    text = trident.explain(compiled)
    assert text.startswith("torch.compile(backend='trident'): 2 Dynamo graph(s), 2 capture(s); 0 call(s) ran eagerly")
    assert "Call to `torch._dynamo.graph_break()`" in text and "launch axpy_kernel" in text
    info = trident.cache_info(compiled)
    assert sorted(info) == ["graph 0 capture 0", "graph 1 capture 0"]
    assert all(v["hits"] == 2 and v["misses"] == 0 for regions in info.values() for v in regions.values())

    m = _Scaled(16).to(device).eval()
    cm = torch.compile(m, backend="trident")
    with torch.no_grad():
        cm(torch.randn(2, 16, device=device))
    assert trident.explain(cm).startswith("torch.compile(backend='trident'): 1 Dynamo graph(s), 1 capture(s)")
    assert list(trident.cache_info(cm)) == ["graph 0 capture 0"]
    with pytest.raises(trident.TridentError, match="expected what trident.optimize, trident.compile or torch.compile"):
        trident.explain(m)


def test_static_graph_takes_its_capture_without_a_signature(device, monkeypatch):
    """A graph Dynamo traced with static sizes computes no signature per call (Dynamo's guards
    checked every input); so does a dynamic graph served by its symbolic capture (Note [Dynamic
    Dynamo graphs]); with TRIDENT_DYNAMO_SYMBOLIC=0 a dynamic graph keys its captures by signature."""
    from trident.frontends import dynamo

    calls = []
    real = dynamo.signature
    monkeypatch.setattr(dynamo, "signature", lambda args: calls.append(1) or real(args))
    compiled = torch.compile(_program, backend="trident", dynamic=False)
    x, y = torch.randn(300, device=device), torch.randn(300, device=device)
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(compiled(x, y), _reference(x, y))
    assert len(calls) == 1  # the static key, once, when the backend got the graph
    for symbolic, want in (("1", 0), ("0", 3)):
        torch._dynamo.reset()
        calls.clear()
        with knobs.scope(dynamo_symbolic=symbolic):
            compiled = torch.compile(_program, backend="trident", dynamic=True)
            with torch.no_grad():
                for n in (300, 301, 300):
                    x, y = torch.randn(n, device=device), torch.randn(n, device=device)
                    torch.testing.assert_close(compiled(x, y), _reference(x, y))
        assert len(calls) == want


def test_graph_trident_cannot_capture_runs_eagerly(device, monkeypatch):
    """A Dynamo graph Trident refuses (a TridentError while capturing or optimizing) runs as
    Dynamo's graph, eagerly, for that signature; a warning and explain() say why."""
    import logging

    from trident.frontends import dynamo

    def refuse(*args, **kwargs):
        raise trident.CaptureError("could not capture: a construct Trident does not support")

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    monkeypatch.setattr(dynamo, "capture", refuse)
    start = len(compiled_graphs())
    compiled = torch.compile(_program, backend="trident")
    keep = Keep(level=logging.WARNING)
    logging.getLogger("trident.misses").addHandler(keep)
    try:
        for _ in range(3):
            x, y = torch.randn(300, device=device), torch.randn(300, device=device)
            torch.testing.assert_close(compiled(x, y), _reference(x, y))
    finally:
        logging.getLogger("trident.misses").removeHandler(keep)
    (g,) = _graphs_since(start)
    assert g.eager_calls == 3 and not g.captures
    assert "Trident cannot optimize this graph: CaptureError" in g.eager_reason
    assert sum("runs eagerly" in r.getMessage() for r in records) == 1  # warned once
    assert "last eager call: Trident cannot optimize this graph" in trident.explain(compiled)


_MEMO: dict = {}


@torch.compiler.disable
def _memoized_table(x):
    """Disabled for its Python state: a memo of tensors by size."""
    if x.numel() not in _MEMO:
        _MEMO[x.numel()] = torch.arange(x.numel(), dtype=x.dtype, device=x.device)
    return _MEMO[x.numel()]


def test_disabled_function_with_state_is_left_to_dynamo(device):
    """A library's disabled function that keeps state is not run on fake tensors by default: its
    memo holds a real tensor afterwards, and results equal eager's."""
    _MEMO.clear()

    def fn(x, y):
        return _program(x, y) + _memoized_table(x)

    x, y = torch.randn(300, device=device), torch.randn(300, device=device)
    compiled = torch.compile(fn, backend="trident")
    for _ in range(2):
        torch.testing.assert_close(compiled(x, y), _reference(x, y) + torch.arange(300, device=device, dtype=x.dtype))
    assert type(_MEMO[300]) is torch.Tensor
    torch.testing.assert_close(fn(x, y), compiled(x, y))


def test_dynamo_reset_drops_the_compiled_graphs(device):
    compiled = torch.compile(_program, backend="trident")
    x, y = torch.randn(300, device=device), torch.randn(300, device=device)
    compiled(x, y)
    assert compiled_graphs()
    torch._dynamo.reset()
    assert compiled_graphs() == []
    torch.testing.assert_close(compiled(x, y), _reference(x, y))  # compiled again
    assert len(compiled_graphs()) == 1


def test_dynamic_graph_gets_one_symbolic_capture():
    """Note [Dynamic Dynamo graphs]: Dynamo's recompile for a new size hands over a graph with
    symbolic sizes and its size inputs; one symbolic capture serves every later size, with one
    specialization per Triton key of the kernels' integer arguments."""
    from tests import kernels as K

    torch._dynamo.reset()
    f = torch.compile(K.two_kernels, backend="trident")
    for n in (100, 101, 102, 1000, 1024, 7, 33):
        x, y = torch.randn(n), torch.randn(n)
        torch.testing.assert_close(f(x, y), K.two_kernels_ref(x, y))
    info = trident.cache_info(f)
    symbolic = [v for k, v in info.items() if k.startswith("graph 1")]
    assert len(info) == 2 and len(symbolic) == 1, info  # the static first graph, one symbolic capture
    (stats,) = symbolic[0].values()
    assert stats["hits"] + stats["misses"] == 6 and stats["specializations"] == 2, stats
    assert "symbolic sizes:" in trident.explain(f)
    torch._dynamo.reset()


@pytest.mark.parametrize("door", ["capture", "compile"])
def test_a_librarys_torch_compiled_helper_is_traced_through(door):
    """flash-linear-attention wraps its activations in torch.compile; Trident's trace runs such a
    helper's Python as written (its capture was refused: "Detected that you are using FX to
    symbolically trace a dynamo-optimized function", and every call of RWKV-7 ran eagerly)."""
    torch._dynamo.reset()
    helper = torch.compile(lambda t: torch.relu(t) ** 2, backend="eager")

    def fn(x, y):
        return helper(K.axpy(x, y)) + 1

    x, y = torch.randn(300), torch.randn(300)
    want = torch.relu(K.axpy_ref(x, y)) ** 2 + 1
    if door == "capture":
        opt = trident.optimize(trident.capture(fn, x, y))
        torch.testing.assert_close(opt(x, y), want)
    else:
        compiled = trident.compile(fn)
        for _ in range(3):
            torch.testing.assert_close(compiled(x, y), want)
        assert len(compiled.captures) == 1 and compiled.eager_calls == 1 and not compiled.dynamo_calls
    torch._dynamo.reset()
