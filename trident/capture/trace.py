"""trident.capture: plain Python functions that launch Triton kernels -> FX GraphModule.

Kernels are launched the way users write them (`kernel[grid](...)`, grid a tuple or
`lambda meta: ...`), through `torch.library.wrap_triton`, or inside `torch.library.triton_op`s and
`torch.library.custom_op`s (inlined: Note [Inlining custom ops]).
The function is traced with make_fx on fake tensors; while tracing, `kernel[grid]` is routed
through `wrap_triton`, so every launch becomes a `triton_kernel_wrapper_mutation` node and
ATen ops around it become ATen nodes. Nothing runs on a device during capture.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import gc
import inspect
import keyword
import re
import threading
import traceback
import types
import weakref
from typing import Any, Callable, NamedTuple, Optional, Sequence

import torch
import torch._dynamo.config as dynamo_config
import torch.compiler as tc
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.fx.experimental import _config
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.multiprocessing.reductions import StorageWeakRef
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction, KernelInterface

from .. import logs, triton_state
from ..errors import CaptureError
from ..scm.tuning import HeuristicFailed, heuristic_values
from .collectives import check_graph, collectives_as_functional
from .frames import user_line
from .host_driver import ensure_triton_driver
from .inline_triton_ops import inline_custom_ops
from .python_values import CONTAINERS, holds_tensor, keeps_state, plain, short, stored_attributes, stored_items, tensors_in
from .shared_patch import SharedPatch, setter
from .values import DECOMPOSITIONS, _written, specializing

# `kernel[grid]` is routed through wrap_triton only in the thread that traces: the patched
# KernelInterface.__getitem__ is installed while any thread traces (counted) and routes a launch
# only when the calling thread is inside _launches_as_hops; other threads' eager launches take
# Triton's own path meanwhile (before, they were routed too: a user thread launching while
# another traced recursed into the patch).
_route = threading.local()
_ORIGINAL_GETITEM = KernelInterface.__getitem__


def _routed_getitem(self, grid):
    log = getattr(_route, "log", None)
    if log is None:
        return _ORIGINAL_GETITEM(self, grid)
    kernel = compilable(self)
    if isinstance(kernel, Heuristics):
        return _heuristics_launcher(kernel, grid, _routed_getitem, log)
    wrapped = torch.library.wrap_triton(kernel)
    if wrapped is kernel:  # wrap_triton declined it (an interpreted autotuner, say)
        raise CaptureError(f"cannot trace {_kernel_name(kernel)}: torch.library.wrap_triton does not take a {type(kernel).__name__}")
    return wrapped[grid]


_ROUTING = SharedPatch(setter(KernelInterface, "__getitem__", _routed_getitem),
                       setter(KernelInterface, "__getitem__", _ORIGINAL_GETITEM))


@contextlib.contextmanager
def _launches_as_hops(log: list):
    """Route this thread's `kernel[grid]` through wrap_triton for the duration of a trace. A
    @triton.heuristics kernel (which wrap_triton does not take) has its values computed here,
    the way `Heuristics.run` computes them, and its inner kernel launched with them; `log` gets
    (inner kernel, heuristics, values) per such launch, in launch order."""
    with _thread_route(_ROUTING, _route, "log", log):
        yield


@contextlib.contextmanager
def _thread_route(patch: SharedPatch, local: threading.local, name: str, value):
    """Hold a shared patch with this thread's `local.<name>` set to `value` (the patched code
    reads it to act for this thread only); the outer value comes back after."""
    outer = getattr(local, name, None)
    with patch.held():
        setattr(local, name, value)
        try:
            yield
        finally:
            setattr(local, name, outer)


# Note [Capture under TRITON_INTERPRET=1]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# With TRITON_INTERPRET=1 set when a kernel is defined, @triton.jit returns an
# InterpretedFunction: no binder, no compiler, nothing wrap_triton can trace (it hands the object
# back, whose __getitem__ is then the traced one again: endless recursion). Trident needs what a
# JITFunction has (Triton's own specialization and compilation), so a launch of such a kernel is
# traced as a launch of its JITFunction twin: the same Python function and decorator options,
# with @triton.jit helpers it calls (also InterpretedFunctions) twinned in a copy of its globals.
# Autotuners and heuristics over one are copied with the twin inside (their cache shared).
# The user's own objects are left as they are: eager calls keep running interpreted.
_twins: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_scopes: dict[int, tuple[dict, dict]] = {}  # id(module globals) -> (those globals, the twins' copy)


def compilable(kernel):
    """`kernel`, or its JITFunction twin when TRITON_INTERPRET=1 made it interpreted."""
    if isinstance(kernel, InterpretedFunction):
        twin = _twins.get(kernel)
        if twin is None:
            fn = kernel.fn
            scope = _twin_scope(fn.__globals__)
            body = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
            body.__kwdefaults__ = fn.__kwdefaults__
            body.__annotations__ = dict(fn.__annotations__)
            body.__qualname__, body.__module__, body.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
            twin = _twins[kernel] = JITFunction(body, **kernel.kwargs)
            # helpers it calls, twinned in the shared copy (registered first: cycles end)
            for name in _names(fn.__code__):
                if isinstance(scope.get(name), InterpretedFunction):
                    scope[name] = compilable(scope[name])
        return twin
    if isinstance(kernel, (Autotuner, Heuristics)):
        inner = compilable(kernel.fn)
        if inner is kernel.fn:
            return kernel
        twin = _twins.get(kernel)
        if twin is None:
            twin = copy.copy(kernel)
            twin.fn = inner
            _twins[kernel] = twin
        return twin
    return kernel


def _twin_scope(module_globals: dict) -> dict:
    """One copy of a module's globals shared by the twins of its kernels."""
    entry = _scopes.get(id(module_globals))
    if entry is None or entry[0] is not module_globals:
        entry = _scopes[id(module_globals)] = (module_globals, dict(module_globals))
    return entry[1]


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _heuristics_launcher(h, grid, getitem, log: list):
    def launch(*args, **kwargs):
        try:
            values = heuristic_values(h, {**dict(zip(h.arg_names, args)), **kwargs})
        except HeuristicFailed as e:
            cause = e.__cause__
            raise CaptureError(
                f"@triton.heuristics value {e.name!r} of {_kernel_name(h)} could not be computed at capture "
                f"({type(cause).__name__}: {cause}). Trident computes heuristics once, from the dtypes, sizes, strides "
                "and scalar arguments of the launch (tensor data and addresses are not available while tracing)."
            ) from cause
        log.append((h.fn, h, dict(values)))
        return getitem(h.fn, grid)(*args, **kwargs, **values)

    return launch


