"""trident.compile(fn): the Dynamo-free front door.

Note [What trident.compile guards]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The first call with a given input signature runs `fn` eagerly (state that programs create
lazily on their first call, an HF Cache's tensors, then exists as real tensors); the function's
next call captures it (trident.capture, over the flattened tensors, from the state as it was
before that first call: Note [Captured after its first call]) and optimizes it, unless the next
call is of the same family and gets the family's symbolic capture; later calls with that
signature, its second one included, go straight into the optimized graph, whose guards on tensors are native:
torch's own TensorGuards (the C++ checks of Dynamo's frames: dtype, device, sizes, strides,
dispatch keys; ~0.1 µs a tensor) pick the capture among those of one structure, then the SCM's
guards run as always. Python computes per call only what is not a tensor:
  * the pytree structure of (args, kwargs): positional count, keyword names, nesting of tuples,
    lists, dicts and registered pytree nodes;
  * the state of every other object among the arguments (Note [State the function is passed]):
    its class, attribute names and containers, its tensors (inputs of the capture, like the
    arguments' tensors) and Python values; an object's identity is not part of it (a new HF
    Cache of the same shape reuses the capture of the last one);
  * per tensor: its place only; dtype, device, sizes and strides are the native guards'
    (a new shape is a new capture, cached; only then are they computed in Python, to key it);
  * per int: its value, compared with the capture's, except ints that changed between calls
    (made symbolic, below); per other value (float, bool, str, None, dtype, device) its value;
    per opaque object (a module, a function passed as an argument) its identity;
  * a process-wide count of nn.Module parameter and buffer registrations: assigning a new
    Parameter or buffer to any module (`m.weight = nn.Parameter(...)`, `register_buffer`)
    makes the next call capture again (torch's registration hooks; nothing is walked per call).
After each call of a capture, what the function did to the objects it was passed (tensors it
assigned, counters it advanced) is done to the caller's objects (Note [State the function is
passed]).
Sizes (`dynamic`, as torch.compile's; Note [Symbolic sizes]): with the default (None) the first
capture of a family of signatures (one structure, tensor dtypes, devices and ranks) is static; a
later signature of the family that differs in sizes, strides or ints is captured once more with
symbolic sizes, and that capture serves every size after it (its TensorGuards check dtype,
device and rank; the SCM's native guards the sizes). Ints that differed are symbolic in it too
(as Dynamo's automatic dynamic: a token count that advances every step is served by one
capture). Sizes and ints 0 and 1 are specialized by the symbolic trace, so each as 0, 1 or
"2 or more" is part of the structure. A symbolic capture that cannot serve a call (a size the
traced code compared) raises before running anything; that call goes to another symbolic capture
of its family, or gets one of its own (Note [Symbolic regimes]: a sliding window that filled),
or past REGIMES of them a static capture. dynamic=True: symbolic from the first capture; False:
a static capture per signature.
A call Trident cannot capture (CaptureError, UnsupportedError) runs eagerly for its signature,
with a warning (`eager_reason`), as torch.compile(backend="trident") does; explain() says for
every eager call why, naming the leaf that changed (`cache.seen: 33 -> 34`). Except a call whose
trace failed on a tensor's values: its family goes through torch.compile(backend="trident")
(Note [Data-dependent calls through Dynamo]).
At most TRIDENT_CAPTURES (32) captures per function; past it calls of new signatures run eagerly
(Note [One capture cache], the same rule as the backend's).
NOT guarded: Python globals and module attributes other than registered parameters and buffers
(a flag on the module, `model.config` values, a plain tensor attribute rebound to a new tensor)
when the caller changes them between calls; what the function itself changes on its modules
sends it through Dynamo (Note [Module attributes a trace rebinds]).
Tensors the function reads without being passed them are bound by identity (Note [Closed-over
tensors]): their in-place updates are seen.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import operator
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import sympy
import torch
import torch.utils._pytree as pytree

try:  # the flag Dynamo reads before refusing a call under FX tracing (torch 2.13)
    from torch.fx._symbolic_trace import is_fx_symbolic_tracing
except ImportError:  # older torch: the same process-wide flag
    from torch.fx._symbolic_trace import is_fx_tracing as is_fx_symbolic_tracing

from .. import logs, triton_state
from ..capture.trace import _roots, capture
from ..errors import CaptureError, GuardError, TridentError
from ..optimize import lend_carried, optimize
from . import fast_walk, state
from .cache import CaptureCache, ServedByCache, retry_static

_VALUE_TYPES = (int, float, bool, str, type(None))
_TENSOR = object()  # a tensor's place in a signature and an output template
_INT = object()  # an int's place in a structure (its value is compared apart)
_generation = [0]  # bumped by torch's parameter/buffer registration hooks
_hooks_installed = False
_hooks_lock = threading.Lock()


# Note [Recompiles per layer]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A model whose step goes through Dynamo (Note [Data-dependent calls through Dynamo]) has graph
# breaks inside its layers (flash-linear-attention unpads the tokens by the attention mask with
# nonzero in every layer), so each layer's forward is a frame of its own, run once per layer per
# step. Dynamo guards on the int attributes of a module (`self.layer_idx == 0`), so that frame
# gets an entry per layer, and past torch._dynamo.config.recompile_limit (8) it runs eagerly for
# every other layer, with one warning: flash-linear-attention's 24-layer GLA ran 16 of its
# layers eagerly, 1.16x eager on the H200 at 9399712. Dynamo's own budget for one frame is per
# instance of a module it guards by identity (torch/_dynamo/cache_size.py); layers told apart by
# an int attribute are not, so the budget is given here, the same per instance:
# recompile_limit entries for each instance of the module class the function's module holds
# most of (`recompile_limit_for`; the function's module: the function if it is one, or the
# module of a bound method). Through torch.compile's own `recompile_limit` where torch has it
# (2.13); before that, the process's limit is raised while a call runs (_RecompileLimitWindow:
# nested and concurrent calls share one window, the user's value comes back when the last one
# leaves). accumulated_recompile_limit (256 entries per code object) stays the user's: a frame
# that recompiles on every call still falls back to eager.
_COMPILE_TAKES_RECOMPILE_LIMIT = "recompile_limit" in inspect.signature(torch.compile).parameters


def recompile_limit_for(fn) -> Optional[int]:
    """Note [Recompiles per layer]: the recompile limit for `fn`'s frames under Dynamo, or None
    (the user's) when its module repeats no class."""
    module = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
    if not isinstance(module, torch.nn.Module):
        return None
    # modules holding others (layers, blocks): a leaf module (a Linear) runs inside its
    # parent's frame, and counting the Linears would make the budget 8 x 241 for a 24-layer GLA
    counts = collections.Counter(type(m) for m in module.modules() if next(m.children(), None) is not None)
    most = max(counts.values(), default=1)
    config = torch._dynamo.config
    with _RecompileLimitWindow._lock:  # the user's own limit, also while a window raises it
        limit = _RecompileLimitWindow._saved if _RecompileLimitWindow._depth else config.recompile_limit
    return min(limit * most, max(config.accumulated_recompile_limit, limit)) if most > 1 else None


class _RecompileLimitWindow:
    """Note [Recompiles per layer], torch without torch.compile(recompile_limit=): the process's
    recompile limit at least `limit` while any such call runs."""

    _lock = threading.Lock()
    _depth = 0
    _saved: Optional[int] = None  # the user's limit, while a window is open
    _set: Optional[int] = None  # what the windows set it to

    def __init__(self, limit: Optional[int]):
        self.limit = limit

    def __enter__(self):
        if self.limit is None:
            return self
        config = torch._dynamo.config
        with _RecompileLimitWindow._lock:
            if _RecompileLimitWindow._depth == 0:
                _RecompileLimitWindow._saved = config.recompile_limit
            _RecompileLimitWindow._depth += 1
            config.recompile_limit = _RecompileLimitWindow._set = max(config.recompile_limit, self.limit)
        return self

    def __exit__(self, *exc):
        if self.limit is None:
            return
        with _RecompileLimitWindow._lock:
            _RecompileLimitWindow._depth -= 1
            config = torch._dynamo.config
            # the user's value back, unless someone set another while the window was open
            if _RecompileLimitWindow._depth == 0 and config.recompile_limit == _RecompileLimitWindow._set:
                config.recompile_limit = _RecompileLimitWindow._saved

_tracing = threading.local()  # set while this thread captures: make_fx registers the graph's constants


def _bump(module, *_args, **_kwargs):
    if getattr(_tracing, "active", False) or isinstance(module, torch.fx.GraphModule):
        return
    _generation[0] += 1


def _install_hooks() -> None:
    global _hooks_installed
    with _hooks_lock:
        if not _hooks_installed:
            torch.nn.modules.module.register_module_parameter_registration_hook(_bump)
            torch.nn.modules.module.register_module_buffer_registration_hook(_bump)
            _hooks_installed = True


class _Identity:
    """A signature entry for an object matched by identity. It holds the object, so its id
    cannot be reused by another object while a capture keyed by it exists."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.obj is self.obj


def signature(leaves, tensor_facts: bool = True) -> tuple:
    """The key of a call: per tensor its dtype, device, sizes and strides (only its place, with
    tensor_facts=False: native guards check the rest), per value its value, else identity."""
    key = []
    for a in leaves:
        if isinstance(a, torch.Tensor):
            key.append((a.dtype, a.device, tuple(a.shape), tuple(a.stride())) if tensor_facts else _TENSOR)
        elif isinstance(a, _VALUE_TYPES):
            key.append((type(a), a))
        else:
            key.append(_Identity(a))
    return tuple(key)


def _entry(a):
    """A leaf's part of a structure: tensors and ints by place, other values by value, walked
    objects by class (their contents are leaves of their own), anything else by identity."""
    if isinstance(a, torch.Tensor):
        return _TENSOR
    if type(a) is int:
        return _INT
    if isinstance(a, state.VALUE_TYPES):
        return (type(a), a)
    if state.walkable(a):
        return type(a)
    return _Identity(a)


_ARGUMENT_STATE_ITEMS = state.MAX_LEAVES // 4  # longer lists and dicts stay pytree nodes


def _changeable_container(kwargs):
    """pytree's is_leaf for a call's arguments: a list or dict argument (at any depth of the
    arguments' tuples; by exact type, state.ARGUMENT_CONTAINERS) is a leaf -- an object whose
    state is walked -- except `kwargs` itself, a dict with a key the walk cannot follow (not a
    str or int: the walk would keep the dict whole, its tensors constants) and a container too
    long to walk within MAX_LEAVES."""
    def is_leaf(x):
        if x is kwargs or type(x) not in state.ARGUMENT_CONTAINERS or len(x) > _ARGUMENT_STATE_ITEMS:
            return False
        return type(x) is list or state.followable_keys(x)

    return is_leaf


def flatten_arguments(args, kwargs):
    """The pytree leaves and spec of (args, kwargs), lists and dicts among them kept whole (Note
    [State the function is passed]: a function that replaces an entry of a dict or list it is
    passed -- `state[i] = state[i] + x` -- changes the caller's container; flattened into their
    tensors, the capture's writes to them had no place to go and the caller kept the old
    entries)."""
    return pytree.tree_flatten((args, kwargs), is_leaf=_changeable_container(kwargs))


class _Call:
    """One call flattened (Note [State the function is passed]): the pytree leaves of (args,
    kwargs), then the leaves of the state of the objects among them."""

    __slots__ = ("args", "kwargs", "spec", "n_args", "roots", "root_pos", "walk", "leaves", "tensor_pos",
                 "int_pos", "tensors", "ints", "structure")

    def __init__(self, args, kwargs, dynamic):
        self.args, self.kwargs = args, kwargs
        arg_leaves, self.spec = flatten_arguments(args, kwargs)
        self.n_args = len(arg_leaves)
        self.root_pos = [i for i, a in enumerate(arg_leaves) if state.walkable(a)]
        self.roots = [arg_leaves[i] for i in self.root_pos]
        self.walk = state.walk(self.roots)
        self.leaves = leaves = arg_leaves + [v for _, _, v in self.walk.leaves]
        # one pass over the leaves (every call makes a _Call): places of tensors and ints, and
        # each leaf's entry in the structure (what _entry says, inlined)
        tensor_pos, int_pos, entries = [], [], []
        for i, a in enumerate(leaves):
            if isinstance(a, torch.Tensor):
                tensor_pos.append(i)
                entries.append(_TENSOR)
            elif type(a) is int:
                int_pos.append(i)
                entries.append(_INT)
            else:
                entries.append(_entry(a))
        self.tensor_pos, self.int_pos = tensor_pos, int_pos
        self.tensors = tensors = [leaves[i] for i in tensor_pos]
        self.ints = ints = tuple(leaves[i] for i in int_pos)
        nodes = tuple((r, steps, kind, keys) for r, steps, _, kind, keys in self.walk.nodes)
        places = tuple((r, steps) for r, steps, _ in self.walk.leaves)
        structure = (self.spec, tuple(entries), nodes, places, self.walk.truncated)
        if dynamic is not False:  # what a symbolic trace specializes on: 0, 1 or 2 (>= 2) per size and int
            structure += (
                tuple(tuple(s if s < 2 else 2 for s in t.shape) for t in tensors),
                tuple(n if n < 2 else 2 for n in ints),
            )
        self.structure = structure

    @classmethod
    def checked(cls, args, kwargs, like: "_Call", leaves: list, tensors: list, ints: tuple) -> "_Call":
        """A call a generated structure check found to have `like`'s structure (Note [Generated
        structure checks]); it has no walk (a miss path that needs one walks again)."""
        call = cls.__new__(cls)
        call.args, call.kwargs, call.spec, call.n_args = args, kwargs, like.spec, like.n_args
        call.root_pos, call.roots, call.walk = like.root_pos, [leaves[i] for i in like.root_pos], None
        call.leaves, call.tensor_pos, call.int_pos = leaves, like.tensor_pos, like.int_pos
        call.tensors, call.ints, call.structure = tensors, ints, like.structure
        return call

    def key(self) -> tuple:
        """The exact signature: the structure, every tensor's facts, every int's value."""
        return (self.structure, signature(self.tensors), self.ints)

    def family(self) -> tuple:
        """Signatures that differ in sizes, strides and ints only."""
        return (self.structure, tuple((t.dtype, t.device, t.dim()) for t in self.tensors))


@dataclass
class _Outputs:
    """What a capture returns besides its graph's outputs (Note [State the function is passed])."""

    spec: Any  # the pytree spec of fn's result
    template: list  # per result leaf: _TENSOR, ("int", SymbolicInt), ("path", (root, steps)) or ("const", v)
    n_user: int  # the graph's first n_user outputs are the result's tensors; the rest feed `writes`
    writes: list  # state.Write
    dynamic_ints: tuple  # positions among the call's ints passed as symbolic sizes


