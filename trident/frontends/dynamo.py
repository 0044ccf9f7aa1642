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
The cache is the one both doors keep (Note [One capture cache]: TRIDENT_CAPTURES, 32 per graph); past
it calls of new signatures run Dynamo's graph eagerly, and explain() says so. A graph Trident cannot capture or optimize (a TridentError:
something it does not support) runs eagerly too, for that signature, with a warning on the
`trident.misses` logger and the reason in explain(). Trident is inference only (`trident.scm` has no derivative):
a call with grad enabled and an input that requires grad runs Dynamo's graph eagerly, so
autograd sees what it would without the backend.

Note [Disabled functions under backend="trident"]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Dynamo does not trace a `torch.compiler.disable`d function: it breaks the graph before the call,
runs it eagerly and resumes in a new frame. Libraries disable functions Dynamo cannot trace
(Liger-Kernel 0.8.5 disables its op dispatcher, so each rotary, RMSNorm and SwiGLU call of an
HF model breaks the graph: 48 graphs and ~16 µs of Python each on a 16-layer model). Trident does
not need Dynamo to trace them: it captures each graph with make_fx, which runs Python code and
records its ATen ops and Triton launches, as trident.compile does for the whole program. So in a
frame Dynamo compiles for the "trident" backend (and only there), a call of a disabled function
defined outside torch and Trident may stay in the graph as one opaque call (Dynamo's
allow_in_graph treatment): Dynamo runs it once on fake tensors for its result's metadata, with
`kernel[grid]` launches routed through wrap_triton as in `trident.capture`, and Trident's capture
traces through it. As for trident.compile, the function's Python then runs at compile and capture
time, not per call, and nothing in it is guarded.

Whether it stays is checked, because a function is often disabled for the Python state it
keeps, and Dynamo's fake run executes it at compile time: a memo it fills would hold a fake
tensor afterwards, a counter it bumps would count compile-time runs only. Before each such run
`_StateSnapshot` takes the Python state the function can reach: its closure cells and default
values; the globals its code names, and those of the functions of its module it names (their
code read too, transitively, at most 64); `self` of a disabled bound method; from there 3
levels down through dicts, lists, sets, tuples and the attributes of library objects (of a
module, class or function only the attribute names the code uses), each container as a shallow
copy. After the run everything is compared by identity. Any change -- a name, attribute, key or
closure variable rebound, added or removed, a list grown -- makes the function stateful: each
change is put back, the call raises Dynamo's `Unsupported` naming the function and what it
wrote (`mylib.ops.dispatch writes mylib.ops._CACHE[(8, 'f32')] (a new memo entry: a fake
tensor): it stays a graph break ...`), so the graph breaks there exactly as without Trident, and
the verdict stays for the process (the function does not change; `is_callable_allowed` answers
False for it from then on, and later frames get Dynamo's own break). One change is allowed and
kept: new entries of a dict or set whose keys and values are plain data (numbers, strings,
dtypes, devices, tuples and lists of them), a memo eager's first call fills alike (Liger's
`_AVAILABLE_MEMO` of implementation names, a warn-once set). A pure verdict is not cached: each
Dynamo-time call is checked, since a later call may take a branch that writes (it costs compile
time, never a run). A kept call must also return tensors or tuples/lists of them (Nones among them), and its fake
run must succeed; otherwise the graph breaks as without Trident, the run's changes put back.
Arguments are out of the run's reach: Dynamo passes it tensors, constants and fx's immutable
copies of lists and dicts, and breaks the graph for other objects.

