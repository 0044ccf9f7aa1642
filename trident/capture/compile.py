"""trident.compile(fn): the Dynamo-free front door.

Note [What trident.compile guards]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The first call with a given input signature runs `fn` eagerly (state that programs create
lazily on their first call, an HF StaticCache's tensors, then exists as real tensors); the second
captures it (trident.capture, over the flattened tensor arguments) and optimizes it; later calls
with that signature go straight into the optimized graph, whose guards on tensors are native:
torch's own TensorGuards (the C++ checks of Dynamo's frames: dtype, device, sizes, strides,
dispatch keys; ~0.1 µs a tensor) pick the capture among those of one structure, then the SCM's
guards run as always. Python computes per call only what is not a tensor:
  * the pytree structure of (args, kwargs): positional count, keyword names, nesting of tuples,
    lists, dicts and registered pytree nodes;
  * per tensor leaf: its place only; dtype, device, sizes and strides are the native guards'
    (a new shape is a new capture, cached; only then are they computed in Python, to key it);
  * per other leaf: its value if it is an int, float, bool, str or None, else its identity (an
    HF Cache object, a config; held while a capture keyed by it lives) and the Python scalars it
    and the objects it holds carry, two levels deep (`_scalar_state`: a sliding-window cache
    layer's length counter; when that changes every call, every call is a new signature's first
    and runs eagerly -- right, at eager's speed, until sizes are symbolic);
  * a process-wide count of nn.Module parameter and buffer registrations: assigning a new
    Parameter or buffer to any module (`m.weight = nn.Parameter(...)`, `register_buffer`)
    makes the next call capture again (torch's registration hooks; nothing is walked per call).
Sizes (`dynamic`, as torch.compile's; Note [Symbolic sizes]): with the default (None) the first
capture of a family of signatures (one pytree structure, non-tensor values, tensor dtypes,
devices and ranks) is static; a later signature of the family that differs in sizes or strides
is captured once more with symbolic sizes, and that capture serves every size after it (its
TensorGuards check dtype, device and rank; the SCM's native guards the sizes). Sizes 0 and 1
are specialized by the symbolic trace, so each tensor's sizes as 0, 1 or "2 or more" are part
of the structure. A symbolic capture that cannot serve a call (a size the traced code compared)
raises before running anything, and that call gets a static capture of its own. dynamic=True:
symbolic from the first capture; False: a static capture per signature.
A call Trident cannot capture (CaptureError, UnsupportedError) runs eagerly for its signature,
with a warning (`eager_reason`), as torch.compile(backend="trident") does.
At most TRIDENT_COMPILE_CAPTURES (8) captures are kept per function, the oldest dropped first.
NOT guarded: Python globals and module attributes other than registered parameters and buffers
(a flag on the module, `model.config` values, a plain tensor attribute rebound to a new tensor),
and the values of non-tensor objects passed by identity. Non-tensor parts of the result (an HF
output's Cache object, Python values) are those of the capture, returned again on every call. Tensors the function reads without being
passed them are bound by identity (Note [Closed-over tensors]): their in-place updates are seen.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable, Optional

import torch
import torch.utils._pytree as pytree

from .. import knobs, logs
from ..errors import GuardError, TridentError
from .trace import _roots

_VALUE_TYPES = (int, float, bool, str, type(None))
_TENSOR = object()  # a tensor's place in an output template
_generation = [0]  # bumped by torch's parameter/buffer registration hooks
_hooks_installed = False
_hooks_lock = threading.Lock()


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


_STATE_DEPTH = 2  # object -> list -> object: an HF Cache -> its layers -> a layer's counters


def _scalar_state(obj) -> tuple:
    """The Python scalars an object passed by identity carries, and those of the objects it
    holds in attributes and lists (two levels): a traced call reads them as constants, so they
    are part of the signature. HF's StaticSlidingWindowLayer counts its length in a Python int
    (`cumulative_length_int`): without this a capture would replay the position it saw. Modules
    are not walked (their parameters and buffers have the registration hooks)."""
    out: list = []

    def walk(o, depth):
        attrs = getattr(o, "__dict__", None)
        if attrs is None or isinstance(o, (torch.nn.Module, type)):
            return
        for name, v in attrs.items():
            if type(v) in (int, float, bool, str):
                out.append((name, v))
            elif depth and isinstance(v, (list, tuple)):
                for item in v:
                    walk(item, depth - 1)
            elif depth and not isinstance(v, torch.Tensor):
                walk(v, depth - 1)

    walk(obj, _STATE_DEPTH)
    return tuple(out)


class _Identity:
    """A signature entry for an object matched by identity and by its Python scalars
    (`_scalar_state`). It holds the object, so its id cannot be reused by another object while a
    capture keyed by it exists (a capture binds the tensors the object held: a new HF Cache must
    never hit the capture of a freed one)."""

    __slots__ = ("obj", "state")

    def __init__(self, obj):
        self.obj = obj
        self.state = _scalar_state(obj)

    def __hash__(self):
        return hash((id(self.obj), self.state))

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.obj is self.obj and other.state == self.state


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


def _size_classes(tensors) -> tuple:
    """Per tensor, each size as 0, 1 or 2 (>= 2): what a symbolic capture specializes on (the
    symbolic trace treats sizes 0 and 1 as constants), so a capture is picked per class."""
    return tuple(tuple(s if s < 2 else 2 for s in t.shape) for t in tensors)


class CompiledFunction:
    """What trident.compile returns (Note [What trident.compile guards])."""

    def __init__(self, fn: Callable[..., Any], dynamic: Optional[bool] = None):
        self.fn = fn
        self.dynamic = dynamic
        self._structures: set = set()  # families called at least once (Note [Symbolic sizes])
        self._symbolic_failed: set = set()  # families whose symbolic capture could not be made
        self._refused: dict = {}  # signature -> why Trident cannot capture it (it runs eagerly)
        self.eager_reason: Optional[str] = None
        self.captures: dict[tuple, torch.fx.GraphModule] = {}
        self._outputs: dict[tuple, tuple] = {}  # per capture: output pytree spec, non-tensor leaves
        # per structure (signature without tensor facts): [(native tensor guards, capture key)],
        # newest first; replaced, never mutated, so the hit path reads it without the lock
        self._guarded: dict[tuple, list] = {}
        self._seen: set = set()  # signatures called once (eagerly)
        self.eager_calls = 0
        self._generation = _generation[0]
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args, **kwargs):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if self._generation != _generation[0]:  # a parameter or buffer was (re)assigned somewhere
            with self._lock:
                self.captures.clear()
                self._outputs.clear()
                self._guarded.clear()
                self._seen.clear()
                self._structures.clear()
                self._symbolic_failed.clear()
                self._refused.clear()
                self._generation = _generation[0]
        tensors = [a for a in leaves if isinstance(a, torch.Tensor)]
        structure = (spec, signature(leaves, tensor_facts=False))
        if self.dynamic is not False:
            structure += (_size_classes(tensors),)
        # The hit path: tensors checked by native guards only (torch's own TensorGuards, those
        # Dynamo's frames use: dtype, device, sizes, strides, dispatch keys; for a symbolic
        # capture dtype, device and rank, the SCM's guards check the sizes).
        for guards, key in self._guarded.get(structure, ()):
            if guards.check(*tensors):
                opt = self.captures.get(key)
                if opt is not None:
                    return self._run(opt, key, tensors, args, kwargs)
        key = (spec, signature(leaves))
        opt = self.captures.get(key)
        if opt is None and key in self._refused:  # Trident cannot capture it: eager, as the backend does
            self.eager_calls += 1
            self.eager_reason = self._refused[key]
            return self.fn(*args, **kwargs)
        if opt is None:
            refused = False
            with self._lock:
                opt = self.captures.get(key)
                # A symbolic capture (Note [Symbolic sizes]) once a second signature of one
                # structure comes (sizes changed: as torch.compile's automatic dynamic shapes),
                # or from the first capture with dynamic=True.
                # family: the structure with each tensor's dtype, device and rank; another
                # signature of one family differs in sizes or strides only
                family = (structure, tuple((t.dtype, t.device, t.dim()) for t in tensors))
                symbolic = opt is None and family not in self._symbolic_failed and (
                    self.dynamic is True or (self.dynamic is None and family in self._structures and key not in self._seen)
                )
                first = opt is None and key not in self._seen and (self.dynamic is False or family not in self._structures)
                self._structures.add(family)
                if first:
                    self._seen.add(key)
                    self.eager_calls += 1
                elif opt is None:
                    while len(self.captures) >= knobs.compile_captures():  # the oldest goes first
                        old = next(iter(self.captures))
                        del self.captures[old], self._outputs[old]
                        self._seen.discard(old)
                        self._guarded = {
                            s: [(g, k) for g, k in entries if k != old] for s, entries in self._guarded.items()
                        }
                    opt = None
                    if symbolic:
                        try:
                            opt = self._capture(key, spec, leaves, dynamic=True)
                        except Exception as e:  # noqa: BLE001 - served by a static capture instead
                            self._symbolic_failed.add(family)
                            logs.misses.info(
                                "trident.compile(%s): no symbolic capture (%s: %s); capturing these sizes statically",
                                getattr(self.fn, "__name__", "fn"), type(e).__name__, str(e).splitlines()[0],
                            )
                    if opt is None:
                        try:
                            opt = self._capture(key, spec, leaves)
                        except TridentError as e:
                            if not symbolic and self.dynamic is not False and family not in self._symbolic_failed:
                                try:  # a symbolic trace takes libraries' traceable paths (HF prefill)
                                    opt = self._capture(key, spec, leaves, dynamic=True)
                                except Exception:  # noqa: BLE001 - the static error is the one to report
                                    self._symbolic_failed.add(family)
                            if opt is None:
                                refused = True
                                reason = f"Trident cannot capture this call: {type(e).__name__}: {str(e).splitlines()[0]}"
                                self._refused[key] = reason
                                logs.misses.warning("trident.compile(%s): %s; it runs eagerly",
                                                    getattr(self.fn, "__name__", "fn"), reason)
                if refused:
                    self.eager_calls += 1
                    self.eager_reason = self._refused[key]
                elif opt is not None and key not in self.captures:
                    self.captures[key] = opt
                    symbolic = opt.meta.get("trident_symbolic", False)
                    entries = [(g, k) for g, k in self._guarded.get(structure, ()) if k != key]
                    entry = (_tensor_guards(tensors, symbolic), key)
                    # static captures first: a symbolic one serves what none of them does
                    self._guarded = {**self._guarded, structure: ([entry] + entries) if not symbolic else (entries + [entry])}
            if first or refused:
                return self.fn(*args, **kwargs)
        return self._run(opt, key, tensors, args, kwargs)

    def _run(self, opt, key, tensors, args=(), kwargs=None):
        try:
            results = opt(*tensors)
        except GuardError as e:
            # Sizes a symbolic capture cannot serve (its shape guards: a size the traced code
            # compared). When the capture raised before anything ran, this call gets a static
            # capture of its own (Note [Symbolic sizes]).
            if not opt.meta.get("trident_symbolic") or not (
                getattr(e, "before_effects", False) or getattr(e, "region", None) == opt.meta.get("trident_retry_region")
            ):
                raise
            leaves, spec = pytree.tree_flatten((args, kwargs or {}))
            exact = (spec, signature(leaves))
            with self._lock:
                static = self.captures.get(exact)
                if static is None or static is opt:
                    static = self.captures[exact] = self._capture(exact, spec, leaves)
                    structure = (spec, signature(leaves, tensor_facts=False), _size_classes(tensors))
                    entries = self._guarded.get(structure, [])
                    self._guarded = {**self._guarded, structure: [(_tensor_guards(tensors), exact)] + entries}
            return self._run(static, exact, tensors, args, kwargs)
        out_spec, template = self._outputs[key]
        it = iter(results)
        return pytree.tree_unflatten([next(it) if t is _TENSOR else t for t in template], out_spec)

    def _capture(self, key, spec, leaves, dynamic: bool = False) -> torch.fx.GraphModule:
        """Tensor leaves become the graph's inputs; every other leaf is a constant of this
        capture (the signature keys it), so objects make_fx cannot take (an HF Cache) are fine."""
        from .. import optimize  # the passes stage, after capture in the pipeline
        from .trace import capture

        fn = self.fn
        positions = [i for i, a in enumerate(leaves) if isinstance(a, torch.Tensor)]

        def flat(*tensors):
            full = list(leaves)
            for i, t in zip(positions, tensors):
                full[i] = t
            args, kwargs = pytree.tree_unflatten(full, spec)
            # The graph returns the tensor leaves of the result; the rest of it (an HF output's
            # Cache object, Python values) is put back around them on every call.
            out_leaves, out_spec = pytree.tree_flatten(fn(*args, **kwargs))
            template = [_TENSOR if isinstance(t, torch.Tensor) else t for t in out_leaves]
            self._outputs[key] = (out_spec, template)
            return tuple(t for t in out_leaves if isinstance(t, torch.Tensor))

        flat.__name__ = getattr(fn, "__name__", "fn")
        # The caller's names for the graph's inputs and for the tensors fn holds (Note [The
        # caller's names]): `input_ids`, `self_model_layers_0_mlp_up_proj_weight`,
        # `past_key_values_layers_0_keys`.
        names = _leaf_names(fn, *pytree.tree_unflatten(list(leaves), spec))
        flat.__trident_roots__ = _roots(fn, leaves, names)
        _tracing.active = True
        try:
            return optimize(capture(flat, *[leaves[i] for i in positions], input_names=[names[i] for i in positions],
                                    dynamic=dynamic))
        finally:
            _tracing.active = False


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
    try:
        params = inspect.signature(fn).parameters.values()
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        positional = []
    names = []
    for path, _ in pytree.tree_flatten_with_path((args, kwargs))[0]:
        side, first, rest = path[0], path[1], path[2:]
        if getattr(side, "idx", 0) == 0:
            i = first.idx
            base = positional[i] if i < len(positional) else f"args_{i}"
        else:
            base = str(first.key)
        parts = [base] + [str(getattr(k, "idx", getattr(k, "key", getattr(k, "name", k)))) for k in rest]
        names.append(".".join(parts))
    return names


def compile(fn: Callable[..., Any], dynamic: Optional[bool] = None) -> CompiledFunction:  # noqa: A001 - like torch.compile
    """Trident without Dynamo: capture on the first call per input signature, then only native
    guards (Note [What trident.compile guards]). `model.forward = trident.compile(model.forward)`.
    `dynamic` as torch.compile's: None captures the first sizes statically and, once sizes
    change, captures again with symbolic sizes that serve every size (Note [Symbolic sizes]);
    True is symbolic from the first capture; False captures each new size statically."""
    _install_hooks()
    return CompiledFunction(fn, dynamic)
