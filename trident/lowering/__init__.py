from .pipeline import HostBinary, compile_host, lower_to_llvm
from .region_to_torch import functional_region_graph, import_region
from .host_plan import slot_bits
from .scm_to_llvm import check_region_steps, emit_host_module, import_size_programs, meta_code

__all__ = [
    "HostBinary",
    "check_region_steps",
    "compile_host",
    "emit_host_module",
    "functional_region_graph",
    "import_region",
    "import_size_programs",
    "lower_to_llvm",
    "meta_code",
    "slot_bits",
]
