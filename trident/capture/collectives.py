"""Collectives in captured graphs.

Note [Collectives in regions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Tensor-parallel code reduces partial results across ranks, with torch.distributed's functional
collectives (`funcol.all_reduce(t, "sum", group)` -> `_c10d_functional.all_reduce` +
`wait_tensor`) or with the classic in-place API (`dist.all_reduce(t)`). Trident keeps both
inside regions, where the host program calls the functional operators natively (boxed, through
the dispatcher: the very C++ operators eager runs, on the process group their `group_name`
names, on the group's own communication stream, with eager's order and waits).

The classic API cannot be traced as it is: `dist.all_reduce(t)` enqueues `c10d.allreduce_` and
then waits on the Work object it returns, a wait make_fx does not record -- the graph would read
`t` before the reduction finished (a wrong result, seen with gloo). Dynamo remaps these functions
to traceable in-place wrappers of the functional collectives while it traces
(`funcol.traceable_collective_remaps`); capture does the same (`collectives_as_functional`), in
the tracing thread only, for calls with `async_op=False` (with `async_op=True` the caller waits
on the Work itself, which no graph can hold). A non-functional c10d operator left in a graph
(an alias imported before capture, `async_op=True`, a collective with no remap) is refused at
capture (`check_graph`), so a front door runs such a function eagerly instead of wrongly.

Graph replay (runtime/graphs.py) records collectives only on NCCL process groups (NCCL
supports CUDA graph capture); other backends keep their regions on the ordinary path, and
explain() says why.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Iterator

import torch

from ..errors import CaptureError
from .shared_patch import SharedPatch

_state = threading.local()
_patched: list[tuple[object, str, object]] = []  # (module, name, original) while patched

FUNCTIONAL_NAMESPACE = "_c10d_functional"


def _modules():
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    return (dist, c10d)


def _remaps() -> dict:
    """Dynamo's remaps of the classic collectives, but the point-to-point ones (isend, irecv,
    batch_isend_irecv): c10d checks P2POp's function by identity, and no region needs them."""
    try:
        import torch.distributed._functional_collectives as funcol
        import torch.distributed.distributed_c10d as c10d
    except (ImportError, RuntimeError):  # a torch built without distributed
        return {}
    p2p = {getattr(c10d, n, None) for n in ("isend", "irecv", "batch_isend_irecv")}
    return {k: v for k, v in funcol.traceable_collective_remaps.items() if k not in p2p}


def _routed(original, remapped):
    signature = inspect.signature(original)
    takes_op = "op" in signature.parameters

    @functools.wraps(original)
    def collective(*args, **kwargs):
        if getattr(_state, "tracing", False) and not kwargs.get("async_op", False):
            # as Dynamo's CollectiveFunctionRewriteVariable: every argument by name, the reduce
            # op as the functional collectives' string
            bound = dict(signature.bind(*args, **kwargs).arguments)
            if bound.get("async_op", False):
                return original(*args, **kwargs)
            if takes_op:
                bound["op"] = _reduce_op_name(bound.get("op", signature.parameters["op"].default))
            return remapped(**bound)
        return original(*args, **kwargs)

    collective.__trident_original__ = original
    return collective


def _reduce_op_name(op):
    if isinstance(op, str):
        return op
    from torch.distributed._functional_collectives import REDUCE_OP_TO_STR

    try:
        return REDUCE_OP_TO_STR[op]
    except KeyError:
        raise CaptureError(
            f"a collective with reduce op {op}: expected one the functional collectives take "
            f"({', '.join(sorted(REDUCE_OP_TO_STR.values()))}); run it eagerly or use another op"
        ) from None


@contextlib.contextmanager
def collectives_as_functional() -> Iterator[None]:
    """While this thread traces, torch.distributed's classic collectives called with
    async_op=False are their traceable functional forms (Note [Collectives in regions])."""
    if not _remaps():
        yield
        return
    with _PATCH.held():
        outer = getattr(_state, "tracing", False)
        _state.tracing = True
        try:
            yield
        finally:
            _state.tracing = outer


def _install_remaps() -> None:
    remaps = _remaps()
    wrappers: dict = {}  # one per function: `dist.all_reduce is c10d.all_reduce` still holds
    for module in _modules():
        for name, value in list(vars(module).items()):
            if callable(value) and value in remaps:
                if value not in wrappers:
                    wrappers[value] = _routed(value, remaps[value])
                _patched.append((module, name, value))
                setattr(module, name, wrappers[value])


def _remove_remaps() -> None:
    while _patched:
        module, name, original = _patched.pop()
        setattr(module, name, original)


_PATCH = SharedPatch(_install_remaps, _remove_remaps)


def is_collective(op) -> bool:
    """A functional collective (or its wait) of torch.distributed."""
    return isinstance(op, torch._ops.OpOverload) and op.namespace == FUNCTIONAL_NAMESPACE


def check_graph(gm: torch.fx.GraphModule) -> None:
    """Refuse a graph holding a classic (non-functional) c10d collective: the wait on its Work
    is not part of the graph (Note [Collectives in regions])."""
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and target.namespace == "c10d":
            raise CaptureError(
                f"the captured graph calls {target} ({node.name}), a torch.distributed collective whose wait "
                "is not part of the graph, so the graph would read its result before the collective finished. "
                "Expected: torch.distributed.<collective>(...) called through the torch.distributed module with "
                "async_op=False (Trident traces it as its functional form, as Dynamo does), or "
                "torch.distributed._functional_collectives; got a call Trident could not remap (a function "
                "imported under another name before capture, or async_op=True)."
            )


def process_group_backend(group_name) -> str:
    """The backend name ('nccl', 'gloo', ...) of the process group a functional collective names."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    group = _resolve_process_group(group_name)
    return str(dist.get_backend(group))
