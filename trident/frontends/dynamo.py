"""torch.compile(model_or_fn, backend="trident"): Dynamo captures, Trident optimizes each graph.

Dynamo hands the backend one FX graph per frame piece (graph breaks give several), with user
Triton launches as `triton_kernel_wrapper_mutation` nodes and, with torch's default of inlining
nn.Modules, parameters and buffers as graph inputs. The backend returns a callable per graph
that, on the first call with a given input signature, traces the graph to ATen + Triton launches
with `trident.capture` (make_fx over the Dynamo graph) and `trident.optimize`s it; later calls
with that signature go straight into the optimized graph (native guards only).

Note [Dynamo graphs and static capture]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A graph Dynamo traced with static sizes gets one static capture. A graph with symbolic sizes
(after a recompile for a new size, or with dynamic=True) gets one symbolic capture where its int
inputs are sizes of its tensors (Note [Dynamic Dynamo graphs]); otherwise, and for the calls such
a capture cannot serve, its arguments at run time are concrete tensors and ints, so a compiled
graph is a small cache keyed by the signature of its arguments (`compile.signature`: per tensor dtype, device, sizes and
strides; every Python scalar's value), each entry one static capture: a new size is a new capture, never an error.
The cache is bounded (TRIDENT_DYNAMO_CAPTURES, 8 per graph); past it calls run Dynamo's graph
eagerly, and explain() says so. A graph Trident cannot capture or optimize (a TridentError:
something it does not support) runs eagerly too, for that signature, with a warning on the
`trident.misses` logger and the reason in explain(). Trident is inference only (`trident.scm` has no derivative):
a call with grad enabled and an input that requires grad runs Dynamo's graph eagerly, so
autograd sees what it would without the backend.

Note [Disabled functions under backend="trident"]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Dynamo does not trace a `torch.compiler.disable`d function: it breaks the graph before the call,
runs it eagerly and resumes in a new frame. Libraries disable functions Dynamo cannot trace
(Liger-Kernel 0.8.5 disables its op dispatcher, so each rotary, RMSNorm and SwiGLU call of an
HF model breaks the graph: 48 graphs and ~16 µs of Python each on a 16-layer model). Trident does
not need Dynamo to trace them: it captures each graph with make_fx, which runs Python code and
records its ATen ops and Triton launches, as trident.compile does for the whole program. So in a
frame Dynamo compiles for the "trident" backend (and only there), a call of a function that
carries `_torchdynamo_disable` and is defined in a module TRIDENT_DYNAMO_TRACE_DISABLED names
(prefixes; default `liger_kernel`; `*` for any module outside torch) stays in the graph as one opaque call
(Dynamo's allow_in_graph treatment); Dynamo runs it once on fake tensors for its result's
metadata, with `kernel[grid]` launches routed through wrap_triton as in `trident.capture`, and
Trident's capture traces through it. Consequences, as for trident.compile: the function's Python
(Liger reads its implementation choice from the environment) runs at capture time, not per call,
and nothing in it is guarded. Where Dynamo cannot keep the call (its fake run fails, its result
is not tensors) the graph breaks as without Trident. The rule is opt-in per library because a
function is often disabled for the Python state it keeps: Dynamo's fake run executes it on fake
tensors, so a memo it fills would hold a fake tensor afterwards. Liger's dispatcher keeps none;
add other libraries' prefixes only where that holds. TRIDENT_DYNAMO_TRACE_DISABLED='' turns the
rule off. The rule hooks Dynamo's `trace_rules.is_callable_allowed` and
`TorchInGraphFunctionVariable.call_function`; where a torch build lacks them it is not installed
(the graph breaks, as before), and `explain` counts graph breaks either way.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional

import torch

from .. import knobs, logs
from ..errors import GuardError, TridentError
from .compile import signature


class CompiledGraph:
    """The callable Dynamo gets for one graph (Note [Dynamo graphs and static capture])."""

    def __init__(self, gm: torch.fx.GraphModule, frames: frozenset = frozenset(), module=None, static_key=None):
        self.gm = gm
        self.frames = frames  # (file, name, first line) of the Python frames on the stack when Dynamo compiled it
        self._module = weakref.ref(module) if module is not None else None  # the `self` of its frame
        # A graph Dynamo traced with static sizes is called only with the example's signature
        # (Dynamo's guards check every tensor input's dtype, device, sizes and strides, and
        # specialize Python scalars): its one capture is taken with no per-call Python walk.
        self._static_key = static_key
        self._static: Optional[torch.fx.GraphModule] = None
        self.captures: dict[tuple, torch.fx.GraphModule] = {}
        self.eager_calls = 0
        self.eager_reason: Optional[str] = None
        self._refused: dict[tuple, str] = {}  # signatures Trident could not capture/optimize: run eagerly
        self._lock = threading.Lock()
        # Note [Dynamic Dynamo graphs]: for a graph with symbolic sizes whose int inputs are all
        # sizes or strides of its tensor inputs, one symbolic capture (over the tensors alone)
        self._size_inputs = _size_inputs(gm) if static_key is None else None
        self._symbolic: Optional[torch.fx.GraphModule] = None
        symbolic = self._size_inputs is not None and knobs.dynamo_symbolic()  # read once, not per call
        self._symbolic_state = "untried" if symbolic else "impossible"
        self._tensor_positions = (
            [i for i in range(len(_placeholders(gm))) if i not in self._size_inputs] if symbolic else []
        )

    def __call__(self, *args):
        opt = self._static
        if opt is not None and not torch.is_grad_enabled():
            return opt(*args)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return self._eager(args, "grad is enabled and an input requires grad (Trident is inference only)")
        if self._symbolic_state != "impossible":
            out = self._call_symbolic(args)
            if out is not None:
                return out
        key = signature(args) if self._static_key is None else self._static_key
        opt = self.captures.get(key)
        if opt is None:
            refused = self._refused.get(key)
            if refused is not None:
                return self._eager(args, refused)
            with self._lock:
                opt = self.captures.get(key)
                if opt is None:
                    if len(self.captures) >= knobs.dynamo_captures():
                        return self._eager(
                            args, f"more than TRIDENT_DYNAMO_CAPTURES={knobs.dynamo_captures()} input signatures"
                        )
                    from .. import optimize  # the passes stage: after capture in the pipeline
                    from ..capture.trace import capture

                    try:
                        opt = optimize(capture(self.gm, *args))
                    except TridentError as e:
                        # Dynamo's graph still runs: eagerly, for this signature from now on
                        reason = f"Trident cannot optimize this graph: {type(e).__name__}: {str(e).splitlines()[0]}"
                        self._refused[key] = reason
                        logs.misses.warning("torch.compile(backend='trident'): %s; it runs eagerly", reason)
                        return self._eager(args, reason)
                    self.captures[key] = opt
                    if self._static_key is not None:
                        self._static = opt
        return opt(*args)

    def _eager(self, args, reason: str):
        self.eager_calls += 1
        self.eager_reason = reason
        return self.gm(*args)

    def _call_symbolic(self, args):
        """Note [Dynamic Dynamo graphs]: the call through the graph's symbolic capture (made on
        its first call), or None when this call is to take the static path."""
        opt = self._symbolic
        positions = self._tensor_positions
        if opt is None:
            with self._lock:
                if self._symbolic_state == "untried":
                    self._symbolic_state = "failed"
                    try:
                        self._symbolic = opt = self._capture_symbolic(args)
                        self._symbolic_state = "ready"
                    except TridentError as e:
                        logs.misses.info("torch.compile(backend='trident'): no symbolic capture (%s: %s); "
                                         "capturing per signature", type(e).__name__, str(e).splitlines()[0])
                opt = self._symbolic
            if opt is None:
                return None
        try:
            return opt(*[args[i] for i in positions])
        except GuardError as e:
            # sizes the capture cannot serve, raised before anything ran: a static capture
            if not (e.before_effects or e.region == opt.meta.get("trident_retry_region")):
                raise
            return None

    def _capture_symbolic(self, args):
        from .. import optimize
        from ..capture.trace import capture

        size_inputs = self._size_inputs
        positions = self._tensor_positions
        names = [n.name for n in _placeholders(self.gm)]
        gm = self.gm

        def flat(*tensors):
            full = [None] * len(names)
            for i, t in zip(positions, tensors):
                full[i] = t
            for i, (j, prop, d) in size_inputs.items():  # each size read from its tensor in the trace
                full[i] = full[j].size(d) if prop == "size" else full[j].stride(d) if prop == "stride" else (
                    full[j].storage_offset())
            return gm(*full)

        flat.__name__ = "forward"
        for i in positions:
            if not isinstance(args[i], torch.Tensor):
                raise TridentError(f"input {names[i]} is a {type(args[i]).__name__}, not a tensor or a size")
        opt = optimize(capture(flat, *[args[i] for i in positions], input_names=[names[i] for i in positions],
                               dynamic=True))
        self.captures[("symbolic",)] = opt
        return opt


# Note [Dynamic Dynamo graphs]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# After a recompile for a new size (automatic dynamic shapes) or with dynamic=True, Dynamo hands
# over a graph with symbolic sizes whose int inputs are sizes of its tensor inputs (`s0` for
# `x.size(0)`: each placeholder's GraphArg names its source). Such a graph gets one symbolic
# capture (Note [Symbolic sizes]), traced over its tensor inputs alone with each int read from
# its tensor inside the trace, so the host program computes it from the input facts; calls pass
# the tensors only (Dynamo's guards already tie the ints to them). A graph with other int inputs
# (a Python int made dynamic), or whose symbolic capture fails or raises GuardError for a call
# before running anything (sizes its shape guards exclude), takes the static path per signature.


def _placeholders(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _size_inputs(gm) -> "Optional[dict[int, tuple]]":
    """{placeholder index: (tensor placeholder index, "size"|"stride"|"offset", dim)} for each
    int input of a symbolic Dynamo graph; None when the graph is not symbolic or an int input is
    not a tensor property of another input."""
    placeholders = _placeholders(gm)
    sources = {}
    for i, n in enumerate(placeholders):
        arg = n.meta.get("grapharg")
        if arg is not None and getattr(arg, "is_tensor", False):
            sources[arg.source] = i
    out = {}
    symbolic = False
    for i, n in enumerate(placeholders):
        val = n.meta.get("example_value")
        if isinstance(val, torch.Tensor):
            symbolic |= any(isinstance(d, torch.SymInt) for d in (*val.shape, *val.stride()))
            continue
        if not isinstance(val, torch.SymInt):
            return None
        arg = n.meta.get("grapharg")
        source = getattr(arg, "source", None)
        base = getattr(source, "base", None)
        prop = getattr(getattr(source, "prop", None), "name", "")
        if base not in sources or prop not in ("SIZE", "STRIDE", "STORAGE_OFFSET"):
            return None
        out[i] = (sources[base], {"SIZE": "size", "STRIDE": "stride"}.get(prop, "offset"), getattr(source, "idx", 0))
        symbolic = True
    return out if symbolic else None


_COMPILED: "list[CompiledGraph]" = []  # every graph the backend compiled, for explain/cache_info


# Note [Backend arguments]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# torch.compile(fn, backend="trident", mode=..., options=..., dynamic=..., fullgraph=...) and
# HF's CompileConfig(backend="trident") (which passes mode="reduce-overhead") hand the backend
# `mode` and `options`; Dynamo itself consumes `dynamic` (how it marks sizes symbolic: the graphs
# come symbolic or static, Note [Dynamic Dynamo graphs]) and `fullgraph` (whether a graph break
# raises). Trident's own behaviour per mode: "default" and "reduce-overhead" are the same --
# graph replay is Trident's default wherever it pays (Note [Graph replay]); "max-autotune" is
# taken as "default" (the Triton kernels are the user's, tuned by their own @triton.autotune);
# "max-autotune-no-cudagraphs" is taken as "default" too, and logged, since graph replay is a
# process-wide knob (TRIDENT_GRAPHS) and stays as set. `options` are Inductor's; Trident
# uses none of them and logs the names it got. Any other mode is an error.
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_told: set = set()


def _take_backend_arguments(mode: Optional[str], options: Optional[dict], unknown: dict) -> None:
    if unknown:
        raise TypeError(
            f"torch.compile(backend='trident') got unexpected backend argument(s) {sorted(unknown)}; "
            "the trident backend takes mode= and options= (dynamic= and fullgraph= are Dynamo's)"
        )
    if mode is not None and mode not in MODES:
        raise TridentError(
            f"torch.compile(backend='trident', mode={mode!r}): expected one of {', '.join(map(repr, MODES))}"
        )
    if mode == "max-autotune-no-cudagraphs" and mode not in _told:
        _told.add(mode)
        logs.misses.info("torch.compile(backend='trident', mode=%r): graph replay follows TRIDENT_GRAPHS (%r)",
                         mode, knobs.graphs())
    if options and "options" not in _told:
        _told.add("options")
        logs.misses.info("torch.compile(backend='trident'): Inductor options %s are not used by Trident",
                         sorted(options))


def trident_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], *, mode: Optional[str] = None,
                    options: Optional[dict] = None, **unknown) -> Callable:
    """The Dynamo backend registered as "trident" (on import, and as a torch_dynamo_backends
    entry point of the trident-scm distribution); mode and options: Note [Backend arguments]."""
    _take_backend_arguments(mode, options, unknown)
    compiled = CompiledGraph(gm, _stack_frames(), _frame_module(), _static_key(example_inputs))
    _COMPILED.append(compiled)
    return compiled


def _static_key(example_inputs) -> Optional[tuple]:
    """The one signature of a graph Dynamo traced with static sizes (every input's sizes and
    strides are ints, no symbolic scalar input); None for a dynamic graph."""
    sym = (torch.SymInt, torch.SymFloat, torch.SymBool)
    for a in example_inputs:
        if isinstance(a, sym):
            return None
        if isinstance(a, torch.Tensor) and any(isinstance(d, sym) for d in (*a.shape, *a.stride())):
            return None
    try:
        return ("static", signature(example_inputs))
    except Exception:
        return None


def _frame_module():
    """The nn.Module whose call Dynamo compiles (torch.compile(module) compiles its __call__)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        local = dict(InstructionTranslator.current_tx().f_locals)
    except Exception:
        return None
    # `self` of a forward; OptimizedModule's wrapper frame holds the module's bound __call__
    for value in [local.get("self")] + list(local.values()):
        value = getattr(value, "__self__", value)
        if isinstance(value, torch.nn.Module):
            return value
    return None


