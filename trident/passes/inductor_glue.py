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
- with TRIDENT_PDL for the inputs' device, Inductor's own `triton.enable_pdl`: its kernels wait
  for the kernel before them and release the next early (Note [Programmatic dependent launch];
  the lowering is cached apart from the one without);
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
import hashlib
import linecache
import sys
import types
from dataclasses import dataclass

import torch
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table, triton_kernel_wrapper_mutation
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from .. import disk_cache, logs, pdl, triton_state

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


def _inductor_config(programmatic: bool = False) -> dict:
    """Inductor's settings for a glue lowering; `programmatic`: its kernels wait for the kernel
    before them and release the next early (Inductor's own `triton.enable_pdl`, Note
    [Programmatic dependent launch])."""
    extra = {"triton.enable_pdl": True} if programmatic and hasattr(_inductor_triton_config(), "enable_pdl") else {}
    return {**extra,
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


def _inductor_triton_config():
    from torch._inductor import config as inductor_config

    return inductor_config.triton


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
    devices = {t.device for t in inputs}
    # Inductor's own PDL only where user kernels keep ordinary ordering: else its kernels are
    # launched as twins that wait first (Note [A user kernel made to wait])
    programmatic = len(devices) == 1 and pdl.wanted(device := devices.pop()) and not pdl.twins_wanted(device)
    key = (_structure_key(sub, inputs), programmatic)
    # Inductor keeps global state (V.graph, its config), make_fx too (FX's patcher and tracing
    # flag), and Inductor runs Triton's frontend to compile its kernels: the lowering holds the
    # lock every Trident capture and Triton frontend run holds (Note [Triton's interpreter state]).
    with triton_state.exclusive():
        hit = _CACHE.get(key)
        if hit is not None:
            return hit
        config = _inductor_config(programmatic)
        disk_key = disk_cache.key_of("inductor-glue", repr(key), repr(sorted(config.items())), _device_id(),
                                     disk_cache.source_digest(sys.modules[__name__]))
        lowered = _from_data(disk_cache.load("inductor-glue", disk_key, lambda v: isinstance(v, dict)))
        if lowered is None:
            try:
                lowered = _lower(sub, inputs, config)
            except GlueLoweringError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure of Inductor leaves the glue as it is
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise GlueLoweringError(f"{type(e).__name__}: {first}") from e
            data = _to_data(lowered)
            if data is not None:
                disk_cache.store("inductor-glue", disk_key, data)
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = lowered
        return lowered


def _lower(sub: torch.fx.Graph, inputs: list, config: dict) -> Lowered:
    from torch._inductor import config as inductor_config
    from torch._inductor.codegen.wrapper_fxir import FxConverter
    from torch._inductor.debug import DebugContext
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

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
        stack.enter_context(inductor_config.patch(config))
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


def _device_id() -> str:
    """What Inductor's code depends on besides the graph: the device it generates for."""
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
    return "sm_90 stand-in (no CUDA)"


# Note [Lowerings on disk]: with TRIDENT_CACHE_DIR a lowering is kept as JSON beside the plans
# (`inductor-glue` entries of Note [Cached analyses]: the graph's nodes and, per kernel, the
# Python module Inductor wrote for it), so a later process restores its kernels without
# importing Inductor's compiler or generating code again (~1.5 s of a warm start). A module is
# executed when restored: like a plan's host library, an entry is read only from folders private
# to this user (docs/persistent_cache.md). Its source is registered with linecache under a name
# of its own, where Triton reads a kernel's source.
_SCALARS = (bool, int, float, str, type(None))


def _encode(value, index: dict):
    if isinstance(value, torch.fx.Node):
        return {"n": index[value]}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, index) for v in value]
        return _UNSUPPORTED if any(i is _UNSUPPORTED for i in items) else {"t" if isinstance(value, tuple) else "l": items}
    if isinstance(value, dict):
        pairs = [[k, _encode(v, index)] for k, v in value.items()]
        ok = all(isinstance(k, str) and v is not _UNSUPPORTED for k, v in pairs)
        return {"d": pairs} if ok else _UNSUPPORTED
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, _SCALARS):
        return {"v": value}
    return _UNSUPPORTED


_UNSUPPORTED = object()


