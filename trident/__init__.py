"""Trident: native Specialization Cache Modules for PyTorch graphs of Triton kernels.

    gm = trident.capture(fn, *example_inputs)   # FX graph: ATen ops + Triton launches
    opt = trident.optimize(gm)                   # each region -> one torch.ops.trident.scm call
    opt(*inputs)                                 # hits never enter Python
    torch.compile(fn, backend="trident")         # or through Dynamo: each graph optimized
    trident.cache_info(opt), trident.explain(opt)
    with trident.profile() as p: opt(*inputs)  # host time per runtime service; p.table()
"""

from .errors import (
    CaptureError,
    GuardError,
    LaunchError,
    LoweringError,
    OperatorError,
    TridentError,
    UnsupportedError,
)
from . import knobs  # noqa: F401  (TRIDENT_* settings, with knobs.scope for tests)
from . import runtime  # noqa: F401  (loads the native op and its fake kernels)
from .capture import capture
from .frontends.compile import compile  # noqa: A004 - trident.compile, like torch.compile
from .optimize import optimize
from .frontends.explain import cache_info, explain, scm_text
from .runtime.profile import profile
from . import logs as _logs
from .frontends import dynamo as _dynamo
from .capture.host_driver import install_without_gpu as _install_without_gpu

_install_without_gpu()
_logs.configure()  # TRIDENT_LOG

_dynamo.register()  # torch.compile(..., backend="trident")

__all__ = [
    "CaptureError",
    "GuardError",
    "LaunchError",
    "LoweringError",
    "OperatorError",
    "TridentError",
    "UnsupportedError",
    "cache_info",
    "capture",
    "compile",
    "explain",
    "optimize",
    "profile",
    "scm_text",
]
