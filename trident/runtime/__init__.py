from . import op  # noqa: F401  (registers fake kernels)
from .scm_module import SCMRuntime, check_verbose

__all__ = ["SCMRuntime", "check_verbose"]