def _kernel_name(kernel) -> str:
    while not isinstance(kernel, JITFunction) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel))


def _tag_heuristics(gm: torch.fx.GraphModule, log: list) -> None:
    """Mark each launch node made through @triton.heuristics with the Heuristics object and
    the values baked into it (Note [Autotuned launches]: re-checked per specialization)."""
    pending = list(log)
    for node in gm.graph.nodes:
        if node.op != "call_function" or "kernel_idx" not in node.kwargs or not pending:
            continue
        kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
        inner, h, values = pending[0]
        if kernel is inner or getattr(kernel, "fn", None) is inner:
            node.meta["trident_heuristics"] = (h, values)
            pending.pop(0)


# Note [Closed-over tensors]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# A forward method reads tensors it is not passed: parameters, buffers, a KV cache held by a
# cache object, constants. make_fx (with non-fake inputs allowed) records each as a constant of
# the graph (`_param_constantN` / `_tensor_constantN`) holding that very tensor, and optimize
# passes it to the regions as an input like any other: in-place updates of it (an optimizer step
# under no_grad, a cache write inside the program) are seen and made, every call. Rebinding the
# name to another tensor (assigning a new Parameter) is not: the graph keeps the tensor it
# captured; capture again after such a change.
# One trap: FakeTensorMode runs an arithmetic op whose tensor arguments are all real for real
# (it lets Python numbers bind to tensors), so `counter.add_(1)` on a closed-over scalar tensor
# would advance the caller's counter at capture time, and `counter + 1` would be burnt in as a
# constant. While capturing, that shortcut is off (`_no_real_compute`): such ops are traced on
# fake copies like any other, and the optimized program performs them on every call.


@contextlib.contextmanager
def _no_real_compute():
    original = fake_tensor.should_allow_numbers_as_tensors
    fake_tensor.should_allow_numbers_as_tensors = lambda func: False
    try:
        yield
    finally:
        fake_tensor.should_allow_numbers_as_tensors = original


def _first_part(e: BaseException) -> str:
    """The exception's message; for torch's data-dependent guard, its first line only (the rest
    is advice about Dynamo's own debugging flags)."""
    text = str(e).strip()
    return text.splitlines()[0] if isinstance(e, GuardOnDataDependentSymNode) and text else text


def _user_frame(e: BaseException) -> Optional[str]:
    """Where in the user's code the trace failed (frames.user_line of its traceback)."""
    return user_line(traceback.extract_tb(e.__traceback__))


# What fake tensors raise where a value decides: a guard on a data-dependent size (symbolic
# traces), an operator whose output size depends on values (nonzero, in static traces), a
# scalar read (.item()) in a static trace.
_DATA_DEPENDENT = (GuardOnDataDependentSymNode, DynamicOutputShapeException, DataDependentOutputException)


