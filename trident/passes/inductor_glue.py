"""Inductor's code generator as a library: a graph of ATen glue -> Triton launches.

`lower(sub, inputs)` hands a small FX graph of elementwise ops, reductions, casts and views
(the glue between a program's launches, chosen by fuse_glue) to Inductor's graph lowering with
its FX wrapper (`GraphLowering(..., fx_wrapper=True)`): Inductor fuses and generates Triton
kernels and, instead of Python source, returns an FX graph of `torch.empty_strided`,
`triton_kernel_wrapper_mutation` launches of those kernels and `torch.as_strided` views. That
graph is what a trace of user kernels looks like, so the rest of Trident (guards, specialization,
native launches, graph replay) serves Inductor's kernels as it serves a user's.

Decided here, for a glue graph inside a region (Note [Fused glue] in fuse_glue.py):
- inference only, no autotuning at compile time (one config per kernel, Inductor's heuristic
  pick; the launch's num_warps/num_stages come from it), no asserts, no buffer reuse or in-place
  buffers (every buffer is written once: Trident's allocation planning sees plain allocations),
  `emulate_precision_casts` (a cast to bf16 inside a fused kernel rounds as eager's would), no
  split reductions (decode glue reduces one row; one kernel), no caches (the kernels are
  regenerated per process; Trident's own cache keys them by source);
- static shapes only (the captures fuse_glue runs on);
- Inductor lowers for a CUDA device. On a machine without one (the CPU tests: Triton's kernels
  run through its interpreter there) it is told of an sm_90 device while lowering: device
  properties, capability, the current stream and the launcher Inductor would load are answered
  for it, and restored afterwards -- nothing stays patched outside `lower` (while it runs the
  answers are process-wide: another thread asking a CUDA-less torch for a device capability
  then gets sm_90 instead of an error).

Lowerings are cached per graph structure and input layout: the 16-32 layers of a decoder have
the same glue, lowered once.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table, triton_kernel_wrapper_mutation

from .. import triton_state

_CACHE: dict = {}
_CACHE_MAX = 256


class GlueLoweringError(Exception):
    """Inductor could not lower a glue graph into launches only (it is left unfused)."""


@dataclass(frozen=True)
class Lowered:
    """Inductor's graph for one glue graph: `graph` has one placeholder per input and returns
    a tuple of the outputs; its nodes are `aten.empty_strided` allocations, launches (num_warps
    and num_stages in their kwargs) and `aten.as_strided` views. `kernels`: the launches."""

    graph: torch.fx.Graph
    kernels: int


def _inductor_config() -> dict:
    return {
        "fx_wrapper": True,
        "compile_threads": 1,
        "size_asserts": False,
        "alignment_asserts": False,
        "scalar_asserts": False,
        "nan_asserts": False,
        "force_disable_caches": True,
        "emulate_precision_casts": True,
        "allow_buffer_reuse": False,
        "inplace_buffers": False,
        "split_reductions": False,
        "max_autotune": False,
        "max_autotune_pointwise": False,
        "coordinate_descent_tuning": False,
        "triton.autotune_at_compile_time": False,
        "triton.autotune_pointwise": False,
        "triton.cudagraphs": False,
    }


@contextlib.contextmanager
def _patched(obj, name: str, value):
    missing = object()
    old = vars(obj).get(name, missing)  # as stored (a classmethod stays one); absent from a CPU build's torch._C
    setattr(obj, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(obj, name)
        else:
            setattr(obj, name, old)


@contextlib.contextmanager
def _sm90_without_cuda():
    """While lowering on a machine without CUDA: Inductor sees an H100/H200-class device (sm_90,
    132 SMs) and loads no launcher (Triton compiles the kernel; nothing runs it here)."""
    if torch.cuda.is_available():
        yield
        return
    from torch._inductor.runtime import triton_helpers
    from torch._inductor.runtime.hints import DeviceProperties
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    real_create = DeviceProperties.create

    def create(device):
        if torch.device(device).type == "cuda":
            return DeviceProperties(type="cuda", index=0, multi_processor_count=132, cc=90, major=9,
                                    regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                                    max_threads_per_block=1024, warp_size=32)
        return real_create(device)

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(DeviceProperties, "create", staticmethod(create)))
        stack.enter_context(_patched(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0)))
        stack.enter_context(_patched(torch._C, "_cuda_getCurrentRawStream", lambda *a: 0))
        stack.enter_context(_patched(triton_helpers, "set_driver_to_gpu", lambda: None))
        stack.enter_context(_patched(CachingAutotuner, "_make_launchers", lambda self: None))
        yield


def _structure_key(sub: torch.fx.Graph, inputs: list) -> tuple:
    """What the lowering depends on: each node's target and arguments (nodes by position), and
    each input's size, stride, dtype and device."""
    index: dict = {}
    rows = []

    def arg(a):
        if isinstance(a, torch.fx.Node):
            return ("%", index[a])
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(arg(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((k, arg(v)) for k, v in a.items()))
        return (type(a).__name__, repr(a))

    for i, node in enumerate(sub.nodes):
        index[node] = i
        rows.append((node.op, str(node.target), arg(node.args), arg(node.kwargs)))
    layouts = tuple((tuple(t.shape), tuple(t.stride()), t.dtype, t.device.type) for t in inputs)
    return tuple(rows), layouts


def lower(sub: torch.fx.Graph, inputs: list) -> Lowered:
    """Inductor's launches for `sub` (placeholders in the order of `inputs`, the example values
    -- fake or real tensors -- it is called with; output: a tuple of tensors). Raises
    GlueLoweringError when Inductor fails or would run anything but its own Triton kernels."""
    key = _structure_key(sub, inputs)
    # Inductor keeps global state (V.graph, its config), make_fx too (FX's patcher and tracing
    # flag), and Inductor runs Triton's frontend to compile its kernels: the lowering holds the
    # lock every Trident capture and Triton frontend run holds (Note [Triton's interpreter state]).
    with triton_state.exclusive():
        hit = _CACHE.get(key)
        if hit is not None:
            return hit
        try:
            lowered = _lower(sub, inputs)
        except GlueLoweringError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of Inductor leaves the glue as it is
            raise GlueLoweringError(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}") from e
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = lowered
        return lowered


def _lower(sub: torch.fx.Graph, inputs: list) -> Lowered:
    from torch._inductor import config as inductor_config
    from torch._inductor.codegen.wrapper_fxir import FxConverter
    from torch._inductor.debug import DebugContext
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cuda", 0)
    fake_mode = FakeTensorMode()
    with fake_mode:
        fakes = [torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device) for t in inputs]
    module = torch.fx.GraphModule(torch.nn.Module(), sub)
    configs: dict = {}
    real_definition = FxConverter._generate_kernel_definition

    def definition(self, line):  # the config Inductor picked per kernel (its launch options)
        real_definition(self, line)
        tuner = self.kernels[line.kernel_name].tuner
        configs[tuner.fn] = tuner.compile_results[0].config

    with contextlib.ExitStack() as stack:
        stack.enter_context(_sm90_without_cuda())
        stack.enter_context(inductor_config.patch(_inductor_config()))
        stack.enter_context(_patched(FxConverter, "_generate_kernel_definition", definition))
        traced = make_fx(module, tracing_mode="fake", decomposition_table=select_decomp_table())(*fakes)
        stack.enter_context(V.set_fake_mode(fake_mode))
        stack.enter_context(DebugContext())
        graph = GraphLowering(traced, example_inputs=fakes, shape_env=fake_mode.shape_env, fx_wrapper=True,
                              is_inference=True)
        with V.set_graph_handler(graph):
            graph.run(*fakes)
            out = graph.compile_to_module().gm
    return _normalize(out.graph, configs)


