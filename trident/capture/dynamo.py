"""torch.compile(model_or_fn, backend="trident"): Dynamo captures, Trident optimizes each graph.

Dynamo hands the backend one FX graph per frame piece (graph breaks give several), with user
Triton launches as `triton_kernel_wrapper_mutation` nodes and, with torch's default of inlining
nn.Modules, parameters and buffers as graph inputs. The backend returns a callable per graph
that, on the first call with a given input signature, traces the graph to ATen + Triton launches
with `trident.capture` (make_fx over the Dynamo graph) and `trident.optimize`s it; later calls
with that signature go straight into the optimized graph (native guards only).

Note [Dynamo graphs and static capture]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Trident's regions are static: sizes, strides and scalars are baked in. Dynamo may hand over a
graph with symbolic sizes (after a recompile for a new size, or with dynamic=True); its
arguments at run time are still concrete tensors and ints. So a compiled graph is a small cache
keyed by the signature of its arguments (`compile.signature`: per tensor dtype, device, sizes and
strides; every Python scalar's value), each entry one static capture: a new size is a new capture, never an error.
The cache is bounded (TRIDENT_DYNAMO_CAPTURES, 8 per graph); past it calls run Dynamo's graph
eagerly, and explain() says so. Trident is inference only (`trident.scm` has no derivative):
a call with grad enabled and an input that requires grad runs Dynamo's graph eagerly, so
autograd sees what it would without the backend.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import torch

from .. import knobs
from .compile import signature


class CompiledGraph:
    """The callable Dynamo gets for one graph (Note [Dynamo graphs and static capture])."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.captures: dict[tuple, torch.fx.GraphModule] = {}
        self.eager_calls = 0
        self.eager_reason: Optional[str] = None
        self._lock = threading.Lock()

    def __call__(self, *args):
        key = signature(args)
        opt = self.captures.get(key)
        if opt is None:
            if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
                return self._eager(args, "grad is enabled and an input requires grad (Trident is inference only)")
            with self._lock:
                opt = self.captures.get(key)
                if opt is None:
                    if len(self.captures) >= knobs.dynamo_captures():
                        return self._eager(
                            args, f"more than TRIDENT_DYNAMO_CAPTURES={knobs.dynamo_captures()} input signatures"
                        )
                    from .. import optimize  # the passes stage: after capture in the pipeline
                    from .trace import capture

                    opt = optimize(capture(self.gm, *args))
                    self.captures[key] = opt
        return opt(*args)

    def _eager(self, args, reason: str):
        self.eager_calls += 1
        self.eager_reason = reason
        return self.gm(*args)


_COMPILED: "list[CompiledGraph]" = []  # every graph the backend compiled, for explain/cache_info


def trident_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
    """The Dynamo backend registered as "trident" (on import, and as a torch_dynamo_backends
    entry point of the trident-scm distribution)."""
    compiled = CompiledGraph(gm)
    _COMPILED.append(compiled)
    return compiled


def compiled_graphs() -> "list[CompiledGraph]":
    return list(_COMPILED)


def register() -> None:
    """Registers the backend as "trident" at `import trident`, unless torch is loading it from the
    entry point right now (trident_scm_backend.py: it registers the same function itself) or
    has already."""
    import sys

    from torch._dynamo.backends.registry import register_backend

    entry = sys.modules.get("trident_scm_backend")
    if entry is not None and getattr(entry, "LOADING", False):
        return
    try:
        register_backend(trident_backend, name="trident")
    except AssertionError:  # "duplicate name": registered from the entry point already
        pass