def data_dependent(e: BaseException) -> bool:
    """Whether the trace failed on a tensor's values: `e` or an exception it was raised from."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, _DATA_DEPENDENT):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


# Note [A trace leaves no fake tensors in memos]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The trace runs the function's Python on fake tensors, and libraries memoize: flash-linear-
# attention's `tensor_cache` keeps the last calls' (args, kwargs, result) in a deque held by a
# closure. After the trace those entries hold fake tensors. Eager calls never hit them (they
# compare arguments by identity), but Dynamo, compiling the same code later (a data-dependent
# function goes through torch.compile: Note [Data-dependent calls through Dynamo]), inlines the
# memo and fails on a fake tensor with symbolic sizes ("unhashable type: non-nested SymInt").
# So after every trace (made or failed; a Dynamo graph runs library Python too: the disabled
# functions it keeps, Note [Disabled functions under backend="trident"]; the passes after it run
# none), the entries of every deque in the process (gc.get_objects(), ~50 ms
# with a Hugging Face model loaded) that are a fake tensor of that trace's own modes (make_fx's,
# and those of the custom-op inlining's re-traces), or a tuple holding one (3 levels down), are
# removed: a memo entry the trace made goes, as if the trace never ran. Only bounded deques (a
# last-calls memo has a maxlen; a queue.Queue's deque has none and its count would go wrong),
# only entries: a dict's keys may be a module's globals or a class's
# attributes (deleting one broke the library or, for a class, crashed CPython's type cache), a
# list's positions may mean something to their owner, and a dict or list memo of fake tensors
# stays (docs/limits.md). A mode the trace did not create (the caller's own fake inputs, a
# TracingContext's) is never swept. A deque another thread changed while it was read (its
# entries no longer the ones read) is skipped; the sweep never raises.
def _holds_fake(value, modes, depth: int = 3) -> bool:
    kind = type(value)  # never isinstance: a dead weakref.proxy raises ReferenceError there
    if issubclass(kind, fake_tensor.FakeTensor):
        return any(value.fake_mode is m for m in modes)
    if depth and kind is tuple:
        return any(_holds_fake(v, modes, depth - 1) for v in value)
    return False


def _forget_fake_tensors(modes: list) -> int:
    """Note [A trace leaves no fake tensors in memos]: the entries removed."""
    if not modes:
        return 0
    removed = 0
    try:
        for obj in gc.get_objects():
            if type(obj) is not collections.deque or obj.maxlen is None:
                continue
            try:
                items = list(obj)  # one C call: atomic under the GIL
                keep = [v for v in items if not _holds_fake(v, modes)]
                if len(keep) != len(items) and len(obj) == len(items) and all(a is b for a, b in zip(obj, items)):
                    obj.clear()  # rebuilt: remove() would compare tensors with ==
                    obj.extend(keep)
                    removed += len(items) - len(keep)
            except Exception:  # noqa: BLE001 - changed meanwhile (another thread): left as it is
                continue
    except Exception:  # noqa: BLE001 - the sweep never fails a capture
        pass
    return removed


# Note [Module attributes a trace rebinds]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The trace runs the function's Python, and modules memoize on themselves: a rotary embedding
# (flash-attn's, flash-linear-attention's) keeps cos/sin tables in plain attributes and rebuilds
# them when a longer sequence comes (`self._seq_len_cached = seqlen; self._cos_cached = ...`).
# Traced, that left the trace's fake tensors and SymInts on the user's model: the next eager
# call (a longer generate()'s prefill) read them and failed in a Triton launch ("Cannot access
# data pointer of Tensor"). A trace is no call, so what the function reaches comes out of it as
# it went in. Taken when the trace starts (under Triton's lock, with the trace) and put back
# entry by entry when it ends, made or failed (`_StateAsFound`):
#   * the attribute tables (`__dict__`, buffers, parameters) of every module reachable from the
#     function -- its `self`, closures, globals and arguments, through lists, tuples, sets, dicts
#     and the public attributes of plain objects (`_reachable`, the walk that names closed-over
#     tensors) --, FX GraphModules aside (their bookkeeping: generated code, line maps);
#   * the attributes of plain objects on those paths (of the user's classes, and the standard
#     library's namespaces), and the dicts, lists, sets and deques on them; the walk ends at
#     objects of torch, Triton, Trident and the rest of the standard library
#     (python_values.keeps_state: their own caches, a logger's handlers, a Triton kernel's
#     compiles, a compiled function's captures);
#   * the dicts, lists, sets and deques those attributes hold, their changes told as their
#     holder's (a module's own hooks and buffer names are put back, not judged);
#   * not what the function was passed, or reaches through it: Note [State the function is
#     passed] replays that; nor deques with a maxlen (Note [A trace leaves no fake tensors in
#     memos]).
# Containers are read and refilled as stored (an OrderedDict in its order, a subclass's
# overrides bypassed). Everything comes back, ints and flags included (a table put back without
# its length would be read as the longer one), a list the trace appended to as long as it was,
# a memo entry the trace made removed. What the trace changed then decides, holder by holder:
#
#   change the trace made                                     capture
#   an old value held a tensor the graph reads (`self.h =     refused (1)
#     f(self.h, x)`, a list or an object holding them)
#   the holder rebinds an attribute to tensors the graph      stands: a table rebuilt from scratch,
#     computes from sizes and held tensors alone, written       which the graph computes on every
#     in place by nothing that reads an input's data            call as eager does on such a call;
#                                                               its length beside it stands too
#   such tensors computed or filled from an input's data      refused (1): a result recorded, a
#     (`self.aux = y.sum()`, a cache allocated then filled)     cache filled, not replayed
#   any other value rebound (`self.calls += 1`, `STATE["n"]    refused (1): the function's own side
#     += 1`, a tuple, an enum, an object replaced) or a         effect, which a capture would drop
#     list's, set's or deque's contents changed                 (a value it read stays a constant:
#     (`self.log.append`), beside a table too                   `x * self.calls` stays `x * 2`)
#   an attribute or entry added or removed, a value set       stands: made lazily (a helper, a memo
#     where there was None, a value set to an equal one         entry, a buffer registered)
#
# (1) CaptureError with `module_state`: trident.compile sends the family through
# torch.compile(backend="trident"), whose Dynamo replays the change (Note [Data-dependent calls
# through Dynamo]). What could not be put back refuses the capture (the call runs eagerly).
# Not seen: a counter beside a rebuilt table in the same holder (taken for the table's length),
# a value set where there was None that the graph reads, state below the walk's depth or past
# its budget, objects without a `__dict__`, and writes other threads make to the same objects
# while a trace runs (put back with the trace's).
def _put_back_items(container, saved: list) -> None:
    """Refills a dict, list, deque or set with `saved` (stored_items'), through its base class."""
    if isinstance(container, dict):
        base = collections.OrderedDict if isinstance(container, collections.OrderedDict) else dict
        base.clear(container)
        for k, v in saved:
            base.__setitem__(container, k, v)
    elif isinstance(container, list):
        list.__setitem__(container, slice(None), saved)
    else:
        base = collections.deque if isinstance(container, collections.deque) else set
        base.clear(container)
        (base.extend if base is collections.deque else base.update)(container, saved)


# torch.nn.Module's own containers (hooks, the names of non-persistent buffers), which change
# with what is registered: put back, not judged (a buffer registered lazily is judged in _buffers)
_MODULE_BOOKKEEPING = frozenset(vars(torch.nn.Module())) - {"_buffers", "_parameters", "_modules"}


class _Change(NamedTuple):
    owner: Any  # the module or object whose attribute, or the container, that changed
    prefix: str  # its path in the user's terms (self.rotary, STATE, self.history)
    key: Any  # the attribute's name, the dict's key; None for a list's, deque's or set's contents
    keyed: bool  # `key` is a dict key (shown as [key]), else an attribute name
    old: Any  # the value as found (_ABSENT: none); a sequence's items as found
    new: Any  # the value the trace left; a sequence's items
    contents: bool  # a list's, deque's or set's contents changed

    @property
    def path(self) -> str:
        if self.key is None:
            return self.prefix
        return f"{self.prefix}[{short(self.key)}]" if self.keyed else f"{self.prefix}.{self.key}"


class _StateAsFound:
    """The state of what the function reaches, as a trace found it (Note [Module attributes a
    trace rebinds]), read and put back as stored (a subclass's overrides bypassed)."""

    def __init__(self, roots: "_Roots"):
        passed = {id(o) for _, o in _reachable(roots.passed, every=True)}
        self.taken: list = []  # (owner, path, keyed, container, its items as found)
        self.failed: list[str] = []  # paths that could not be put back (filled by restore)
        self.bookkeeping: set[int] = set()  # torch.nn.Module's own containers: put back, not judged
        seen: set[int] = set()

        def take(owner, path: str, keyed: bool, container) -> None:
            if id(container) in seen or id(container) in passed:
                return
            if isinstance(container, collections.deque) and container.maxlen is not None:
                return  # a bounded memo of recent calls: Note [A trace leaves no fake tensors in memos]
            seen.add(id(container))
            try:
                self.taken.append((owner, path, keyed, container, stored_items(container)))
            except Exception:  # noqa: BLE001 - changed meanwhile, or unreadable: not taken
                pass

        def held(owner, path: str) -> None:  # the containers its attributes hold, their changes told as its own
            module = isinstance(owner, torch.nn.Module)
            for name, v in list(stored_attributes(owner).items()):
                if isinstance(v, (dict, list, set, collections.deque)):
                    if module and name in _MODULE_BOOKKEEPING:
                        self.bookkeeping.add(id(v))
                    take(owner, f"{path}.{name}", True, v)

        for path, obj in _reachable(roots.owners + roots.passed, every=True):
            if isinstance(obj, torch.fx.GraphModule):
                continue  # its bookkeeping (generated code, line maps); its code changes nothing
            if isinstance(obj, torch.nn.Module):
                for table in (stored_attributes(obj), obj._buffers, obj._parameters):
                    take(obj, path, False, table)
                held(obj, path)
            elif id(obj) in passed or isinstance(obj, (torch.Tensor, tuple, frozenset)):
                continue
            elif isinstance(obj, (dict, list, set, collections.deque)):
                take(obj, path, True, obj)
            elif stored_attributes(obj):
                take(obj, path, False, stored_attributes(obj))
                held(obj, path)
        self.changed: list[_Change] = []  # filled by restore

    def restore(self) -> None:
        """Puts all of it back as it was, key order included, ints and flags too (the trace is no
        call: a table put back without its length would be read as the longer one); notes in
        `changed` each change the trace made and in `failed` what could not be put back."""
        for owner, path, keyed, container, saved in self.taken:
            try:
                now = stored_items(container)
                if len(now) == len(saved) and all(
                        a[0] is b[0] and a[1] is b[1] if isinstance(container, dict) else a is b
                        for a, b in zip(now, saved)):
                    continue
                _put_back_items(container, saved)
            except Exception:  # noqa: BLE001 - the others are still put back
                self.failed.append(path)
                continue
            if id(container) in self.bookkeeping:
                continue  # hooks, the non-persistent buffers' names: they follow what is registered
            if not isinstance(container, dict):
                self.changed.append(_Change(owner, path, None, False, saved, now, True))
                continue
            old_t, new_t = dict(saved), dict(now)
            for key in [*old_t, *(k for k in new_t if k not in old_t)]:
                old, new = old_t.get(key, _ABSENT), new_t.get(key, _ABSENT)
                if new is not old:
                    self.changed.append(_Change(owner, path, key, keyed, old, new, False))


@contextlib.contextmanager
def _state_as_found(roots: "_Roots"):
    """Note [Module attributes a trace rebinds]: what the function reaches put back when the
    block ends, however it ends."""
    state = _StateAsFound(roots)
    try:
        yield state
    finally:
        state.restore()


_ABSENT = object()


def _same(old, new) -> bool:
    """Equal plain data (`self.scale = 1.0 / n` set again to what it was)."""
    try:
        return type(old) is type(new) and plain(old) and plain(new) and bool(old == new)
    except Exception:  # noqa: BLE001 - not comparable: a change
        return False


def _value(v) -> str:
    if v is _ABSENT:
        return "(none)"
    if isinstance(v, torch.Tensor):
        return "a tensor"
    return short(v) if plain(v) else f"a {type(v).__name__}"


def _shown(change: _Change) -> str:
    if change.contents:
        n, m = len(change.old), len(change.new)
        return f"its contents: {n} -> {m} item(s)" if n != m else "its contents"
    return f"{_value(change.old)} -> {_value(change.new)}"


def _graph_computed(gm: torch.fx.GraphModule, value) -> Optional[str]:
    """Why the tensors the trace left on an attribute are no table (None when they are one): one
    is no node's value, is computed from an input's data, or is written in place by a node that
    reads an input's data (a cache allocated, then filled; a result recorded). Sizes read from
    inputs are no data (a table for a longer sequence), nor are the tensors the function holds."""
    data: set = set()  # nodes whose tensors depend on a tensor input's data
    for node in gm.graph.nodes:
        if (node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor)) or any(
                a in data for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)):
            data.add(node)
    def storage(node):  # a node's value's memory (make_fx records a detached alias of the traced tensor)
        val = node.meta.get("val")
        return StorageWeakRef(val.untyped_storage()) if isinstance(val, torch.Tensor) else None

    wanted = {StorageWeakRef(t.untyped_storage()) for t in tensors_in(value)}
    found = set()
    known: dict = {}
    for node in gm.graph.nodes:
        if storage(node) in wanted:
            found.add(storage(node))
            if node in data:
                return f"computed from an input's data ({node.name})"
        if node in data and any(storage(w) in wanted for w in _written(node, known)):
            return f"written in place from an input's data ({node.name})"
    return None if found == wanted else "the graph does not compute"