@dataclass
class _Pending:
    """A signature's first call, kept until the next call (Note [Captured after its first call])."""

    call: "_Call"
    key: tuple
    family: tuple
    before: Any  # state.Snapshot of the objects it was passed, taken before it ran
    dynamic_ints: tuple
    static: tuple
    thread: int  # the thread that made it: settled from that thread only
    context: tuple  # _context() when it ran: settled under the same only


# Note [Calls that need grad]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `trident.scm` has no derivative: a capture's outputs carry no autograd history. With grad
# enabled, a call whose tensors require grad -- an argument's (a tensor the walk reaches), or one
# the capture closes over (a module's parameter read as an attribute of the graph) -- runs
# eagerly, so that a training step's backward is eager's; before, it was captured and backward
# silently gave no gradient. Both are read per call, never remembered: a parameter unfrozen
# (`requires_grad_(True)`) after a capture is seen at once, and one frozen after is served
# again. The capture itself is made as for any call (under grad too: the trace takes no
# gradient), so the same signature under torch.no_grad() or torch.inference_mode() is served.
# Conservative: a parameter only a Triton kernel reads (no autograd through it in eager either)
# also sends grad-mode calls to eager. With grad off the hit path pays two calls of
# torch.is_grad_enabled() (the arguments' check, _run's); with it on, a requires_grad read per
# tensor reached.
def _needs_grad(what: str) -> str:
    return (f"grad is enabled and {what} requires grad: Trident is inference only (a capture has no derivative), "
            "so the call runs eagerly; call it under torch.no_grad() or torch.inference_mode() to have it served")


