"""Python custom ops (torch.library.custom_op) around Triton launches are traced through at
capture (Note [Inlining custom ops]): their launches and ATen ops run natively in a region, with
no boxed call of the op; an implementation that cannot be traced, or whose registered fake
disagrees with it, stays one boxed call and explain() says why."""

from __future__ import annotations

import pytest
import torch
import triton

import trident
from tests import kernels as K
from trident.capture import inline_triton_ops
from trident.runtime import SCMRuntime

NS = "trident_custom_ops_test"


@torch.library.custom_op(f"{NS}::axpy_relu", mutates_args=())
def axpy_relu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    K.axpy_kernel[(triton.cdiv(n, 64),)](x, y, out, n, 2.5, BLOCK=64)
    return out.relu() + 1.0


@axpy_relu.register_fake
def _(x, y):
    return torch.empty_like(x)


def axpy_relu_ref(x, y):
    return (2.5 * x + y).relu() + 1.0


def uses_axpy_relu(x, y):
    return axpy_relu(x * 2.0, y) - y


def uses_axpy_relu_ref(x, y):
    return axpy_relu_ref(x * 2.0, y) - y


@torch.library.custom_op(f"{NS}::axpy_into", mutates_args=("out",))
def axpy_into(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
    n = x.numel()
    K.axpy_kernel[(triton.cdiv(n, 64),)](x, y, out, n, 2.5, BLOCK=64)  # a launch writes `out`
    out.mul_(2.0)  # and an ATen op in place


def uses_axpy_into(x, y, out):
    axpy_into(x, y, out)
    return out + 1.0


@torch.library.custom_op(f"{NS}::outer", mutates_args=())
def outer(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return axpy_relu(x, y) * 3.0  # another custom op inside


@outer.register_fake
def _(x, y):
    return torch.empty_like(x)


@torch.library.custom_op(f"{NS}::split_axpy", mutates_args=())
def split_axpy(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    raise RuntimeError("the default implementation is not the one the dispatcher runs on the CPU")


@split_axpy.register_kernel("cpu")
def _(x, y):
    return [axpy_relu(x, y), y * 2.0]  # a list: the dispatcher makes it a tuple


@split_axpy.register_fake
def _(x, y):
    return torch.empty_like(x), torch.empty_like(y)


def _host_item(x):
    return x.abs().max().item()


def _host_numpy(x):
    return float(x.abs().numpy().max())


def _host_data_ptr(x):
    return 1.0 if x.data_ptr() % 2 == 0 else 1.0


@torch.library.custom_op(f"{NS}::host_scaled", mutates_args=())
def host_scaled(x: torch.Tensor, y: torch.Tensor, how: str) -> torch.Tensor:
    scale = {"item": _host_item, "numpy": _host_numpy, "data_ptr": _host_data_ptr}[how](x)
    out = torch.empty_like(x)
    n = x.numel()
    K.axpy_kernel[(triton.cdiv(n, 64),)](x, y, out, n, scale, BLOCK=64)
    return out


@host_scaled.register_fake
def _(x, y, how):
    return torch.empty_like(x)


def host_scaled_ref(x, y, how):
    scale = x.abs().max().item() if how != "data_ptr" else 1.0
    return scale * x + y


@torch.library.custom_op(f"{NS}::wrong_dtype", mutates_args=())
def wrong_dtype(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return axpy_relu(x, y) * 2.0


@wrong_dtype.register_fake
def _(x, y):
    return torch.empty_like(x, dtype=torch.float64)


@torch.library.custom_op(f"{NS}::wrong_shape", mutates_args=())
def wrong_shape(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return axpy_relu(x, y) * 2.0


@wrong_shape.register_fake
def _(x, y):
    return x.new_empty(x.shape[0] + 1)


@torch.library.custom_op(f"{NS}::static_fake", mutates_args=())
def static_fake(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return axpy_relu(x, y) * 2.0


@static_fake.register_fake
def _(x, y):
    return x.new_empty(100)  # right for the example, wrong for other sizes


def _ops_called(gm: torch.fx.GraphModule) -> set[str]:
    """Every operator the optimized graph calls: its own nodes and its regions' operator calls."""
    names = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    for n in gm.graph.nodes:
        if n.target is torch.ops.trident.scm.default:
            names |= {s.op_name for s in SCMRuntime.get(n.args[0]).program.atens}
    return names


def _launched(gm: torch.fx.GraphModule) -> list[str]:
    return [
        step.kernel_name
        for n in gm.graph.nodes
        if n.target is torch.ops.trident.scm.default
        for step in SCMRuntime.get(n.args[0]).program.launches
    ]


def _assert_inlined(opt: torch.fx.GraphModule, *ops: str, launches: int = 1) -> None:
    called = _ops_called(opt)
    for op in ops:
        assert not any(op in name for name in called), (op, called)
    assert _launched(opt) == ["axpy_kernel"] * launches
    assert opt.meta["trident_boxed_custom_ops"] == {}
    mixes = [line for line in trident.explain(opt).splitlines() if "operator calls:" in line]
    assert mixes and all(line.endswith("+ 0 boxed calls") for line in mixes), mixes
    assert "stays a boxed call" not in trident.explain(opt)


@pytest.mark.parametrize("dynamic", [False, True])
def test_custom_op_around_a_launch_is_traced_through(dynamic):
    x, y = torch.randn(100), torch.randn(100)
    gm = trident.capture(uses_axpy_relu, x, y, dynamic=dynamic)
    assert torch.ops.trident_custom_ops_test.axpy_relu.default not in {n.target for n in gm.graph.nodes}
    opt = trident.optimize(gm)
    for _ in range(2):
        torch.testing.assert_close(opt(x, y), uses_axpy_relu_ref(x, y))
    torch.testing.assert_close(uses_axpy_relu(x, y), uses_axpy_relu_ref(x, y))  # eager: the op itself
    _assert_inlined(opt, f"{NS}.axpy_relu")


def test_compile_runs_the_custom_op_natively():
    compiled = trident.compile(uses_axpy_relu, dynamic=False)
    x, y = torch.randn(100), torch.randn(100)
    for _ in range(3):  # eager, capture, hit
        torch.testing.assert_close(compiled(x, y), uses_axpy_relu_ref(x, y))
    (opt,) = compiled.captures.values()
    _assert_inlined(opt, f"{NS}.axpy_relu")
    (info,) = trident.cache_info(compiled).values()
    assert [s["hits"] for s in info.values()] == [2]


def test_compile_dynamic_serves_two_sizes_with_one_symbolic_capture():
    compiled = trident.compile(uses_axpy_relu, dynamic=True)
    for n in (100, 300, 100, 300, 300):
        x, y = torch.randn(n), torch.randn(n)
        torch.testing.assert_close(compiled(x, y), uses_axpy_relu_ref(x, y))
    (opt,) = compiled.captures.values()
    assert opt.meta["trident_symbolic"]
    _assert_inlined(opt, f"{NS}.axpy_relu")
    (info,) = trident.cache_info(compiled).values()
    assert sum(s["hits"] for s in info.values()) == 4  # every call but the first (eager)


def test_nested_custom_ops_and_triton_ops_are_traced_through():
    x, y = torch.randn(100), torch.randn(100)
    opt = trident.optimize(trident.capture(lambda a, b: outer(a, b) + K.axpy_op(a, b), x, y))
    torch.testing.assert_close(opt(x, y), axpy_relu_ref(x, y) * 3.0 + K.axpy_ref(x, y))
    _assert_inlined(opt, f"{NS}.outer", f"{NS}.axpy_relu", "trident_tests.axpy_op", launches=2)


@pytest.mark.parametrize("dynamic", [False, True])
def test_the_kernel_registered_for_the_device_is_traced_with_its_outputs(dynamic):
    x, y = torch.randn(100), torch.randn(100)
    opt = trident.optimize(
        trident.capture(lambda a, b: split_axpy(a, b)[1] - split_axpy(a, b)[0], x, y, dynamic=dynamic)
    )
    torch.testing.assert_close(opt(x, y), y * 2.0 - axpy_relu_ref(x, y))
    _assert_inlined(opt, f"{NS}.split_axpy", f"{NS}.axpy_relu", launches=2)


@pytest.mark.parametrize("dynamic", [False, True])
def test_mutating_custom_op_writes_its_argument(dynamic):
    x, y = torch.randn(100), torch.randn(100)
    gm = trident.capture(uses_axpy_into, x, y, torch.zeros(100), dynamic=dynamic)
    opt = trident.optimize(gm)
    for _ in range(2):
        out = torch.full((100,), 7.0)
        result = opt(x, y, out)
        torch.testing.assert_close(out, 2.0 * (2.5 * x + y))  # the caller's tensor, written
        torch.testing.assert_close(result, 2.0 * (2.5 * x + y) + 1.0)
    eager_out = torch.zeros(100)
    uses_axpy_into(x, y, eager_out)
    torch.testing.assert_close(eager_out, out)
    _assert_inlined(opt, f"{NS}.axpy_into")


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("how", ["item", "numpy", "data_ptr"])
def test_untraceable_implementation_stays_boxed(how, dynamic):
    def f(x, y):
        return host_scaled(x, y, how) + axpy_relu(x, y)

    x, y = torch.randn(100), torch.randn(100)
    opt = trident.optimize(trident.capture(f, x, y, dynamic=dynamic))
    for _ in range(2):
        x = torch.randn(100)
        torch.testing.assert_close(opt(x, y), host_scaled_ref(x, y, how) + axpy_relu_ref(x, y))
    called = _ops_called(opt)
    assert f"{NS}.host_scaled.default" in called  # one boxed call
    assert f"{NS}.axpy_relu.default" not in called  # the traceable one next to it is inlined
    assert _launched(opt) == ["axpy_kernel"]
    reason = opt.meta["trident_boxed_custom_ops"][f"{NS}::host_scaled"]
    assert reason.startswith("its implementation cannot be traced (")
    (line,) = [line for line in trident.explain(opt).splitlines() if "stays a boxed call" in line]
    assert line == f"custom op {NS}::host_scaled stays a boxed call: {reason}"


def test_untraceable_reason_reaches_explain_of_compile():
    compiled = trident.compile(lambda x, y: host_scaled(x, y, "item"), dynamic=False)
    x, y = torch.randn(100), torch.randn(100)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, y), host_scaled_ref(x, y, "item"))
    text = trident.explain(compiled)
    assert f"custom op {NS}::host_scaled stays a boxed call: its implementation cannot be traced (it reads" in text


@pytest.mark.parametrize(
    ("op", "dynamic", "expected"),
    [
        (wrong_dtype, False, "output 0: expected dtype torch.float64 from the fake, got torch.float32 from the trace"),
        (wrong_shape, False, "output 0: expected shape (101,) from the fake, got (100,) from the trace"),
        (static_fake, True, "output 0: expected shape (100,) from the fake, got (s"),
    ],
)
def test_fake_that_disagrees_keeps_the_op_boxed(op, dynamic, expected):
    x, y = torch.randn(100), torch.randn(100)
    opt = trident.optimize(trident.capture(lambda a, b: op(a, b), x, y, dynamic=dynamic))
    name = op._qualname
    reason = opt.meta["trident_boxed_custom_ops"][name]
    assert reason.startswith("its registered fake disagrees with its implementation's trace: " + expected), reason
    assert f"custom op {name} stays a boxed call: {reason}" in trident.explain(opt)
    assert f"{name.replace('::', '.')}.default" in _ops_called(opt)
    if op is not wrong_shape:  # the boxed call runs the implementation, as eager does
        torch.testing.assert_close(opt(x, y), axpy_relu_ref(x, y) * 2.0)


def test_keep_boxed_opts_out(monkeypatch):
    monkeypatch.setattr(inline_triton_ops, "KEEP_BOXED", {f"{NS}::axpy_relu"})
    x, y = torch.randn(100), torch.randn(100)
    opt = trident.optimize(trident.capture(uses_axpy_relu, x, y))
    torch.testing.assert_close(opt(x, y), uses_axpy_relu_ref(x, y))
    assert f"{NS}.axpy_relu.default" in _ops_called(opt)
    assert _launched(opt) == []
    assert f"custom op {NS}::axpy_relu stays a boxed call: listed in" in trident.explain(opt)