def _check_rebound(gm: torch.fx.GraphModule, state: _StateAsFound) -> None:
    """Note [Module attributes a trace rebinds]: returns where the capture may leave what the trace
    changed as found (tables rebuilt, helpers made lazily); raises CaptureError (module_state) for
    state the function keeps, which a capture would not update."""
    if state.failed:
        raise CaptureError(f"the trace changed {state.failed[0]}, which could not be put back as it was: the call "
                           "runs eagerly.")
    held = {id(t) for t in gm.state_dict(keep_vars=True).values()}
    held |= {id(getattr(gm, n.target, None)) for n in gm.graph.nodes if n.op == "get_attr"}
    advice = ("trident.compile serves such calls through torch.compile(fn, backend='trident'), whose Dynamo "
              "replays it; or pass the state to the function as an argument (Note [State the function is passed]).")
    for c in state.changed:
        if any(id(t) in held for t in tensors_in(c.old)):
            what = (f"changes {c.path} ({_shown(c)}; it held a tensor the capture reads)" if c.contents else
                    f"rebinds {c.path} (a tensor attribute it reads) to a new value")
            raise CaptureError(f"the function {what} on every call: state it keeps outside its arguments, which a "
                               f"capture would not update. {advice}", module_state=True)
    tables = {}
    for c in state.changed:
        if not c.contents and not c.keyed and holds_tensor(c.new) and id(c.owner) not in tables:
            tables[id(c.owner)] = (c, _graph_computed(gm, c.new))
    for c in state.changed:
        table = tables.get(id(c.owner))
        if table is not None and table[1] is not None:
            t = table[0]
            raise CaptureError(
                f"the function rebinds {t.path} to a tensor {table[1]} on every call: state it keeps outside its "
                f"arguments (a result it records, a cache it fills), which a capture would not update. {advice}",
                module_state=True)
        if table is not None and not c.keyed and not c.contents:
            continue  # a table rebuilt from sizes alone (with its length beside it)
        if not c.contents and (c.old is _ABSENT or c.old is None or c.new is _ABSENT or _same(c.old, c.new)):
            continue  # made lazily, removed, or set again to what it was
        raise CaptureError(
            f"the function changes {c.path} ({_shown(c)}) on every call: state it keeps outside its arguments, "
            f"which a capture would drop (a value it reads would stay as traced). {advice}", module_state=True)