def _held_tensors(opt) -> tuple:
    """The tensors a capture closes over (its graph's attributes: parameters, constants)."""
    held = opt.meta.get("trident_held_tensors")
    if held is None:
        held = tuple(v for v in (operator.attrgetter(n.target)(opt) for n in opt.graph.nodes if n.op == "get_attr")
                     if isinstance(v, torch.Tensor))
        opt.meta["trident_held_tensors"] = held
    return held


def _context() -> tuple:
    """What a trace depends on besides the call's key: grad and inference modes, autocast, the
    default dtype (Note [Captured after its first call])."""
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype(),
            *((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")))


CHECKS = 4  # generated structure checks per function (Note [Generated structure checks])
REGIMES = 4  # symbolic captures per family of signatures (Note [Symbolic regimes])


class _Check:
    """A generated structure check, the call it was made from (whose structure it vouches for,
    the objects of that call not kept), and the captures of the structure as last looked up."""

    __slots__ = ("fn", "source", "like", "looked_up")

    def __init__(self, fn, source: str, call: "_Call"):
        self.fn, self.source = fn, source
        like = self.like = _Call.__new__(_Call)  # the layout of the call, not its objects
        like.spec, like.n_args, like.root_pos, like.structure = call.spec, call.n_args, call.root_pos, call.structure
        like.tensor_pos, like.int_pos = call.tensor_pos, call.int_pos
        self.looked_up = (None, ())  # (the _guarded table, the structure's entries in it)


@dataclass
class _Entry:
    """A capture reachable from a structure: its native tensor guards, the ints it fixes."""

    guards: Any
    int_positions: tuple
    int_values: tuple
    key: tuple
    family: tuple  # the _Call.family() it was captured for: what REGIMES counts per
    opt: Any = None  # the capture and its _Outputs, held here: the hit path hashes no key
    info: Any = None
    ints_of: Any = None  # the call's ints at int_positions, as a tuple (one C call on the hit path)

    def __post_init__(self):
        positions = self.int_positions
        if not positions:
            self.ints_of = lambda ints: ()
        elif len(positions) == 1:
            pick = operator.itemgetter(positions[0])
            self.ints_of = lambda ints: (pick(ints),)
        else:
            self.ints_of = operator.itemgetter(*positions)


class CompiledFunction(ServedByCache):
    """What trident.compile returns (Note [What trident.compile guards])."""

    def __init__(self, fn: Callable[..., Any], dynamic: Optional[bool] = None):
        self.fn = fn
        self.dynamic = dynamic
        self._structures: set = set()  # families called at least once (Note [Symbolic sizes])
        self._symbolic_failed: set = set()  # families whose symbolic capture could not be made
        self._family_ints: dict = {}  # family -> the ints of its first call
        self._family_dynamic: dict = {}  # family -> positions of ints that changed within it
        self._family_layouts: dict = {}  # family -> its first call's tensor sizes and strides
        self.cache = CaptureCache(f"trident.compile({getattr(fn, '__name__', 'fn')})")  # Note [One capture cache]
        self._outputs: dict[tuple, _Outputs] = {}
        # per structure: [_Entry], static captures first; replaced, never mutated, so the hit
        # path reads it without the lock
        self._guarded: dict[tuple, list] = {}
        self._seen: dict = {}  # signatures called once (eagerly) -> the leaves that changed then, described
        self._pending: Optional[_Pending] = None  # Note [Captured after its first call]
        self._last: Optional[dict] = None  # the leaves of the last call that missed, described
        self._checks: tuple = ()  # _Check per structure that served a call, most recent first
        self._check_tried: set = set()  # structures a check was made (or refused) for
        # Note [Data-dependent calls through Dynamo]
        self._dynamo_families: set = set()
        self._made_families: dict = {}  # of those, the ones refused for an object they make -> why (Note [Objects made per call])
        self._dynamo_fn: Optional[Callable[..., Any]] = None
        self._recompile_limit: Optional[int] = None  # Note [Recompiles per layer]
        self.dynamo_reason: Optional[str] = None
        self.dynamo_calls = 0
        self._generation = _generation[0]
        functools.update_wrapper(self, fn, updated=())

    # Dynamo never traces into a trident.compile'd function (HF's generate() compiles the model's
    # __call__ around it for static caches): it calls it, as a torch.compiler.disable'd function.
    @torch.compiler.disable
    def __call__(self, *args, **kwargs):
        if self._generation != _generation[0]:  # a parameter or buffer was (re)assigned somewhere
            self.reset()
        call = None
        checks = self._checks  # replaced, never mutated: one snapshot for this call
        for check in checks:  # Note [Generated structure checks]
            got = check.fn(args, kwargs)
            if got is not None:
                call = _Call.checked(args, kwargs, check.like, *got)
                guarded = self._guarded
                table, entries = check.looked_up
                if table is not guarded:  # the captures changed (the table is replaced, never mutated)
                    entries = guarded.get(call.structure, ())
                    check.looked_up = (guarded, entries)
                if check is not checks[0]:  # the structure that served last is tried first
                    self._promote(check)
                break
        else:
            call = _Call(args, kwargs, self.dynamic)
            entries = self._guarded.get(call.structure, ())
        # The hit path: tensors checked by native guards only (torch's own TensorGuards, those
        # Dynamo's frames use: dtype, device, sizes, strides, dispatch keys; for a symbolic
        # capture dtype, device and rank, the SCM's guards check the sizes).
        ints = call.ints
        if torch.is_grad_enabled() and any(t.requires_grad for t in call.tensors):
            entries = ()  # Note [Calls that need grad]: no capture serves it
        for e in entries:
            if e.ints_of(ints) == e.int_values and e.guards.check(*call.tensors):
                if call.walk is not None and call.structure not in self._check_tried:
                    self._add_check(call)
                if self._pending is not None:
                    self._settle(None)
                return self._run(e.opt, e.key, call, e.info)
        if call.walk is None:  # the miss path reads the walk
            call = _Call(args, kwargs, self.dynamic)
        return self._miss(call)

    # The hit path never waits for the capture cache's lock (another thread may hold it for a
    # whole capture): reordering or adding a check is skipped when it is taken, and tried again
    # at a later hit.
    def _promote(self, check: "_Check") -> None:
        if not self.cache.lock.acquire(blocking=False):
            return
        try:
            if check in self._checks:
                self._checks = (check, *(c for c in self._checks if c is not check))
        finally:
            self.cache.lock.release()

    def _promote_entry(self, structure, entry: "_Entry") -> None:
        """A symbolic capture that served a call another refused goes first among the
        structure's symbolic captures (Note [Symbolic regimes]: the calls after it are likely of
        its regime); skipped when the lock is taken, as _promote."""
        if not self.cache.lock.acquire(blocking=False):
            return
        try:
            entries = self._guarded.get(structure, ())
            if not any(e is entry for e in entries):
                return
            n = sum(1 for e in entries if not e.opt.meta.get("trident_symbolic"))
            if n < len(entries) and entries[n] is not entry:
                rest = [e for e in entries[n:] if e is not entry]
                self._guarded = {**self._guarded, structure: [*entries[:n], entry, *rest]}
        finally:
            self.cache.lock.release()

    def _add_check(self, call: _Call) -> None:
        """Note [Generated structure checks]: a structure that served a call gets its check, the
        most recent first, at most CHECKS of them (a structure dropped past it keeps the generic
        walk: regenerating on every call would cost more than the walk)."""
        if not self.cache.lock.acquire(blocking=False):
            return
        try:
            if call.structure in self._check_tried:
                return
            self._check_tried.add(call.structure)
            fn, source = fast_walk.make_checker(call, self.dynamic, _leaf_names(self.fn, call.args, call.kwargs))
            if fn is None:
                logs.misses.debug("trident.compile(%s): no generated structure check: %s", self._name, source)
                return
            self._checks = (_Check(fn, source, call), *self._checks)[:CHECKS]
        finally:
            self.cache.lock.release()

    def reset(self) -> None:
        """Forget every capture (the next calls capture again), as after a parameter is assigned."""
        with self.cache.lock:
            self.cache.clear()
            for table in (self._outputs, self._structures, self._symbolic_failed,
                          self._family_ints, self._family_dynamic, self._family_layouts):
                table.clear()
            self._guarded = {}  # replaced, never mutated: a check's looked_up entries go stale with it
            self._seen = {}
            self._pending = None
            self._checks, self._check_tried = (), set()
            self._dynamo_families, self._dynamo_fn, self._recompile_limit = set(), None, None
            self._made_families = {}
            self.dynamo_reason, self.dynamo_calls = None, 0
            self._generation = _generation[0]

    def _miss(self, call: _Call):
        if self._pending is not None:
            self._settle(call)
        if self._dynamo_families and call.family() in self._dynamo_families:
            return self._not_captured(call)
        if call.walk is not None and call.walk.truncated:  # leaves past the bound: no capture sees them
            return self._eager(call, f"the objects among its arguments hold more than {state.MAX_LEAVES} leaves "
                                     "(tensors, values, objects): past that bound their state is not seen")
        if torch.is_grad_enabled():  # Note [Calls that need grad]
            needs = next((i for i in call.tensor_pos if call.leaves[i].requires_grad), None)
            if needs is not None:
                return self._eager(call, _needs_grad(self._leaf_names(call)[needs]))
        key = call.key()
        opt = self.captures.get(key)
        if opt is None and key in self.cache.refused:  # Trident cannot capture it: eager, as the backend does
            return self._eager(call, self.cache.refused[key])
        if opt is not None:
            return self._run(opt, key, call)
        with self.cache.lock:
            opt = self.captures.get(key)
            family = call.family()
            dynamic_ints, static = self._family_facts(call, family)
            # A symbolic capture (Note [Symbolic sizes]) once a second signature of one
            # family comes (sizes or ints changed: as torch.compile's automatic dynamic shapes),
            # or from the first capture with dynamic=True.
            symbolic = opt is None and family not in self._symbolic_failed and (
                self.dynamic is True or (self.dynamic is None and family in self._structures and key not in self._seen)
            )
            first = opt is None and key not in self._seen and (self.dynamic is False or family not in self._structures)
            self._structures.add(family)
            reason = None
            if first:
                reason, self._seen[key] = self._why_new(call)
                if self.cache.full():  # not "run eagerly once": past the bound every call of it is eager
                    reason = self.cache.overflow() + (f" ({self._seen[key]})" if self._seen[key] else "")
            elif opt is None and self.cache.full():
                changed = self._seen.get(key) or self._changed(call)
                reason = self.cache.overflow() + (f" ({changed})" if changed else "")
            elif opt is None:
                opt, reason = self._capture_new(call, key, family, symbolic, dynamic_ints, static)
        if first and not self.cache.full():
            return self._eager_first(call, key, family, reason, dynamic_ints, static)
        if opt is None and family in self._dynamo_families:
            return self._not_captured(call)
        if opt is None:
            return self._eager(call, reason)
        return self._run(opt, key, call)

    def _family_facts(self, call: _Call, family) -> tuple[tuple, tuple]:
        """(the positions of the ints made symbolic, the tensors kept static) in a symbolic
        capture of `call`'s family, with what its calls so far changed. Under the lock."""
        first_ints = self._family_ints.setdefault(family, call.ints)
        dynamic_ints = tuple(sorted(set(self._family_dynamic.get(family, ())) | {
            i for i, (a, b) in enumerate(zip(first_ints, call.ints)) if a != b and a >= 0 and b >= 2
        }))
        self._family_dynamic[family] = dynamic_ints
        layouts = tuple((tuple(t.shape), tuple(t.stride())) for t in call.tensors)
        first_layouts = self._family_layouts.setdefault(family, layouts)
        # with dynamic=None, tensors whose layout has not changed within the family stay
        # static in its symbolic capture (Note [Static inputs of a symbolic capture])
        static = () if self.dynamic is True else tuple(
            k for k, (a, b) in enumerate(zip(first_layouts, layouts)) if a == b)
        return dynamic_ints, static

    def _capture_new(self, call: _Call, key, family, symbolic: bool, dynamic_ints: tuple, static: tuple):
        """(the capture registered for `key`, None) or (None, why the call runs eagerly): a
        symbolic capture first where asked, then a static one (Note [Symbolic sizes]). Under the lock."""
        opt = reason = None
        if symbolic:
            try:
                opt = self._capture(call, key, dynamic=True, dynamic_ints=dynamic_ints, static=static)
            except Exception as e:  # noqa: BLE001 - served by a static capture instead
                self._symbolic_failed.add(family)
                logs.misses.info(
                    "trident.compile(%s): no symbolic capture (%s: %s); capturing these sizes statically",
                    self._name, type(e).__name__, str(e).splitlines()[0],
                )
        if opt is None:
            try:
                opt = self._capture(call, key)
            except TridentError as e:
                if not symbolic and self.dynamic is not False and family not in self._symbolic_failed and \
                        not getattr(e, "new_object", False) and \
                        not getattr(e, "module_state", False):  # sizes do not change what it returns or rebinds
                    try:  # a symbolic trace takes libraries' traceable paths (HF prefill)
                        opt = self._capture(call, key, dynamic=True, dynamic_ints=dynamic_ints)
                    except Exception:  # noqa: BLE001 - the static error is the one to report
                        self._symbolic_failed.add(family)
                if opt is None and getattr(e, "data_dependent", False):
                    opt, e = self._static_by_value(call, key, e)
                if opt is None and any(getattr(e, flag, False) for flag in ("data_dependent", "new_object", "module_state")):
                    self._dynamo_families.add(family)  # Note [Data-dependent calls through Dynamo]
                    if getattr(e, "new_object", False):
                        self._made_families[family] = str(e).splitlines()[0]
                    if getattr(e, "data_dependent", False):
                        how = ("the trace decides on a tensor's values", "goes through torch.compile(backend="
                               "'trident'), which breaks the graph there")
                    elif getattr(e, "module_state", False):  # Note [Module attributes a trace rebinds]
                        how = ("the call changes state it keeps outside its arguments", "goes through "
                               "torch.compile(backend='trident'), which replays the change")
                    else:  # Note [Objects made per call]
                        how = ("the call returns an object it made", "runs eagerly once the function has captures, "
                               "through torch.compile(backend='trident') until then, which rebuilds the object")
                    self.dynamo_reason = reason = f"{how[0]} ({str(e).splitlines()[0]}): this family of signatures {how[1]}"
                    logs.misses.warning("trident.compile(%s): %s", self._name, reason)
                elif opt is None:
                    reason = self.cache.refuse(key, e)
        if opt is not None and key not in self.captures:
            self._register(call, key, opt)
        return opt, reason

    # Note [Captured after its first call]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # A signature's first call runs eagerly (state a program makes on its first call -- an HF
    # Cache's layers, a module's lazily built tables -- then exists). Capturing it only when it
    # came again put that capture, and its measurements, on the second sighting: HF generate()
    # makes its prefill once per call, so the second generate() paid the prefill's capture
    # (391 ms/token on the H200 at c26d638, where eager runs 15). So the first call is kept,
    # pending (its arguments and a `state.Snapshot` of the objects it was passed, taken before
    # it ran), and the function's next call settles it before running:
    #   * the next call is of the same family with other sizes or ints, and will get the
    #     family's symbolic capture (Note [Symbolic sizes]): that capture serves both, and the
    #     pending one is dropped (a decode's first step, whose second step comes next);
    #   * the next call has the same signature: it is captured as before, from that call;
    #   * otherwise (another family, a hit, dynamic=False): the pending call is captured now,
    #     as the second sighting would have been, from its own state: the objects get back what
    #     they held before it ran, the trace runs on them (Note [State the function is passed]),
    #     and they get back what they hold now.
    # Dropped instead: a pending call settled from another thread (its objects may be in use
    # there) or under another autocast, grad or default-dtype context (not part of the key);
    # with dynamic=False (a static capture per signature: every decode step would be one). A
    # capture that fails here is logged and left to the signature's second sighting: the call
    # settling it runs as it would have. A hit settles only when the capture cache's lock is
    # free (the hit path never waits for a capture). The pending call holds its arguments and
    # the tensors its state held until the next call.
    # A signature called once and never followed by another call is never captured. The trace
    # runs the function's Python once more, as any capture does (side effects outside the state
    # it is passed are NOT guarded: Note [What trident.compile guards]).
    def _eager_first(self, call: _Call, key, family, reason: str, dynamic_ints: tuple, static: tuple):
        if self.dynamic is False:
            return self._eager(call, reason)
        before = state.Snapshot(call.walk)
        result = self._eager(call, reason)
        self._pending = _Pending(call, key, family, before, dynamic_ints, static, threading.get_ident(), _context())
        return result

    def _settle(self, call: Optional[_Call]) -> None:
        """Capture or drop the pending first call (Note [Captured after its first call]);
        `call`: the call now missing, None for a hit."""
        if not self.cache.lock.acquire(blocking=call is not None):
            return
        try:
            p, self._pending = self._pending, None
            if p is None or p.key in self.captures or p.key in self.cache.refused or self.cache.full():
                return
            if p.thread != threading.get_ident() or p.context != _context():
                return
            if call is not None:
                key = call.key()
                if key == p.key:  # its second sighting: captured from this call
                    return
                if call.family() == p.family and p.family not in self._symbolic_failed:
                    return  # the family's symbolic capture, made for this call, serves both
            after = state.Snapshot(state.walk(p.call.roots))
            after.cover(p.before)  # everything the restore below touches gets its contents back
            p.before.restore()
            try:
                self._capture_new(p.call, p.key, p.family, self.dynamic is True, p.dynamic_ints, p.static)
            except Exception as e:  # noqa: BLE001 - left to the second sighting, which raises it there
                logs.misses.info("trident.compile(%s): the first call's capture failed (%s: %s); "
                                 "captured at its next call instead", self._name, type(e).__name__,
                                 str(e).splitlines()[0] if str(e) else "")
            finally:
                after.restore()
        finally:
            self.cache.lock.release()

    @property
    def _name(self) -> str:
        return getattr(self.fn, "__name__", "fn")

    def _register(self, call: _Call, key, opt) -> None:
        key = opt.meta.get("trident_key", key)  # a capture with values specialized has its own
        self.cache.add(key, opt)
        info = self._outputs[key]
        symbolic = opt.meta.get("trident_symbolic", False)
        fixed = tuple(i for i in range(len(call.ints)) if i not in info.dynamic_ints)
        entry = _Entry(_tensor_guards(call.tensors, symbolic), fixed, tuple(call.ints[i] for i in fixed), key,
                       call.family(), opt, info)
        entries = [e for e in self._guarded.get(call.structure, ()) if e.key != key]
        # static captures first: a symbolic one serves what none of them does; the newest
        # symbolic capture before the others (Note [Symbolic regimes])
        if not symbolic:
            entries = [entry] + entries
        else:
            n = sum(1 for e in entries if not e.opt.meta.get("trident_symbolic"))
            entries = entries[:n] + [entry] + entries[n:]
        self._guarded = {**self._guarded, call.structure: entries}

    def _drop(self, old) -> None:
        self.cache.drop(old)
        self._outputs.pop(old, None)
        self._seen.pop(old, None)
        self._guarded = {s: [e for e in entries if e.key != old] for s, entries in self._guarded.items()}

    # Note [Data-dependent calls through Dynamo]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # A function that decides something from a tensor's values -- a size from nonzero (a
    # library unpadding its tokens by the attention mask), a Triton constexpr or a branch on
    # `.item()` -- has no one graph: its trace fails (CaptureError.data_dependent). Running its
    # calls eagerly would give up every launch in it; Dynamo's graph breaks cut the function at
    # exactly those points, and the trident backend serves the graphs between them (each with
    # its own capture cache: Note [One capture cache]). The same for a function returning an
    # object it made during the call that holds tensors (flash-linear-attention's models turn
    # the DynamicCache generate() passes into a Cache of their own at the prefill): a capture
    # would hand back the trace's object, fake tensors inside, on every call (it did, and
    # generate() failed in its stopping check); Dynamo rebuilds the object per call
    # (CaptureError.new_object). So once a family's trace fails either
    # way, every call of the family goes through one `torch.compile(fn, backend="trident",
    # dynamic=<this function's>)`: Dynamo guards it, replays its Python side effects on the
    # objects it is passed and recompiles where its guards fail, as torch.compile does (Note
    # [State the function is passed] is Dynamo's business for these calls). Other families keep
    # their captures. explain() names the reason and shows the Dynamo graphs; cache_info()
    # lists their captures; `dynamo_calls` counts the calls. torch.compiler.disable on
    # __call__ does not reach the inner torch.compile: its frames are compiled.
    def _values_through_dynamo(self, call: _Call, why: str):
        """Note [Values a trace specializes]: the family's values changed past REGIMES captures
        of them (a scalar that differs every call), or a value no capture can be made for came:
        its captures with values specialized are dropped and the family goes through Dynamo from
        now on."""
        family = call.family()
        with self.cache.lock:
            for e in list(self._guarded.get(call.structure, ())):
                if e.family == family and _by_value(e):
                    self._drop(e.key)
            self._dynamo_families.add(family)
            self.dynamo_reason = (
                f"{why}: this family of signatures goes through torch.compile(backend='trident'), which breaks the "
                "graph there")
            logs.misses.warning("trident.compile(%s): %s", self._name, self.dynamo_reason)
        return self._through_dynamo(call)

    # Note [Objects made per call]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # A family refused because each call returns an object it makes (a library turning the
    # DynamicCache generate() passes into its own Cache at the prefill) goes through Dynamo only
    # while the function has no capture. Once other families are captured, their calls run no
    # Python, so the library's memos (flash-linear-attention's `tensor_cache`: the last four
    # calls' arguments) no longer change as they did, and Dynamo's frames for this family, which
    # guard on those memos, recompile on the family's next calls until the memos settle (GLA on
    # the H200, 539d430: the 2nd-5th generate() at 340-690 ms/token, eager 43, 3.5-4.1 once
    # settled; every layer's frames recompiled). So such calls run eagerly then, as one forward
    # per generate() costs (Dynamo's prefill was no faster once settled), and explain() says so.
    def _not_captured(self, call: _Call):
        """A call of a family no capture serves: through Dynamo (Note [Data-dependent calls
        through Dynamo]), or eagerly (Note [Objects made per call])."""
        why = self._made_families.get(call.family()) if self._made_families and self.captures else None
        if why is not None:
            return self._eager(call, f"{why}; such calls run eagerly once the function has captures, whose calls run "
                                     "no Python: through Dynamo their frames would recompile as the library's memos "
                                     "change (Note [Objects made per call])")
        return self._through_dynamo(call)

    def _through_dynamo(self, call: _Call):
        if getattr(_tracing, "active", False):  # inside another capture's trace: traced as it is
            return self.fn(*call.args, **call.kwargs)
        fn = self._dynamo_fn
        if fn is None:
            with self.cache.lock:
                if self._dynamo_fn is None:
                    self._recompile_limit = recompile_limit_for(self.fn)
                    extra = {"recompile_limit": self._recompile_limit} if _COMPILE_TAKES_RECOMPILE_LIMIT else {}
                    self._dynamo_fn = torch.compile(self.fn, backend="trident", dynamic=self.dynamic, **extra)
                fn = self._dynamo_fn
        self.dynamo_calls += 1
        window = _RecompileLimitWindow(self._recompile_limit) if not _COMPILE_TAKES_RECOMPILE_LIMIT else None
        if is_fx_symbolic_tracing():
            # FX's tracing flag is process-wide: while another thread traces, Dynamo would refuse
            # this call ("FX to symbolically trace a dynamo-optimized function"); it waits for
            # that trace (captures hold Triton's state exclusively)
            with triton_state.exclusive(), window or contextlib.nullcontext():
                return fn(*call.args, **call.kwargs)
        if window is None:
            return fn(*call.args, **call.kwargs)
        with window:
            return fn(*call.args, **call.kwargs)

    def _eager(self, call: _Call, reason: str):
        self.cache.eager(reason)
        return self.fn(*call.args, **call.kwargs)

    def _why_new(self, call: _Call) -> tuple[str, Optional[str]]:
        """Why a call is its signature's first, in the caller's words, and the leaves that differ
        from the last call that missed (`cache.seen: 33 -> 34`, `x: float32[4, 8] -> float32[4, 9]`)."""
        first = self._last is None
        changed = self._changed(call)
        if first:
            return "the first call of this function: it runs eagerly, state made on a first call then exists", None
        if changed is None:
            return "a new signature (the same leaves as the last call that missed: an earlier capture was dropped)", None
        return "a new signature, run eagerly once: " + changed, changed

    def _changed(self, call: _Call) -> Optional[str]:
        """The leaves that differ from the last call that missed, described (None: none did, or
        no call missed before); this call becomes the last."""
        now = dict(zip(self._leaf_names(call), map(_describe, call.leaves)))
        last, self._last = self._last, now
        if last is None:
            return None
        changed = [f"{n}: {last.get(n, 'absent')} -> {v}" for n, v in now.items() if last.get(n) != v]
        changed += [f"{n}: {v} -> absent" for n, v in last.items() if n not in now]
        if not changed:
            return None
        more = f" (and {len(changed) - 4} more)" if len(changed) > 4 else ""
        return "; ".join(changed[:4]) + more

    def _leaf_names(self, call: _Call) -> list[str]:
        names = _leaf_names(self.fn, call.args, call.kwargs)
        roots = [names[i] for i in call.root_pos]
        return names + [state.path_text(roots[r], steps) for r, steps, _ in call.walk.leaves]

    # Note [Symbolic regimes]
    # ~~~~~~~~~~~~~~~~~~~~~~~~
    # A symbolic capture holds for the sizes its trace's branches hold for: a sliding-window
    # cache layer's keys grow with its token count until the window fills, then stay the window's
    # length while the count goes on (HF's DynamicSlidingWindowLayer; Gemma 2 and 3, Qwen2 with
    # sliding layers), and a capture traced before the window filled assumed the keys as long
    # as the count. Its guards refuse the calls after, before anything of them runs. Such a call
    # is tried on the family's other symbolic captures, and when none serves it, gets a symbolic
    # capture of its own traced at its sizes -- one per regime of the function's branches, as
    # Dynamo recompiles a frame whose guards fail with the new sizes -- up to REGIMES per family;
    # past that, or where the symbolic trace fails, a static capture of its sizes (before, every
    # step after the window filled got a static capture until TRIDENT_CAPTURES, then ran eagerly).
    # The newest symbolic capture is tried first, and one that served a call another refused
    # moves first: a decode stays in its latest regime (a new generate() goes through the
    # earlier ones again, one refusal per regime change). A family whose symbolic trace failed
    # is captured statically from then on; past TRIDENT_CAPTURES, or where Trident cannot
    # capture the sizes at all, the call runs eagerly with the reason.
    def _recapture(self, call: _Call, key, symbolic: bool):
        """A capture for `call` that no symbolic capture of its family serves (Note [Symbolic
        regimes]): symbolic where asked and the family has fewer than REGIMES of them, else
        static; None with the reason the call runs eagerly instead (the capture cache is full,
        or Trident cannot capture it). Under the lock."""
        if key in self.cache.refused:  # captured before and refused: no bound is the reason
            return None, self.cache.refused[key]
        if self.cache.full():
            return None, self.cache.overflow()
        family = call.family()
        regimes = sum(1 for e in self._guarded.get(call.structure, ())
                      if e.family == family and e.opt.meta.get("trident_symbolic"))
        if symbolic and self.dynamic is not False and family not in self._symbolic_failed and regimes < REGIMES:
            dynamic_ints, static = self._family_facts(call, family)
            try:
                opt = self._capture(call, key, dynamic=True, dynamic_ints=dynamic_ints, static=static)
            except Exception as e:  # noqa: BLE001 - served by a static capture instead
                self._symbolic_failed.add(family)  # not traced again for each new size
                logs.misses.info("trident.compile(%s): no symbolic capture for these sizes (%s: %s); capturing "
                                 "them statically", self._name, type(e).__name__, str(e).splitlines()[0])
            else:
                self._register(call, key, opt)
                return opt, None
        try:
            opt = self._capture(call, key)
        except TridentError as e:
            opt = None
            if getattr(e, "data_dependent", False):
                opt, e = self._static_by_value(call, key, e)
            if opt is None:
                return None, self.cache.refuse(key, e)
        self._register(call, key, opt)
        return opt, None

    def _static_by_value(self, call: _Call, key, error: TridentError):
        """(a static capture with the values only the data gives specialized, the error) after
        the static trace failed on one (`error`) and no symbolic capture served (Note [Values a
        trace specializes]); (None, the error to report) where that fails too: the object it
        makes when that is what stopped it, else the first error."""
        try:
            return self._capture(call, key, values=True), error
        except TridentError as again:
            logs.misses.info("trident.compile(%s): no static capture with the values specialized (%s: %s)",
                             self._name, type(again).__name__, str(again).splitlines()[0] if str(again) else "")
            return None, (again if getattr(again, "new_object", False) else error)

    def _run(self, opt, key, call: _Call, info: Optional[_Outputs] = None, tried: frozenset = frozenset()):
        if torch.is_grad_enabled() and any(t.requires_grad for t in _held_tensors(opt)):  # Note [Calls that need grad]
            name = next(n.name for n in opt.graph.nodes if n.op == "get_attr" and
                        getattr(operator.attrgetter(n.target)(opt), "requires_grad", False))
            return self._eager(call, _needs_grad(f"{name} (a tensor it closes over)"))
        if info is None:  # the hit path passes its entry's (registered under the capture's own key)
            info = self._outputs[opt.meta.get("trident_key", key)]
        ints = [call.ints[i] for i in info.dynamic_ints]
        try:
            results = opt(*call.tensors, *map(state.carrier, ints))
        except GuardError as e:
            # Sizes a symbolic capture cannot serve (its shape guards: a size the traced code
            # compared), found before anything of the call ran (Note [Symbolic regimes]).
            if not retry_static(opt, e):
                raise
            tried = tried | {id(opt)}
            for other in self._guarded.get(call.structure, ()):
                if id(other.opt) not in tried and (other.opt.meta.get("trident_symbolic") or _by_value(other)) and \
                        other.ints_of(call.ints) == other.int_values and other.guards.check(*call.tensors):
                    self._promote_entry(call.structure, other)
                    return self._run(other.opt, other.key, call, other.info, tried)
            if call.walk is None:  # came through a generated check: the capture below reads the walk
                call = _Call(call.args, call.kwargs, self.dynamic)
            family = call.family()
            if e.traced_value and sum(1 for other in self._guarded.get(call.structure, ())
                                      if other.family == family and _by_value(other)) >= REGIMES:
                return self._values_through_dynamo(
                    call, f"the values its captures specialized changed past {REGIMES} captures ({str(e).splitlines()[0]})")
            exact = call.key()
            with self.cache.lock:
                served = self.captures.get(exact)
                reason = None
                if served is None or id(served) in tried:
                    if served is not None:  # made for these very sizes and refused them: static
                        self._drop(exact)
                    served, reason = self._recapture(call, exact, symbolic=served is None)
                served_info = None if served is None else self._outputs[served.meta.get("trident_key", exact)]
            if served is None and e.traced_value and exact in self.cache.refused:
                # no capture can be made for this value: Dynamo, not a failed trace every call
                return self._values_through_dynamo(call, f"no capture for this call's value ({reason})")
            if served is None:
                return self._eager(call, reason)
            return self._run(served, served.meta.get("trident_key", exact), call, served_info, tried)
        n = info.n_user
        if info.writes:
            state.apply_writes(info.writes, call.roots, call.leaves, results[n:], ints)
        it = iter(results[:n])
        out = []
        for t in info.template:
            if t is _TENSOR:
                out.append(next(it))
            elif t[0] == "int":
                out.append(t[1].fn(ints, call.leaves))
            elif t[0] == "path":
                out.append(state.get_path(call.roots[t[1][0]], t[1][1]))
            else:
                out.append(t[1])
        return pytree.tree_unflatten(out, info.spec)

    def _capture(self, call: _Call, key, dynamic: bool = False, dynamic_ints: tuple = (),
                 static: tuple = (), values: Optional[bool] = None) -> torch.fx.GraphModule:
        """The call's tensors (and its dynamic ints, as carriers) become the graph's inputs;
        every other leaf is a constant of this capture (the signature keys it). `values`: trace
        with the values only the data gives specialized (Note [Values a trace specializes]) --
        True at once, None after a symbolic trace failed on one (a static trace's failure is
        retried symbolically first by the callers: libraries' traceable paths need no guard's
        device-to-host read), False never. Objects
        make_fx cannot take (an HF Cache) are fine; what fn does to the state it is passed is
        recorded as writes (Note [State the function is passed])."""
        fn = self.fn
        n_args, leaves, walk, roots = call.n_args, call.leaves, call.walk, call.roots
        tensor_pos = call.tensor_pos
        dynamic_pos = [call.int_pos[i] for i in dynamic_ints] if dynamic else []
        names = self._leaf_names(call)
        root_names = [names[i] for i in call.root_pos]
        recorded: dict = {}

        def flat(*inputs):
            full = list(leaves)
            for i, t in zip(tensor_pos, inputs):
                full[i] = t
            symbols, sizes = {}, {}
            for k, (i, c) in enumerate(zip(dynamic_pos, inputs[len(tensor_pos):])):
                full[i] = n = c.size(0)
                if isinstance(n, torch.SymInt):
                    symbols[n.node.expr] = k
            for i, t in zip(tensor_pos, inputs):  # before fn runs: each size still its own symbol
                for d, n in enumerate(t.shape):
                    if isinstance(n, torch.SymInt) and isinstance(n.node.expr, sympy.Symbol):
                        sizes.setdefault(n.node.expr, (i, d))
            installed = full[n_args:]
            traced_ids = {id(full[i]): i for i in tensor_pos}
            snapshot = state.Snapshot(walk)
            try:
                for (r, steps, old), new in zip(walk.leaves, installed):
                    if new is not old:
                        state.set_path(roots[r], steps, new)
                args, kwargs = pytree.tree_unflatten(full[:n_args], call.spec)
                result = fn(*args, **kwargs)
                writes, extra = state.record_writes(walk, snapshot, installed, n_args, traced_ids, roots,
                                                    root_names, symbols, sizes)
                # where the state's objects are once the call ran (a result of tensors holds none)
                after = () if _only_tensors(result) else state.walk(roots).nodes
            except state.Unreplayable as e:
                raise CaptureError(f"{e}") from None
            finally:
                snapshot.restore()
            # The graph returns the tensor leaves of the result, then the tensors the state
            # gets; the rest of the result (an HF output's Cache object, Python values) is put
            # back around them on every call. An object of the state it was passed (a dict or
            # list argument returned, as a recurrent layer returns its state) comes back as the
            # caller's own object, which has the writes by then: flattened, it was rebuilt from
            # what it held after the snapshot's restore (the inputs, not the state written). Its
            # place is where the call left it (a function moving `state["a"]` to `state["b"]`
            # and returning it returns what the caller finds at `state["b"]` after the writes).
            places = {id(obj): (r, ()) for r, obj in enumerate(roots)}
            for r, steps, obj, _, _ in after:
                places.setdefault(id(obj), (r, steps))
            removed = {id(obj) for _, _, obj, _, _ in walk.nodes} - places.keys() if after else set()  # taken out
            out_leaves, out_spec = pytree.tree_flatten(result, is_leaf=lambda v: id(v) in places)
            template = []
            for t in out_leaves:
                if isinstance(t, torch.Tensor):
                    template.append(_TENSOR)
                elif isinstance(t, torch.SymInt):
                    s = state.symbolic_int(t, symbols, sizes)
                    if s is None:
                        raise CaptureError(f"{self._name} returns an int computed from tensor sizes ({t})")
                    template.append(("int", s))
                elif id(t) in places:
                    template.append(("path", places[id(t)]))
                elif id(t) in removed:  # no place to read it from once the writes are replayed
                    raise CaptureError(f"{self._name} returns a {type(t).__name__} it took out of the state it was "
                                       "passed: a capture has no place to find it after the call")
                else:
                    made = next((steps for _, steps, v in state.walk([t]).leaves
                                 if isinstance(v, torch.Tensor) and state.is_traced(v)), None)
                    if made is not None:  # Note [Data-dependent calls through Dynamo]
                        raise CaptureError(
                            f"{self._name} returns a {type(t).__name__} it made during the call, holding tensors "
                            f"({state.path_text(type(t).__name__, made)}): a capture would return that one object, "
                            "with the trace's tensors, on every call", new_object=True)
                    template.append(("const", t))
            user = [t for t in out_leaves if isinstance(t, torch.Tensor)]
            recorded["info"] = _Outputs(out_spec, template, len(user), writes, tuple(dynamic_ints) if dynamic else ())
            return (*user, *extra)

        flat.__name__ = self._name
        # The caller's names for the graph's inputs and for the tensors fn holds (Note [The
        # caller's names]): `input_ids`, `self_model_layers_0_mlp_up_proj_weight`,
        # `past_key_values_layers_0_keys`.
        flat.__trident_roots__ = _roots(fn, leaves[:n_args], names[:n_args])
        examples = [leaves[i] for i in tensor_pos] + [state.carrier(leaves[i]) for i in dynamic_pos]
        input_names = [names[i] for i in tensor_pos] + [names[i] for i in dynamic_pos]
        outer, _tracing.active = getattr(_tracing, "active", False), True
        try:
            try:
                gm = capture(flat, *examples, input_names=input_names, dynamic=dynamic, static_inputs=static,
                             values=values is True)
                opt = optimize(gm)
            except TridentError as e:
                if values is not None or not dynamic or not getattr(e, "data_dependent", False):
                    raise
                # Note [Values a trace specializes]: the values the trace needs, read from this
                # call's own tensors and guarded on every call
                try:
                    gm = capture(flat, *examples, input_names=input_names, dynamic=dynamic, static_inputs=static,
                                 values=True)
                    opt = optimize(gm)
                except TridentError as again:
                    logs.misses.info("trident.compile(%s): no capture with the values specialized (%s: %s)",
                                     self._name, type(again).__name__, str(again).splitlines()[0] if str(again) else "")
                    # past the values, the call returns an object it made (an fla prefill): that
                    # is the reason to give; otherwise the values were the trouble
                    raise (again if getattr(again, "new_object", False) else e) from None
        finally:
            _tracing.active = outer  # a capture made inside another's trace leaves it tracing
        values = gm.meta.get("trident_traced_values", ())
        if values:  # one capture per value of the signature: each registered under its own key
            key = (key, "values", tuple((v.kind, v.value) for v in values))
        opt.meta["trident_key"] = key
        info = self._outputs[key] = recorded["info"]
        # Note [Carried state in rotation]: a new tensor stored over one of the call's tensor
        # inputs comes back as that input next call; its region lends it instead of copying it.
        inputs_at = {walk.leaves[i - n_args][:2] for i in tensor_pos if i >= n_args}
        lend_carried(opt, [info.n_user + w.source[1] for w in info.writes
                           if w.source[0] == "out" and (w.root, w.steps) in inputs_at])
        return opt
class _FactGuards:
    """The same check in Python, where a torch build lacks TensorGuards' interface."""

    def __init__(self, tensors, symbolic: bool = False):
        self.symbolic = symbolic
        self.facts = self._facts(tensors)

    def _facts(self, tensors):
        if self.symbolic:
            return tuple((t.dtype, t.device, t.dim()) for t in tensors)
        return signature(tensors)

    def check(self, *tensors) -> bool:
        return self._facts(tensors) == self.facts


def _only_tensors(result) -> bool:
    """A tensor or a tuple of tensors: no object of the state can be among them (a tuple is
    never changed by the call, so flattening it after the state is restored is right)."""
    return isinstance(result, torch.Tensor) or (
        type(result) is tuple and all(isinstance(v, torch.Tensor) for v in result))


def _by_value(entry: _Entry) -> bool:
    """Whether the entry's capture specialized values only the data gives (Note [Values a trace
    specializes])."""
    return bool(entry.opt.meta.get("trident_traced_values"))


def _tensor_guards(tensors, symbolic: bool = False):
    """Native guards on the tensors of a capture: torch's TensorGuards (what Dynamo's frames
    check), static sizes and strides; for a symbolic capture, every size and stride dynamic
    (None): the SCM's guards check them."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        return TensorGuards(
            *tensors,
            dynamic_dims_sizes=[[None] * t.dim() if symbolic else list(t.size()) for t in tensors],
            dynamic_dims_strides=[[None] * t.dim() if symbolic else list(t.stride()) for t in tensors],
        )
    except (ImportError, TypeError, RuntimeError, SystemError):
        return _FactGuards(tensors, symbolic)


def _leaf_names(fn, args, kwargs) -> list[str]:
    """Per leaf of pytree.tree_flatten((args, kwargs)): fn's parameter name (or the keyword)
    and the path inside it (`inputs.1`, `batch.attention_mask`)."""
    if isinstance(fn, torch.nn.Module):  # its __call__ takes (*args, **kwargs): name forward's
        fn = fn.forward
    try:
        params = inspect.signature(fn).parameters.values()
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        positional = []
    names = []
    for path, _ in pytree.tree_flatten_with_path((args, kwargs), is_leaf=_changeable_container(kwargs))[0]:
        side, first, rest = path[0], path[1], path[2:]
        if getattr(side, "idx", 0) == 0:
            i = first.idx
            base = positional[i] if i < len(positional) else f"args_{i}"
        else:
            base = str(first.key)
        parts = [base] + [str(getattr(k, "idx", getattr(k, "key", getattr(k, "name", k)))) for k in rest]
        names.append(".".join(parts))
    return names


class CompiledModule(ServedByCache, torch.nn.Module):
    """What trident.compile returns for an nn.Module, as torch.compile returns an OptimizedModule:
    a Module holding the original as `_orig_mod` (so parameters(), state_dict() -- keys prefixed
    `_orig_mod.` as torch.compile's --, eval(), train(), to() work), whose calls go through
    trident.compile; other attributes are the original's. Moving or casting it (to(), cuda(),
    half()) forgets the captures: they were made for the old tensors."""

    def __init__(self, mod: torch.nn.Module, dynamic: Optional[bool] = None):
        super().__init__()
        self._orig_mod = mod
        self.__dict__["_compiled"] = CompiledFunction(mod, dynamic)

    @property
    def cache(self) -> CaptureCache:
        return self._compiled.cache

    @property
    def dynamo_calls(self) -> int:  # as the function door's (Note [Data-dependent calls through Dynamo])
        return self._compiled.dynamo_calls

    @property
    def dynamo_reason(self) -> Optional[str]:
        return self._compiled.dynamo_reason

    def forward(self, *args, **kwargs):
        return self._compiled(*args, **kwargs)

    def reset(self) -> None:
        self._compiled.reset()

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._compiled.reset()
        return out

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_modules"]["_orig_mod"], name)


def compile(fn: Callable[..., Any], dynamic: Optional[bool] = None):  # noqa: A001 - like torch.compile
    """Trident without Dynamo: capture on the first call per input signature, then only native
    guards (Note [What trident.compile guards]). `model.forward = trident.compile(model.forward)`,
    or `model = trident.compile(model)` (a CompiledModule, as torch.compile's OptimizedModule).
    `dynamic` as torch.compile's: None captures the first sizes statically and, once sizes
    change, captures again with symbolic sizes that serve every size (Note [Symbolic sizes]);
    True is symbolic from the first capture; False captures each new size statically."""
    _install_hooks()
    if isinstance(fn, torch.nn.Module):
        return CompiledModule(fn, dynamic)
    return CompiledFunction(fn, dynamic)


def _describe(a) -> str:
    """A leaf in a few words, for explain()'s reasons."""
    if isinstance(a, torch.Tensor):
        return f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}"
    if isinstance(a, state.VALUE_TYPES):
        return repr(a)[:40]
    return f"a {type(a).__name__}"