What the check cannot see: state kept in C (an lru_cache's entries, a C extension's tables),
files, environment variables read (Liger reads LIGER_KERNEL_IMPL: at capture time, not per
call), objects reached only through other modules' functions, getattr by a computed name or past
the bounds, the contents of tensors (an in-place write to a global tensor), and the inside of
torch, Triton, Trident and standard-library objects (their own caches: logging's, kernel tables).

TRIDENT_DYNAMO_TRACE_DISABLED overrides the check per module (the longest matching prefix
decides; '*' names every module): 'auto' (default) checks every module outside torch and
Trident; '+prefix' keeps the module's disabled functions unchecked (the user vouches that they
keep no state a compile-time run would corrupt); '-prefix' always breaks; a bare prefix is '+'
(what 'liger_kernel' and '*' meant when they named the only modules traced; the other modules
are now checked, add '-*' for the old meaning); an off spelling ('', 0, none) turns the rule off:
graph breaks as plain Dynamo. The rule hooks Dynamo's `trace_rules.is_callable_allowed` and
`TorchInGraphFunctionVariable.call_function`; where a torch build lacks them it is not installed
(the graph breaks, as before), and `explain` counts graph breaks either way.
"""

from __future__ import annotations

import collections
import functools
import inspect
import itertools
import os
import sys
import types
import weakref
from typing import Any, Callable, Iterator, Optional

import torch
from torch._dynamo import exc as dynamo_exc
from torch._dynamo.backends.registry import register_backend
from torch._prims_common import make_contiguous_strides_for

try:  # torch-internal: a build without it loses only the disabled-function rule's list case
    from torch._dynamo.variables.lists import BaseListVariable
except ImportError:  # pragma: no cover
    BaseListVariable = ()

from .. import knobs, logs, triton_state
from ..capture.python_values import DEPTH, ITEMS, keeps_state
from ..capture.python_values import foreign as _foreign
from ..capture.python_values import holds_tensor as _holds_tensor
from ..capture.python_values import plain as _plain
from ..capture.python_values import short as _short
from ..capture.trace import _launches_as_hops, capture
from ..errors import GuardError, TridentError
from ..optimize import optimize
from .cache import CaptureCache, ServedByCache, retry_static
from .compile import signature
from .state import carrier


class CompiledGraph(ServedByCache):
    """The callable Dynamo gets for one graph (Note [Dynamo graphs and static capture])."""

    def __init__(self, gm: torch.fx.GraphModule, frames: frozenset = frozenset(), module=None, static_key=None,
                 where: str = ""):
        self.gm = gm
        self.frames = frames  # (file, name, first line) of the Python frames on the stack when Dynamo compiled it
        self._module = weakref.ref(module) if module is not None else None  # the `self` of its frame
        # A graph Dynamo traced with static sizes is called only with the example's signature
        # (Dynamo's guards check every tensor input's dtype, device, sizes and strides, and
        # specialize Python scalars): its one capture is taken with no per-call Python walk.
        self._static_key = static_key
        self._static: Optional[torch.fx.GraphModule] = None
        # Note [One capture cache]; `where` (the frame Dynamo compiled) tells one graph's messages from another's
        self.cache = CaptureCache(f"torch.compile(backend='trident'){where}")
        # Note [Dynamic Dynamo graphs]: for a graph with symbolic sizes whose int inputs are all
        # sizes or strides of its tensor inputs, one symbolic capture (over the tensors alone)
        self._size_inputs = _size_inputs(gm) if static_key is None else None
        self._symbolic: Optional[torch.fx.GraphModule] = None
        symbolic = self._size_inputs is not None and knobs.dynamo_symbolic()  # read once, not per call
        self._symbolic_state = "untried" if symbolic else "impossible"
        self._tensor_positions = (
            [i for i in range(len(_placeholders(gm))) if i not in self._size_inputs] if symbolic else []
        )
        # ints that are no tensor's size (a token count Dynamo made dynamic): passed as carriers
        self._free_ints = [i for i, src in (self._size_inputs or {}).items() if src is None] if symbolic else []

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
            refused = self.cache.refused.get(key)
            if refused is not None:
                return self._eager(args, refused)
            with self.cache.lock:
                opt = self.captures.get(key)
                if opt is None:
                    if self.cache.full():
                        return self._eager(args, self._overflow(key))
                    try:
                        opt = optimize(capture(self.gm, *args))
                    except TridentError as e:
                        # Dynamo's graph still runs: eagerly, for this signature from now on
                        return self._eager(args, self.cache.refuse(key, e, "optimize this graph"))
                    self.cache.add(key, opt)
                    if self._static_key is not None:
                        self._static = opt
        return opt(*args)

    def _eager(self, args, reason: str):
        self.cache.eager(reason)
        return self.gm(*args)

    def _overflow(self, key) -> str:
        """Why a call past the bound runs eagerly, with the graph inputs whose facts differ from
        the newest capture's signature, in Dynamo's names for them (`l_x_: float32[128] ->
        float32[192]`)."""
        reason = self.cache.overflow()
        last = next(reversed(self.captures), None)
        if not isinstance(last, tuple) or len(last) != len(key):
            return reason
        names = [n.name for n in _placeholders(self.gm)]
        changed = [f"{names[i] if i < len(names) else f'input {i}'}: {_facts_text(a)} -> {_facts_text(b)}"
                   for i, (a, b) in enumerate(zip(last, key)) if a != b]
        if not changed:
            return reason
        more = f" (and {len(changed) - 4} more)" if len(changed) > 4 else ""
        return f"{reason} (changed since the newest capture: {'; '.join(changed[:4])}{more})"

    def _call_symbolic(self, args):
        """Note [Dynamic Dynamo graphs]: the call through the graph's symbolic capture (made on
        its first call with every free int >= 2), or None when this call is to take the static
        path."""
        opt = self._symbolic
        positions = self._tensor_positions
        if opt is None:
            # a free int of 0 or 1 would be specialized by the trace (a capture for that value
            # only): such a call takes the static path, the capture waits for a general one
            if any(not isinstance(args[i], int) or args[i] < 2 for i in self._free_ints):
                return None
            with self.cache.lock:
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
            return opt(*[args[i] for i in positions], *[carrier(args[i]) for i in self._free_ints])
        except GuardError as e:
            # sizes the capture cannot serve, raised before anything ran: a static capture
            if not retry_static(opt, e):
                raise
            return None

    def _capture_symbolic(self, args):
        size_inputs = self._size_inputs
        positions = self._tensor_positions
        names = [n.name for n in _placeholders(self.gm)]
        gm = self.gm

        free = self._free_ints

        def flat(*inputs):
            full = [None] * len(names)
            for i, t in zip(positions, inputs):
                full[i] = t
            for i, c in zip(free, inputs[len(positions):]):  # a free int: its carrier's size
                full[i] = c.size(0)
            for i, source in size_inputs.items():  # each size read from its tensor in the trace
                if source is None:
                    continue
                j, prop, d = source
                full[i] = full[j].size(d) if prop == "size" else full[j].stride(d) if prop == "stride" else (
                    full[j].storage_offset())
            return gm(*full)

        flat.__name__ = "forward"
        for i in positions:
            if not isinstance(args[i], torch.Tensor):
                raise TridentError(f"input {names[i]} is a {type(args[i]).__name__}, not a tensor or a size")
        for i in free:
            if not isinstance(args[i], int):
                raise TridentError(f"input {names[i]} is a {type(args[i]).__name__}, not an int")
        # inputs Dynamo kept static stay static (Note [Static inputs of a symbolic capture])
        placeholders = _placeholders(gm)
        static = [k for k, i in enumerate(positions)
                  if isinstance(v := placeholders[i].meta.get("example_value"), torch.Tensor)
                  and not any(isinstance(d, torch.SymInt) for d in (*v.shape, *v.stride()))]
        opt = optimize(capture(flat, *[args[i] for i in positions], *[carrier(args[i]) for i in free],
                               static_inputs=static,
                               input_names=[names[i] for i in positions] + [names[i] for i in free],
                               dynamic=True))
        self.cache.add(("symbolic",), opt)
        return opt


# Note [Dynamic Dynamo graphs]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# After a recompile for a new size (automatic dynamic shapes) or with dynamic=True, Dynamo hands
# over a graph with symbolic sizes whose int inputs are sizes of its tensor inputs (`s0` for
# `x.size(0)`: each placeholder's GraphArg names its source). Such a graph gets one symbolic
# capture (Note [Symbolic sizes]), traced over its tensor inputs alone with each int read from
# its tensor inside the trace, so the host program computes it from the input facts; calls pass
# the tensors only (Dynamo's guards already tie the ints to them). An int input that is no
# tensor's property (a Python token count Dynamo made dynamic after it changed) is passed as the
# size of a carrier tensor (Note [State the function is passed]): a count that advances every
# step costs no capture. A graph whose symbolic capture fails or raises GuardError for a call
# before running anything (sizes its shape guards exclude) takes the static path per signature.


def _placeholders(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _facts_text(facts) -> str:
    """A signature entry (compile.signature) as explain() prints leaves: `float32[4, 8]`, `3`."""
    if isinstance(facts, tuple) and len(facts) == 4 and isinstance(facts[0], torch.dtype):
        dtype, device, shape, stride = facts
        contiguous = stride == tuple(make_contiguous_strides_for(shape))
        return (f"{str(dtype).replace('torch.', '')}{list(shape)}"
                f"{'' if contiguous else f' strides {list(stride)}'}{'' if device.type == 'cpu' else f' {device}'}")
    if isinstance(facts, tuple) and len(facts) == 2 and isinstance(facts[0], type):
        return repr(facts[1])
    return "another object"


def _size_inputs(gm) -> "Optional[dict[int, tuple]]":
    """{placeholder index: (tensor placeholder index, "size"|"stride"|"offset", dim)} for each
    int input of a symbolic Dynamo graph that is a tensor property of another input, None for a
    free symbolic int (a Python int Dynamo made dynamic: passed as a carrier, Note [Dynamic
    Dynamo graphs]); None when the graph is not symbolic or an int input is static."""
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
            out[i] = None
            symbolic = True
            continue
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
    compiled = CompiledGraph(gm, _stack_frames(), _frame_module(), _static_key(example_inputs), _frame_where())
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


def _frame_where() -> str:
    """` graph of forward (modeling_llama.py:412)`: the frame Dynamo compiles, for messages ('' if unknown)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        code = InstructionTranslator.current_tx().f_code
    except Exception:
        return ""
    return f" graph of {code.co_name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


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