def capture(
    fn: Callable[..., Any],
    *example_inputs: Any,
    input_names: Optional[Sequence[str]] = None,
    dynamic: bool = False,
    static_inputs: Sequence[int] = (),
    values: bool = False,
) -> torch.fx.GraphModule:
    """Trace `fn(*example_inputs)` into an FX GraphModule of ATen ops and Triton launches.

    Tensor inputs become placeholders; sizes are those of the examples (static capture), or,
    with `dynamic=True`, symbols (make_fx's symbolic tracing; Note [Symbolic sizes]): sizes 0
    and 1 and the sizes of tensors `fn` closes over stay static, every other size and stride of
    an input is a symbol, and the graph serves every size its shape guards admit; the example
    inputs at `static_inputs` (positions) keep their sizes and strides (Note [Static inputs of a
    symbolic capture]).
    With `values=True`, values only the data gives (a nonzero count, a scalar read) are computed
    from the example inputs, which must be real, and specialized behind a per-call guard (Note
    [Values a trace specializes]; the optimized graph checks them on every call).
    Non-tensor inputs are captured as the constants they were: the optimized module checks
    them on every call and raises GuardError if they change.
    Graph inputs carry the caller's names (Note [The caller's names]): `fn`'s parameter names,
    or `input_names` (one per example input), and tensors `fn` closes over their paths
    (`self.layers.0.mlp.up_proj.weight` -> `self_layers_0_mlp_up_proj_weight`).
    """
    ensure_triton_driver()
    if not callable(fn):
        raise CaptureError(f"capture expected a callable, got {type(fn).__name__}")
    log: list = []
    # the trace's own FakeTensorMode, never the caller's (Note [A trace leaves no fake tensors in memos])
    modes: list = []
    theirs: list = []

    def note(mode) -> None:
        if mode is not None and all(mode is not m for m in (*theirs, *modes)):
            modes.append(mode)

    @functools.wraps(fn)
    def noted(*args):  # the user's function, its fake tensor mode noted
        note(torch._guards.detect_fake_mode(args))
        return fn(*args)

    if inspect.ismethod(fn):  # make_fx would count the unwrapped method's `self` as an argument
        del noted.__wrapped__

    roots = getattr(fn, "__trident_roots__", None)  # trident.compile names its function's owners
    roots = roots if roots is not None else _roots(fn, example_inputs, [f"arg{i}" for i in range(len(example_inputs))])
    try:
        theirs.append(torch._guards.detect_fake_mode(example_inputs))
        # wrap_triton generates TTIR while tracing (Note [Triton's interpreter state])
        # Note [Collectives in regions]: dist.all_reduce & co. traced as functional collectives
        # Note [Module attributes a trace rebinds]: the user's modules as the trace found them
        with triton_state.exclusive(), _state_as_found(roots) as attributes, _launches_as_hops(log), \
                _no_real_compute(), _compiling(dynamic), collectives_as_functional(), logs.torch_analysis_quiet():
            # Tensors the function closes over (module parameters and buffers, a KV cache) become
            # constants of the graph bound to those very tensors (Note [Closed-over tensors]).
            mode = "symbolic" if dynamic else "fake"
            static = {id(example_inputs[i]) for i in static_inputs if isinstance(example_inputs[i], torch.Tensor)}
            with _no_duck_sizes() if dynamic else contextlib.nullcontext(), \
                    _SYMINT_INDEXING.held() if dynamic else contextlib.nullcontext(), \
                    _static_inputs(static) if dynamic and static else contextlib.nullcontext():
                # a library's own torch.compile'd helpers (flash-linear-attention compiles its
                # activations) are traced through, their Python run as written, not refused
                # ("Detected that you are using FX to symbolically trace a dynamo-optimized
                # function"); for this thread (a config override), during the trace
                with dynamo_config.patch(error_on_nested_fx_trace=False), \
                        specializing(example_inputs) if values else contextlib.nullcontext([]) as found:
                    gm = make_fx(noted, DECOMPOSITIONS if values else None, tracing_mode=mode,
                                 _allow_non_fake_inputs=True)(*example_inputs)
                    gm = inline_custom_ops(gm, example_inputs, mode, log)  # Note [Inlining custom ops]
                for node in gm.graph.nodes:  # the modes of the inlining's traces too
                    if node.op == "placeholder":
                        note(getattr(node.meta.get("val"), "fake_mode", None))
        _tag_heuristics(gm, log)
        check_graph(gm)
    except CaptureError:
        _forget_fake_tensors(modes)
        raise
    except Exception as e:  # make_fx wraps user errors in many types; keep the cause
        _forget_fake_tensors(modes)
        where = _user_frame(e)
        depends = data_dependent(e)
        advice = (
            "The function decides something from a tensor's values (a size from nonzero, bool(t), `if t`, "
            "a condition on .item()): one graph cannot hold that. trident.compile(fn) serves such calls through "
            "torch.compile(fn, backend='trident'), which breaks the graph there and serves the rest."
            if depends else
            "Trident captures functions that launch Triton kernels with kernel[grid](...), "
            "wrap_triton, torch.library.triton_op or custom_op, plus ATen ops, on tensor inputs."
        )
        raise CaptureError(
            f"could not capture {getattr(fn, '__name__', fn)!r}: {type(e).__name__}: {_first_part(e)}"
            f"{f' (raised at {where})' if where else ''}\n{advice}", data_dependent=depends
        ) from e
    _forget_fake_tensors(modes)  # Note [A trace leaves no fake tensors in memos]
    _check_rebound(gm, attributes)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constants = {}
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(value, torch.Tensor):
            constants[i] = value
        node.meta.setdefault("trident_input_index", i)
    gm.meta["trident_constant_inputs"] = constants
    # One tensor passed in two positions is traced as one value: the graph reads only one of
    # the placeholders, so later calls must pass one tensor there too (Dynamo guards the same).
    same = []
    for i, value in enumerate(example_inputs):
        if isinstance(value, torch.Tensor):
            first = next((j for j in range(i) if example_inputs[j] is value), None)
            if first is not None:
                same.append((i, first))
    gm.meta["trident_same_inputs"] = same
    gm.meta["trident_num_inputs"] = len(example_inputs)
    gm.meta["trident_traced_values"] = tuple(found)  # Note [Values a trace specializes]
    if dynamic:
        gm.meta["trident_shape_env"] = _shape_env(gm)
    _name_inputs(gm, fn, example_inputs, input_names)
    return gm


