"""A Triton driver for machines without a GPU.

Triton picks its driver from the backends that report an active device; on a CPU-only machine
there is none, so nothing can be compiled or traced. This host-only driver answers the questions
compilation and tracing ask (target, device, stream) for an sm_90 CUDA target, so Triton emits
real cubins on the CPU and make_fx/Dynamo can capture launches. It never launches anything:
kernels run on the CPU through Trident's interpreter launcher (trident/runtime/cpu_launcher.py).
"""

from __future__ import annotations

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase

HOST_TARGET = GPUTarget("cuda", 90, 32)


class HostOnlyDriver(DriverBase):
    @classmethod
    def is_active(cls) -> bool:
        return False

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NotImplementedError("the host-only driver builds no launchers")

    def get_current_target(self) -> GPUTarget:
        return HOST_TARGET

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def get_benchmarker(self):
        raise NotImplementedError("the host-only driver cannot time kernels")

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def ensure_triton_driver() -> None:
    """Make sure Triton has an active driver: the real one if a GPU is present, else ours."""
    try:
        triton.runtime.driver.active  # noqa: B018 - raises when no backend is active
    except RuntimeError:
        triton.runtime.driver.set_active(HostOnlyDriver())
    # Dynamo and torch.library.wrap_triton ask this before tracing Triton kernels.
    import torch.utils._triton as torch_triton

    if not torch_triton.has_triton():
        torch_triton.has_triton.cache_clear()
        torch_triton.has_triton = lambda: True  # type: ignore[assignment]