# Note [Disabled functions under backend="trident"]: the state a disabled function can reach.
_MISSING = object()  # a name, key or cell not bound
_STATEFUL: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()  # function -> what its run changed
_DEPTH = DEPTH  # levels below a root the snapshot follows
_ITEMS = ITEMS  # items of one container it follows (all of them are compared)
_FUNCTIONS = 64  # functions of the module whose code it reads


def _unwrap_disabled(fn):
    """The callable a torch.compiler.disable() wrapper runs."""
    while getattr(fn, "_torchdynamo_orig_callable", None) is not None:
        fn = fn._torchdynamo_orig_callable
    return fn


def _module_of(obj) -> str:
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
    if isinstance(obj, functools.partial):
        obj = obj.func
    module = getattr(obj, "__module__", None)
    return module if isinstance(module, str) else type(obj).__module__


def _describe_function(fn) -> str:
    inner = _unwrap_disabled(fn)
    name = getattr(inner, "__qualname__", None) or type(inner).__qualname__
    return f"{_module_of(inner)}.{name}"


def _disabled_action(obj) -> Optional[str]:
    """The action TRIDENT_DYNAMO_TRACE_DISABLED names for a torch.compiler.disable()d function
    defined outside torch and Trident ("trace", "check" or "break"); None for anything else."""
    try:
        if not inspect.isfunction(obj) or not inspect.getattr_static(obj, "_torchdynamo_disable", False):
            return None
    except Exception:
        return None
    module = _module_of(_unwrap_disabled(obj))
    if module.split(".")[0] in ("torch", "trident"):
        return None
    return knobs.dynamo_trace_disabled().action(module)