# Note [Indexing by a symbolic int]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `table[n]` with n a SymInt (a token count made symbolic, Note [State the function is passed])
# goes through Tensor.__getitem__'s C++ argument parsing, which reads n with __index__ and so
# specializes it: the capture would serve one count only. Dynamo traces __getitem__ itself and
# keeps n symbolic. While a symbolic capture traces, an index that holds SymInts among plain
# ints and slices is applied as the select/slice ops it means (the same ATen ops eager runs),
# which keep n symbolic; every other index takes Tensor.__getitem__ unchanged.
_ORIGINAL_TENSOR_GETITEM = torch.Tensor.__getitem__


def _symint_getitem(self, index):
    items = index if isinstance(index, tuple) else (index,)
    if not any(isinstance(i, torch.SymInt) for i in items) or not all(
        isinstance(i, (int, torch.SymInt, slice)) and not isinstance(i, bool) for i in items
    ):
        return _ORIGINAL_TENSOR_GETITEM(self, index)
    out, dim = self, 0
    for i in items:
        if isinstance(i, slice):
            out = _ORIGINAL_TENSOR_GETITEM(out, (slice(None),) * dim + (i,))
            dim += 1
        else:
            out = out.select(dim, i)
    return out


_SYMINT_INDEXING = SharedPatch(setter(torch.Tensor, "__getitem__", _symint_getitem),
                               setter(torch.Tensor, "__getitem__", _ORIGINAL_TENSOR_GETITEM))