def _stack_frames() -> frozenset:
    """(file, function name, first line) of every frame on the stack: the function torch.compile wrapped
    runs (Dynamo's transformed code keeps the name) while Dynamo compiles any frame it reaches,
    including functions it calls that got frames of their own after a graph break."""
    import sys

    out = set()
    try:  # the frame being compiled is not running yet: Dynamo's translator holds its code
        from torch._dynamo.symbolic_convert import InstructionTranslator

        code = InstructionTranslator.current_tx().f_code
        out.add((code.co_filename, code.co_name, code.co_firstlineno))
    except Exception:
        pass
    f = sys._getframe(1)
    while f is not None:
        out.add((f.f_code.co_filename, f.f_code.co_name, f.f_code.co_firstlineno))
        f = f.f_back
    return frozenset(out)


def graphs_of(compiled: Any) -> "Optional[list[CompiledGraph]]":
    """The graphs the backend compiled for a torch.compile result (a function or an
    OptimizedModule); None when `compiled` is not one. A graph belongs to a function when its frame,
    or one of the frames below which Dynamo compiled it, is that function or one of the resume
    functions Dynamo made of it after a graph break; to a module when the `self` of its frame is
    that module."""
    module = getattr(compiled, "_orig_mod", None)  # an OptimizedModule
    if isinstance(module, torch.nn.Module):
        fn = module.forward
    else:
        module = None
        fn = getattr(compiled, "_torchdynamo_orig_callable", None)
        if fn is None:
            return None
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    resume = f"torch_dynamo_resume_in_{code.co_name}_at_"
    lines = [line for _, _, line in code.co_lines() if line is not None]
    last = max(lines, default=code.co_firstlineno)

    def ours(file, name, first) -> bool:
        if file != code.co_filename:
            return False
        if name == code.co_name:
            return first == code.co_firstlineno
        at = name[len(resume):] if name.startswith(resume) else ""
        return at.isdigit() and code.co_firstlineno <= int(at) <= last

    if module is not None:  # its forward's code is shared with every instance: match the module
        return [g for g in compiled_graphs() if g._module is not None and g._module() is module]
    return [g for g in compiled_graphs() if any(ours(*frame) for frame in g.frames)]