def _traceable_disabled(obj) -> bool:
    """Whether a call of `obj` may stay in a graph for Trident (Note [Disabled functions under
    backend="trident"]): a disabled function its module's rule traces, or checks and has not
    found stateful."""
    action = _disabled_action(obj)
    return action == "trace" or (action == "check" and obj not in _STATEFUL)


def _new_value(value) -> str:
    if isinstance(value, torch.Tensor):
        return "a fake tensor" if isinstance(value, torch._subclasses.FakeTensor) else "a tensor"
    if _holds_tensor(value):
        return f"a {type(value).__name__} holding a tensor"
    return _short(value) if _plain(value) else f"a {type(value).__name__} object"


def _rebinding(old, new) -> str:
    if old is _MISSING:
        return f"(new: {_new_value(new)})"
    if new is _MISSING:
        return "(deleted)"
    if isinstance(old, int) and isinstance(new, int) and not isinstance(old, bool):
        return f"(a counter: {old} -> {new})"
    return f"(rebound to {_new_value(new)})"


def _reads(code: types.CodeType) -> Iterator[types.CodeType]:
    """A function's code and the code nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _reads(const)


class _StateSnapshot:
    """Note [Disabled functions under backend="trident"]: the Python state a disabled function
    can reach, each mutable object as a shallow copy, to compare with after the function's run at
    compile time and to put back when it changed."""

    def __init__(self, fn):
        self.records: list = []  # [label, kind, object, saved]
        self._seen: dict[int, Any] = {}  # id -> object, kept alive so that ids stay unique
        target = _unwrap_disabled(fn)
        roots: list = []
        if isinstance(target, types.MethodType):  # torch.compiler.disable(obj.method): obj is reachable
            roots.append(("self", target.__self__))
            target = target.__func__
        while isinstance(target, functools.partial):
            roots += [(f"partial argument {i}", a) for i, a in enumerate(target.args)]
            roots += [(f"partial argument {k}", a) for k, a in (target.keywords or {}).items()]
            target = target.func
        if not isinstance(target, types.FunctionType):  # a callable object
            roots.append((_describe_function(fn), target))
            target = inspect.getattr_static(type(target), "__call__", None)
        functions = self._functions(target) if isinstance(target, types.FunctionType) else []
        self.names = {name for f in functions for code in _reads(f.__code__) for name in code.co_names}
        spaces: dict[int, tuple] = {}
        for f in functions:
            spaces.setdefault(id(f.__globals__), (f.__globals__, f.__module__, set()))[2].update(
                name for code in _reads(f.__code__) for name in code.co_names
            )
            for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
                self._record(f"closure variable {name} of {f.__qualname__}", "cell", cell, _cell_value(cell))
                self._visit(f"closure variable {name} of {f.__qualname__}", _cell_value(cell), 1)
            defaults = dict(
                zip(f.__code__.co_varnames[f.__code__.co_argcount - len(f.__defaults__ or ()) :], f.__defaults__ or ())
            )
            for name, value in {**defaults, **(f.__kwdefaults__ or {})}.items():
                self._visit(f"default {name} of {f.__qualname__}", value, 1)
        for namespace, module, names in spaces.values():
            self._names(module or "<globals>", namespace, None, names, 0)
        for label, value in roots:
            self._visit(label, value, 0)

    def _functions(self, target) -> list:
        """`target` and the functions of its module its code names, and theirs, up to _FUNCTIONS."""
        out, todo = [], [target]
        while todo and len(out) < _FUNCTIONS:
            f = todo.pop()
            if any(f is g for g in out):
                continue
            out.append(f)
            for code in _reads(f.__code__):
                for name in code.co_names:
                    value = _unwrap_disabled(f.__globals__.get(name))
                    if isinstance(value, types.FunctionType) and value.__globals__ is target.__globals__:
                        todo.append(value)
        return out

    def _record(self, label: str, kind: str, obj, saved) -> None:
        self.records.append([label, kind, obj, saved])

    def _names(self, label: str, namespace, owner, names, depth: int) -> None:
        """The names a function's code uses, in a module's globals or a class's, function's or
        module's attributes: only those (a module's other globals are not the function's)."""
        if id(namespace) in self._seen:
            return
        self._seen[id(namespace)] = namespace
        saved = {name: namespace.get(name, _MISSING) for name in names if not name.startswith("__")}
        self._record(label, "names", (namespace, owner), saved)
        for name, value in saved.items():
            self._visit(f"{label}.{name}", value, depth + 1)

    def _visit(self, label: str, obj, depth: int) -> None:
        if (
            depth > _DEPTH
            or obj is None
            or obj is _MISSING
            or isinstance(obj, (bool, int, float, complex, str, bytes))
            or isinstance(obj, torch.Tensor)
            or id(obj) in self._seen
        ):
            return
        self._seen[id(obj)] = obj
        if isinstance(obj, dict):
            self._record(label, "dict", obj, dict(obj))
            for key, value in itertools.islice(obj.items(), _ITEMS):
                self._visit(f"{label}[{_short(key)}]", value, depth + 1)
        elif isinstance(obj, (list, collections.deque)):
            self._record(label, "list", obj, list(obj))
            for i, value in enumerate(itertools.islice(obj, _ITEMS)):
                self._visit(f"{label}[{i}]", value, depth + 1)
        elif isinstance(obj, set):
            self._record(label, "set", obj, set(obj))
        elif isinstance(obj, (tuple, frozenset)):  # immutable, but what it holds may not be
            for i, value in enumerate(itertools.islice(obj, _ITEMS)):
                self._visit(f"{label}[{i}]", value, depth + 1)
        elif isinstance(obj, (types.MethodType, types.BuiltinMethodType)):
            owner = getattr(obj, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType):
                self._visit(f"{label}.__self__", owner, depth)
        elif isinstance(obj, (types.ModuleType, type, types.FunctionType)):
            if not _foreign(obj):  # a library's module, class or function: the attributes its code names
                self._names(label, vars(obj), obj, self.names, depth)
        elif keeps_state(obj):
            attrs = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
            slots = {s for c in type(obj).__mro__ for s in _slots(c)} - {"__dict__", "__weakref__"}
            attrs.update({s: getattr(obj, s, _MISSING) for s in slots})
            self._record(label, "attrs", obj, attrs)
            for name, value in itertools.islice(attrs.items(), _ITEMS):
                self._visit(f"{label}.{name}", value, depth + 1)

    def changes(self) -> list:
        """[(record, what changed)] since the snapshot, in the order recorded."""
        out = []
        for record in self.records:
            label, kind, obj, saved = record
            try:
                what = _changed(label, kind, obj, saved)
            except Exception as e:  # not comparable: taken as changed
                what = (f"{label} (not comparable after the run: {type(e).__name__})", False)
            if what:
                out.append((record, what))
        return out

    def restore(self, changed) -> list:
        """Puts back each changed record; the labels of those it could not put back."""
        failed = []
        for (label, kind, obj, saved), _ in changed:
            try:
                _put_back(kind, obj, saved)
            except Exception:
                failed.append(label)
        return failed