def _decode(value, nodes: list):
    if "n" in value:
        return nodes[value["n"]]
    if "t" in value:
        return tuple(_decode(v, nodes) for v in value["t"])
    if "l" in value:
        return [_decode(v, nodes) for v in value["l"]]
    if "d" in value:
        return {k: _decode(v, nodes) for k, v in value["d"]}
    if "dtype" in value:
        dtype = getattr(torch, value["dtype"])
        if not isinstance(dtype, torch.dtype):
            raise ValueError(value)
        return dtype
    return value["v"]


def _to_data(lowered: Lowered) -> "dict | None":
    """A JSON form of `lowered` (None when something in it has none)."""
    index: dict = {}
    nodes, modules = [], {}
    for i, node in enumerate(lowered.graph.nodes):
        index[node] = i
        entry = {"op": node.op, "target": None if node.op in ("placeholder", "output") else _TARGETS.get(node.target)}
        if node.op != "placeholder" and node.op != "output" and entry["target"] is None:
            return None
        entry["args"] = _encode(tuple(node.args), index)
        entry["kwargs"] = _encode({k: v for k, v in node.kwargs.items() if k not in ("kernel_idx", "constant_args_idx")},
                                  index)
        kernel = node.meta.get("glue_kernel")
        if kernel is not None:
            path = kernel.fn.__code__.co_filename
            try:
                source = "".join(linecache.getlines(path)) or open(path, encoding="utf-8").read()
            except (OSError, UnicodeDecodeError):
                return None
            digest = hashlib.sha256(source.encode()).hexdigest()
            modules[digest] = source
            entry["kernel"] = [digest, kernel.__name__, kernel.fn.__module__]
            entry["constants"] = _encode(dict(node.meta["glue_constants"]), index)
        if any(entry.get(k) is _UNSUPPORTED for k in ("args", "kwargs", "constants")):
            return None
        nodes.append(entry)
    return {"nodes": nodes, "modules": modules, "kernels": lowered.kernels}


_TARGETS = {
    torch.ops.aten.empty_strided.default: "empty_strided",
    torch.ops.aten.as_strided.default: "as_strided",
    triton_kernel_wrapper_mutation: "launch",
}
_BY_NAME = {v: k for k, v in _TARGETS.items()}
_MODULES: dict = {}  # digest -> the restored module (one per process)


def _kernel_from(source: str, digest: str, name: str, module_name: str):
    """The kernel `name` of the cached module: executed under the name Inductor's loader gave it
    (a kernel's stable key hashes its function's module, Note [Stable keys]: a restored kernel
    must key as the freshly lowered one, or the plans its regions wrote are not found)."""
    module = _MODULES.get(digest)
    if module is None:
        if hashlib.sha256(source.encode()).hexdigest() != digest:
            raise ValueError("a kernel module is not the one its entry names")
        filename = f"<trident inductor-glue {digest[:24]}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        module = types.ModuleType(module_name)
        module.__file__ = filename
        with _sm90_without_cuda():  # the module sets Triton's driver to the GPU at import
            exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - a private cache entry
        _MODULES[digest] = module
    obj = getattr(module, name)
    return getattr(obj, "fn", obj)  # Inductor's CachingAutotuner around the @triton.jit function


def _from_data(data) -> "Lowered | None":
    """The Lowered a `_to_data` form describes; None when there is none or it does not read back."""
    if data is None:
        return None
    try:
        graph = torch.fx.Graph()
        nodes: list = []
        for entry in data["nodes"]:
            args = _decode(entry["args"], nodes)
            kwargs = _decode(entry["kwargs"], nodes)
            if entry["op"] == "placeholder":
                node = graph.placeholder(args[0] if args else f"in{len(nodes)}")
            elif entry["op"] == "output":
                node = graph.output(args[0])
            else:
                target = _BY_NAME[entry["target"]]
                node = graph.call_function(target, args, kwargs)
                if "kernel" in entry:
                    digest, name, module_name = entry["kernel"]
                    node.meta["glue_kernel"] = _kernel_from(data["modules"][digest], digest, name, module_name)
                    node.meta["glue_constants"] = _decode(entry["constants"], nodes)
                    register(node)
            nodes.append(node)
        return Lowered(graph, int(data["kernels"]))
    except Exception as e:  # noqa: BLE001 - an entry that does not read back is lowered again
        logs.lowering.debug("a cached glue lowering did not read back: %s: %s", type(e).__name__, e)
        return None


def clear_cache() -> None:
    """Forget this process's lowerings (the cache dir's stay)."""
    with triton_state.exclusive():
        _CACHE.clear()