def compiled_graphs() -> "list[CompiledGraph]":
    return list(_COMPILED)


def _reset() -> None:
    """torch._dynamo.reset() calls this (as `trident_backend.reset`): Dynamo dropped its compiled
    frames, so the graphs compiled for them are dropped too (their regions, arenas and graphs can
    be freed; explain() no longer lists them)."""
    _COMPILED.clear()


trident_backend.reset = _reset  # type: ignore[attr-defined]


def _compiling_for_trident() -> bool:
    """Whether the frame Dynamo is tracing on this thread will be handed to trident_backend
    (through torch.compile(backend="trident"), which wraps it, or passed directly)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        fn = tx.output.compiler_fn
    except Exception:
        return False
    for _ in range(4):  # WrapBackendDebug -> _TorchCompileWrapper -> the backend
        if fn is trident_backend:
            return True
        fn = getattr(fn, "_torchdynamo_orig_backend", None) or getattr(fn, "compiler_fn", None)
        if fn is None:
            return False
    return False


def _traceable_disabled(obj) -> bool:
    import inspect

    try:
        if not inspect.isfunction(obj) or not inspect.getattr_static(obj, "_torchdynamo_disable", False):
            return False
    except Exception:
        return False
    inner = obj
    while getattr(inner, "_torchdynamo_orig_callable", None) is not None:
        inner = inner._torchdynamo_orig_callable
    module = getattr(inner, "__module__", "") or ""
    if module == "torch" or module.startswith("torch."):
        return False
    return any(p == "*" or module == p or module.startswith(p + ".") for p in knobs.dynamo_trace_disabled())


_RULE_INSTALLED = [False]


def install_disabled_function_rule() -> bool:
    """Note [Disabled functions under backend="trident"]. Idempotent; False where this torch
    build lacks the hooks."""
    if _RULE_INSTALLED[0]:
        return True
    try:
        from torch._dynamo import trace_rules
        from torch._dynamo.exc import Unsupported
        from torch._dynamo.variables.torch import TorchInGraphFunctionVariable
    except Exception:
        return False
    from torch._dynamo import exc as dynamo_exc

    passthrough = tuple(
        getattr(dynamo_exc, name)
        for name in ("Unsupported", "RestartAnalysis", "ObservedException", "SkipFrame", "UserError")
        if isinstance(getattr(dynamo_exc, name, None), type)
    )
    original_allowed = getattr(trace_rules, "is_callable_allowed", None)
    original_call = getattr(TorchInGraphFunctionVariable, "call_function", None)
    if original_allowed is None or original_call is None:
        return False

    def is_callable_allowed(obj):
        if original_allowed(obj):
            return True
        return _traceable_disabled(obj) and _compiling_for_trident()

    def call_function(self, tx, *args, **kwargs):
        fn = getattr(self, "value", None)
        if not (_traceable_disabled(fn) and not original_allowed(fn)):
            return original_call(self, tx, *args, **kwargs)
        from .. import triton_state
        from ..capture.trace import _launches_as_hops

        try:
            with triton_state.exclusive(), _launches_as_hops([]):
                return original_call(self, tx, *args, **kwargs)
        except passthrough:  # graph breaks, restarts, user exceptions: Dynamo's own control flow
            raise
        except Exception as e:  # Dynamo cannot keep the call: break the graph as without Trident
            raise Unsupported(
                f"Trident could not keep the torch.compiler.disable()d function {fn.__qualname__} in the "
                f"graph ({type(e).__name__}: {e}); the graph breaks there as without Trident"
            ) from e

    trace_rules.is_callable_allowed = is_callable_allowed
    TorchInGraphFunctionVariable.call_function = call_function
    _RULE_INSTALLED[0] = True
    return True


def register() -> None:
    """Registers the backend as "trident" at `import trident`, unless torch is loading it from the
    entry point right now (trident_scm_backend.py: it registers the same function itself) or
    has already."""
    import sys

    from torch._dynamo.backends.registry import register_backend

    install_disabled_function_rule()
    entry = sys.modules.get("trident_scm_backend")
    if entry is not None and getattr(entry, "LOADING", False):
        return
    try:
        register_backend(trident_backend, name="trident")
    except AssertionError:  # "duplicate name": registered from the entry point already
        pass