def _slots(cls) -> tuple:
    slots = cls.__dict__.get("__slots__", ())
    return (slots,) if isinstance(slots, str) else tuple(slots)


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _MISSING


def _changed(label: str, kind: str, obj, saved) -> "Optional[tuple[str, bool]]":
    """(what changed, whether it is only a memo filled with plain data), or None."""
    if kind == "cell":
        now = _cell_value(obj)
        return None if now is saved else (f"{label} {_rebinding(saved, now)}", False)
    if kind in ("names", "attrs"):
        namespace = obj[0] if kind == "names" else None
        for name, old in saved.items():
            new = namespace.get(name, _MISSING) if namespace is not None else getattr(obj, name, _MISSING)
            if new is old:
                continue
            if old is _MISSING and isinstance(new, (types.ModuleType, type, types.FunctionType)):
                continue  # an import, or a module's lazily bound attribute: no state
            return f"{label}.{name} {_rebinding(old, new)}", False
        if kind == "attrs" and hasattr(obj, "__dict__"):
            added = [name for name in vars(obj) if name not in saved]
            if added:
                return f"{label}.{added[0]} {_rebinding(_MISSING, vars(obj)[added[0]])}", False
        return None
    if kind == "dict":
        removed = [k for k in saved if k not in obj]
        rebound = [k for k, v in saved.items() if k in obj and obj[k] is not v]
        if removed:
            return f"{label}[{_short(removed[0])}] (removed)", False
        if rebound:
            k = rebound[0]
            return f"{label}[{_short(k)}] {_rebinding(saved[k], obj[k])}", False
        added = [k for k in obj if k not in saved]
        if not added:
            return None
        plain = all(_plain(k) and _plain(obj[k]) for k in added)
        return f"{label}[{_short(added[0])}] (a new memo entry: {_new_value(obj[added[0]])})", plain
    if kind == "list":
        now = list(obj)
        if len(now) == len(saved) and all(a is b for a, b in zip(now, saved)):
            return None
        if len(now) != len(saved):
            return f"{label} (a list: {len(saved)} -> {len(now)} items)", False
        i = next(i for i, (a, b) in enumerate(zip(now, saved)) if a is not b)
        return f"{label}[{i}] {_rebinding(saved[i], now[i])}", False
    if kind == "set":
        if obj == saved:
            return None
        added, removed = obj - saved, saved - obj
        if removed:
            return f"{label} (a set: {_short(next(iter(removed)))} removed)", False
        return f"{label} (a set: {_short(next(iter(added)))} added)", all(_plain(v) for v in added)
    return None