_VIEWS = {torch.as_strided: torch.ops.aten.as_strided.default}


def _normalize(graph: torch.fx.Graph, configs: dict) -> Lowered:
    """Inductor's FX graph in the ATen form Trident's passes read: allocations and views as ATen
    ops, each launch with its num_warps/num_stages; anything else is refused."""
    new = torch.fx.Graph()
    env: dict = {}
    kernels = 0
    for node in graph.nodes:
        if node.op == "placeholder":
            env[node] = new.placeholder(node.name)
        elif node.op == "output":
            new.output(torch.fx.map_arg(node.args[0], lambda n: env[n]))
        elif node.op == "call_function" and node.target in (torch.empty_strided, torch.ops.aten.empty_strided.default):
            size, stride = node.args[:2]
            env[node] = new.call_function(torch.ops.aten.empty_strided.default, (list(size), list(stride)),
                                          {"dtype": node.kwargs["dtype"], "device": node.kwargs.get("device")})
        elif node.op == "call_function" and node.target in _VIEWS:
            env[node] = new.call_function(_VIEWS[node.target], torch.fx.map_arg(node.args, lambda n: env[n]))
        elif node.op == "call_function" and node.target is triton_kernel_wrapper_mutation:
            kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
            config = configs.get(kernel)
            if config is None:
                raise GlueLoweringError(f"no launch config recorded for kernel {getattr(kernel, '__name__', kernel)}")
            kwargs = dict(torch.fx.map_arg(node.kwargs["kwargs"], lambda n: env[n]))
            kwargs.update(num_warps=config.num_warps, num_stages=config.num_stages)
            launch = new.call_function(triton_kernel_wrapper_mutation, (), {
                "kernel_idx": node.kwargs["kernel_idx"],
                "constant_args_idx": node.kwargs["constant_args_idx"],
                "grid": [tuple(g) for g in node.kwargs["grid"]],
                "tma_descriptor_metadata": {},
                "kwargs": kwargs,
            })
            # The side table's indices do not outlive torch._dynamo.reset(): a cached lowering
            # registers its kernel and constants again where it is inlined (`register`).
            launch.meta["glue_kernel"] = kernel
            launch.meta["glue_constants"] = dict(kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"]))
            env[node] = launch
            kernels += 1
        else:
            raise GlueLoweringError(f"Inductor's graph calls {node.op} {node.target}, not only its own kernels")
    return Lowered(new, kernels)


def register(launch: torch.fx.Node) -> None:
    """Point a launch copied from a Lowered graph at its kernel and constants in the side table
    as it is now."""
    launch.kwargs = {
        **launch.kwargs,
        "kernel_idx": kernel_side_table.add_kernel(launch.meta["glue_kernel"]),
        "constant_args_idx": kernel_side_table.add_constant_args(launch.meta["glue_constants"]),
    }


def clear_cache() -> None:
    with triton_state.exclusive():
        _CACHE.clear()