# Note [Static inputs of a symbolic capture]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A symbolic capture gives every size of every input its own symbol. Where the front door knows
# an input's sizes did not change (a KV cache of fixed length while the prompt length varies; a
# Dynamo graph's input whose sizes Dynamo kept static), tracing it with symbols only adds guards
# and sympy work (a 16-layer DynamicCache graph with every cache dimension a symbol traced for
# minutes) and hides facts the trace could use. Such inputs are made fake with static shapes:
# while this thread traces, FakeTensorMode.from_tensor is asked for static shapes for exactly
# those tensors (as Dynamo's automatic dynamic keeps unchanged dimensions static). A later call
# that changes one fails the capture's guards before anything runs, and the door serves it
# otherwise (Note [Symbolic sizes]).
_static_route = threading.local()
_ORIGINAL_FROM_TENSOR = FakeTensorMode.from_tensor


def _from_tensor(self, tensor, *, static_shapes=None, source=None, symbolic_context=None, trace=True):
    ids = getattr(_static_route, "ids", None)
    if ids and id(tensor) in ids and symbolic_context is None:
        static_shapes = True
    return _ORIGINAL_FROM_TENSOR(self, tensor, static_shapes=static_shapes, source=source,
                                 symbolic_context=symbolic_context, trace=trace)


_STATIC_INPUTS = SharedPatch(setter(FakeTensorMode, "from_tensor", _from_tensor),
                             setter(FakeTensorMode, "from_tensor", _ORIGINAL_FROM_TENSOR))


def _static_inputs(ids: set):
    return _thread_route(_STATIC_INPUTS, _static_route, "ids", ids)


@contextlib.contextmanager
def _compiling(on: bool):
    """With symbolic sizes, torch.compiler.is_compiling() is True while Trident traces, as it is
    while torch.export traces with make_fx (torch._export.utils._compiling_state_context) and
    while Dynamo does: libraries take their traceable paths then. Hugging Face's masks, for one,
    skip a data-dependent shortcut (`q_offset == 0` on a cache's tensor) and build the mask every
    size needs, so a prefill can be captured. A static capture keeps the eager paths (a decode
    step's SDPA without a mask, as measured in results/bench_hf_*)."""
    if not on or not hasattr(tc, "_is_compiling_flag"):
        yield
        return
    old = tc._is_compiling_flag
    tc._is_compiling_flag = True
    try:
        yield
    finally:
        tc._is_compiling_flag = old


@contextlib.contextmanager
def _no_duck_sizes():
    """Every input dimension its own symbol, also where two happen to be equal in the example
    (make_fx's default, duck sizing, would tie them: a later call with different sizes could
    not be served). Relations the program needs (a broadcast, a matmul) still become guards.
    The fake-tensor dispatch cache is off meanwhile: with symbolic sizes its hits cost more than
    the dispatches they save (a 16-layer decode step traces in 3.7 s without it, 7.0 s with it,
    on the CPU machine)."""
    cache = {"fake_tensor_cache_enabled": False} if hasattr(dynamo_config, "fake_tensor_cache_enabled") else {}
    with _config.patch(use_duck_shape=False), dynamo_config.patch(**cache):
        yield


def _shape_env(gm: torch.fx.GraphModule):
    """The ShapeEnv of a symbolic trace (None when no value of the graph is symbolic)."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        for v in val.shape if isinstance(val, torch.Tensor) else [val]:
            if isinstance(v, torch.SymInt):
                return v.node.shape_env
    return None


# Note [The caller's names]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# make_fx names a graph's inputs `arg0_1` or `x_1` and the tensors a function closes over
# `_param_constant0` / `_tensor_constant3`; errors, explain() and the SCM IR print those names.
# After tracing they are renamed to what the caller wrote: placeholders after fn's parameters
# (`args_2` for the third of *args; trident.compile passes its arguments' names and pytree
# paths), constants after the first path that reaches them from what fn holds -- the module of a
# bound method (`self`), closure variables, globals the code names, functools.partial
# arguments, non-tensor example inputs (a Cache) -- through modules' parameters and buffers,
# attributes, lists and dicts, a few levels deep. Names are made identifiers (`.` -> `_`); FX
# keeps them unique. Nothing but names changes.
_SEARCH_DEPTH = 5
_SEARCH_BUDGET = 20000  # objects visited at most, for very large object graphs


def _identifier(name: str) -> str:
    text = re.sub(r"\W+", "_", name).strip("_") or "input"
    if text[0].isdigit() or keyword.iskeyword(text):
        text = "_" + text
    if text == "self":  # the generated forward's own first parameter (the module)
        text = "self_"
    return text


def _parameter_names(fn, n: int) -> list[str]:
    if isinstance(fn, torch.nn.Module):  # its __call__ takes (*args, **kwargs): name forward's
        fn = fn.forward
    try:  # a functools.partial's signature already lacks the arguments it binds
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    names = []
    for i in range(n):
        if i < len(positional):
            names.append(positional[i])
        else:
            names.append(f"{star or 'input'}_{i - len(positional)}")
    return names


class _Roots(NamedTuple):
    """(path, object) pairs where the walks start: what the function owns (its `self`, closures,
    the globals it names, a partial's arguments) and what it was passed (non-tensor arguments)."""

    owners: list
    passed: list


def _roots(fn, example_inputs, names) -> _Roots:
    roots: list[tuple[str, Any]] = []
    while isinstance(fn, functools.partial):
        roots += [(f"partial_{i}", a) for i, a in enumerate(fn.args)] + list(fn.keywords.items())
        fn = fn.func
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, types.ModuleType):
        roots.append(("self", owner))
    fn = getattr(fn, "__func__", fn)
    if isinstance(fn, torch.nn.Module):
        roots.append(("self", fn))
        fn = getattr(type(fn).forward, "__func__", type(fn).forward)
    code = getattr(fn, "__code__", None)
    if code is not None:
        cells = getattr(fn, "__closure__", None) or ()
        for name, cell in zip(code.co_freevars, cells):
            try:
                roots.append((name, cell.cell_contents))
            except ValueError:  # an empty cell
                pass
        g = getattr(fn, "__globals__", {})
        roots += [(name, g[name]) for name in _names(code) if name in g]
    return _Roots(roots, [(n, a) for n, a in zip(names, example_inputs) if not isinstance(a, torch.Tensor)])