def _put_back(kind: str, obj, saved) -> None:
    if kind == "cell":
        if saved is _MISSING:
            del obj.cell_contents
        else:
            obj.cell_contents = saved
    elif kind in ("names", "attrs"):
        namespace, owner = obj if kind == "names" else (None, obj)
        if kind == "attrs" and hasattr(owner, "__dict__"):
            for name in [n for n in vars(owner) if n not in saved]:
                delattr(owner, name)
        for name, old in saved.items():
            now = namespace.get(name, _MISSING) if namespace is not None else getattr(owner, name, _MISSING)
            if now is old:
                continue
            if owner is None:  # a module's globals
                if old is _MISSING:
                    namespace.pop(name, None)
                else:
                    namespace[name] = old
            elif old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
    elif kind == "dict" or kind == "set":
        obj.clear()
        obj.update(saved)
    elif kind == "list":
        obj.clear()
        obj.extend(saved)


def _state_verdict(fn, snapshot: _StateSnapshot) -> Optional[str]:
    """None when the run changed nothing the snapshot holds but memos of plain data (kept: eager's
    first call fills them alike); else what it changed, every change put back."""
    changed = snapshot.changes()
    stateful = [(record, what) for record, (what, memo) in changed if not memo]
    if not stateful:
        return None
    failed = snapshot.restore(changed)
    inner = _unwrap_disabled(fn)
    more = f" and {len(stateful) - 1} more" if len(stateful) > 1 else ""
    undone = f"; could not put back {', '.join(failed)}" if failed else ""
    return (
        f"{_describe_function(fn)} writes {stateful[0][1]}{more}: it stays a graph break (Note [Disabled functions "
        f'under backend="trident"]; TRIDENT_DYNAMO_TRACE_DISABLED=+{_module_of(inner)} keeps it in the graph '
        f"anyway){undone}"
    )


def _tensors_only(variable) -> bool:
    """Whether a Dynamo variable is a tensor, or a tuple or list (nested) of tensors and Nones
    with a tensor among them (flash-linear-attention's norms return `(y, None, rstd, x)`)."""

    def leaves(v):
        if v.is_tensor():
            return [True]
        if isinstance(v, BaseListVariable):
            return [leaf for item in v.items for leaf in leaves(item)]
        if v.is_python_constant() and v.as_python_constant() is None:
            return [False]
        return [None]

    found = leaves(variable)
    return any(found) and None not in found


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
        action = _disabled_action(fn)
        if action is None or original_allowed(fn):
            return original_call(self, tx, *args, **kwargs)
        if action == "break" or fn in _STATEFUL:  # a variable Dynamo made before the verdict or the knob changed
            raise Unsupported(
                _STATEFUL.get(fn) or f"{_describe_function(fn)}: TRIDENT_DYNAMO_TRACE_DISABLED breaks the graph at it"
            )

        try:
            snapshot = _StateSnapshot(fn) if action == "check" else None
        except Exception as e:  # state the check cannot read: the call is not kept unchecked
            raise Unsupported(
                f"{_describe_function(fn)}: Trident cannot read the Python state it reaches ({type(e).__name__}: "
                f'{e}); it stays a graph break (Note [Disabled functions under backend="trident"])'
            ) from e
        try:
            with triton_state.exclusive(), _launches_as_hops([]):
                result = original_call(self, tx, *args, **kwargs)
        except passthrough:  # graph breaks, restarts, user exceptions: Dynamo's own control flow
            if snapshot is not None:
                snapshot.restore(snapshot.changes())
            raise
        except Exception as e:  # Dynamo cannot keep the call: break the graph as without Trident
            if snapshot is not None:
                snapshot.restore(snapshot.changes())
            raise Unsupported(
                f"Trident could not keep the torch.compiler.disable()d function {_describe_function(fn)} in the "
                f"graph ({type(e).__name__}: {e}); the graph breaks there as without Trident"
            ) from e
        if not _tensors_only(result):
            if snapshot is not None:
                snapshot.restore(snapshot.changes())
            raise Unsupported(
                f"{_describe_function(fn)} returns {type(result).__name__}, not tensors: it stays a graph break "
                '(Note [Disabled functions under backend="trident"])'
            )
        reason = _state_verdict(fn, snapshot) if snapshot is not None else None
        if reason is not None:
            _STATEFUL[fn] = reason
            logs.misses.info("torch.compile(backend='trident'): %s", reason)
            raise Unsupported(reason)
        return result

    trace_rules.is_callable_allowed = is_callable_allowed
    TorchInGraphFunctionVariable.call_function = call_function
    _RULE_INSTALLED[0] = True
    return True


def register() -> None:
    """Registers the backend as "trident" at `import trident`, unless torch is loading it from the
    entry point right now (trident_scm_backend.py: it registers the same function itself) or
    has already."""
    install_disabled_function_rule()
    entry = sys.modules.get("trident_scm_backend")
    if entry is not None and getattr(entry, "LOADING", False):
        return
    try:
        register_backend(trident_backend, name="trident")
    except AssertionError:  # "duplicate name": registered from the entry point already
        pass