def _reachable(roots, every: bool = False):
    """(path, object) for every tensor and module reached from `roots` (with `every`, also the
    dicts, lists, tuples, sets and other objects walked through, ending at objects of torch,
    Triton, Trident and the standard library: python_values.foreign), breadth first (so a path is the
    shortest), at most _SEARCH_DEPTH levels and _SEARCH_BUDGET objects: modules, each with its
    submodules (named_modules) and their public attributes that are no module; dicts, lists,
    tuples, sets and the public attributes of other objects. Scalars, types, functions and
    Python modules end a path."""
    seen: set[int] = set()
    level = list(roots)
    budget = _SEARCH_BUDGET
    for _ in range(_SEARCH_DEPTH):
        nxt = []
        for path, obj in level:
            if isinstance(obj, torch.Tensor):
                yield path, obj
                continue
            if id(obj) in seen or budget <= 0 or isinstance(
                obj, (str, bytes, int, float, bool, complex, type(None), type, types.ModuleType, types.FunctionType,
                      types.BuiltinFunctionType, types.MethodType, torch.dtype, torch.device)
            ):
                continue
            seen.add(id(obj))
            budget -= 1
            if every and not isinstance(obj, torch.nn.Module):
                if not isinstance(obj, CONTAINERS) and not keeps_state(obj):
                    continue  # torch's, Triton's, Trident's, the standard library's: their own caches
                yield path, obj
            try:  # raw reads: a subclass's overrides (and an object that cannot be read) end a path
                if isinstance(obj, torch.nn.Module):
                    for n, m in obj.named_modules():
                        sub = f"{path}.{n}" if n else path
                        if m is not obj and id(m) in seen:
                            continue
                        seen.add(id(m))
                        yield sub, m
                        nxt += [(f"{sub}.{k}", v) for k, v in stored_attributes(m).items()
                                if not k.startswith("_") and not isinstance(v, torch.nn.Module)]
                elif isinstance(obj, dict):
                    nxt += [(f"{path}.{k}", v) for k, v in stored_items(obj) if isinstance(k, (str, int))]
                elif isinstance(obj, (list, tuple, collections.deque)):
                    nxt += [(f"{path}.{i}", v) for i, v in enumerate(stored_items(obj))]
                elif isinstance(obj, (set, frozenset)):
                    nxt += [(path, v) for v in stored_items(obj)]
                else:
                    nxt += [(f"{path}.{k}", v) for k, v in stored_attributes(obj).items() if not k.startswith("_")]
            except Exception:  # noqa: BLE001 - changed meanwhile, or unreadable
                continue
        level = nxt


def _tensor_paths(roots) -> dict[int, str]:
    """id(tensor) -> the first (shortest) path reaching it from `roots`."""
    found: dict[int, str] = {}
    for path, obj in _reachable(roots):
        if isinstance(obj, torch.nn.Module):  # its own parameters and buffers (a submodule comes on its own)
            for n, t in (*obj.named_parameters(recurse=False, remove_duplicate=False),
                         *obj.named_buffers(recurse=False, remove_duplicate=False)):
                found.setdefault(id(t), f"{path}.{n}")
        else:
            found.setdefault(id(obj), path)
    return found


def _name_inputs(gm: torch.fx.GraphModule, fn, example_inputs, input_names) -> None:
    """Note [The caller's names]."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if input_names is not None and len(input_names) != len(example_inputs):
        raise CaptureError(
            f"capture: input_names has {len(input_names)} name(s) for {len(example_inputs)} example input(s); "
            "give one name per example input"
        )
    names = list(input_names) if input_names is not None else _parameter_names(fn, len(example_inputs))
    if len(placeholders) == len(names):
        for node, name in zip(placeholders, names):
            node._rename(_identifier(name))
            node.target = node.name
    constants = [n for n in gm.graph.nodes if n.op == "get_attr"]
    if constants:
        roots = getattr(fn, "__trident_roots__", None)  # trident.compile names its function's owners
        roots = roots if roots is not None else _roots(fn, example_inputs, names)
        paths = _tensor_paths(roots.owners + roots.passed)
        for node in constants:
            value = getattr(gm, node.target, None)
            path = paths.get(id(value)) if isinstance(value, torch.Tensor) else None
            if path is not None:
                node._rename(_identifier(path))
    gm.recompile()
