"""A Triton driver for machines without a GPU.

Triton picks its driver from the backends that report an active device; on a CPU-only machine
there is none, so nothing can be compiled or traced. This host-only driver answers the questions
compilation and tracing ask (target, device, stream) for an sm_90 CUDA target, so Triton emits
real cubins on the CPU and make_fx/Dynamo can capture launches. It never runs a binary: Trident's
regions run kernels on the CPU through its interpreter launcher (trident/runtime/cpu_launcher.py),
and a user's own `kernel[grid](...)` on CPU tensors goes through Triton's interpreter as under
TRITON_INTERPRET=1 (`launcher_cls`), so importing Trident never breaks eager Triton on the CPU.

Note [The host target is Triton's and torch's to ask]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Libraries probe the device through Triton's driver: flash-linear-attention decides at import
whether it runs on 'cuda' or 'cpu' from `driver.active.get_current_target().backend`, and then
asks torch.cuda for the GPU's name; others read `driver.active.utils.get_device_properties`
for core counts. On this machine, without Trident, those calls raise ("0 active drivers") and the
library falls back to the CPU. So the target and the device properties are answered only to
Triton, torch and Trident (the code that compiles, traces and launches); any other caller gets
the RuntimeError it would get without Trident, and keeps its CPU path.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.utils._triton as torch_triton
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase

from .. import triton_state
from ..runtime.cpu_launcher import InterpretingLauncher

HOST_TARGET = GPUTarget("cuda", 90, 32)


def _wall_clock_bench(fn, warmup=0, rep=1, quantiles=None, return_mode="mean", **_):
    t0 = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t0) * 1e3
    return [ms] * len(quantiles) if quantiles else ms


_ANSWERED = frozenset({"triton", "torch", "trident"})


def _check_caller() -> None:
    """Note [The host target is Triton's and torch's to ask]: raise as Triton does with no active
    driver unless the caller of the driver's method is Triton, torch or Trident."""
    try:
        module = sys._getframe(2).f_globals.get("__name__") or ""
    except ValueError:  # called straight from C: no Python caller to tell apart
        return
    if module.partition(".")[0] not in _ANSWERED:
        raise RuntimeError("0 active drivers ([]). There should only be one. (Trident's host-only driver "
                           "compiles sm_90 code for Triton and torch on this machine without a GPU; it is no "
                           f"device for {module or 'this caller'} to run on)")


class _HostUtils:
    """driver.utils: what CompiledKernel asks before its first launch."""

    # sm_90 limits (H100/H200): 227 KiB of shared memory per block, 1024 threads.
    @staticmethod
    def get_device_properties(device: int) -> dict:
        _check_caller()
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32,
                "sm_clock_rate": 1980000, "mem_clock_rate": 3201000, "mem_bus_width": 5120}

    @staticmethod
    def load_binary(name, kernel, shared, device):
        return None, None, 0, 0, 1024  # module, function, registers, spills, max threads


class HostOnlyDriver(DriverBase):
    utils = _HostUtils()
    @classmethod
    def is_active(cls) -> bool:
        return False

    @property
    def launcher_cls(self):
        return InterpretingLauncher

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NotImplementedError("the host-only driver builds no launchers")

    def get_current_target(self) -> GPUTarget:
        _check_caller()
        return HOST_TARGET

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def get_benchmarker(self):
        """Wall-clock timing of interpreted launches, for a user's eager @triton.autotune on the
        CPU (its choice then reflects the interpreter, as under TRITON_INTERPRET=1)."""
        return _wall_clock_bench

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

    if not torch_triton.has_triton():
        torch_triton.has_triton.cache_clear()
        torch_triton.has_triton = lambda: True  # type: ignore[assignment]


def install_without_gpu() -> None:
    """At `import trident`: on a machine without a GPU, Trident's driver from the start, so that
    Dynamo traces Triton launches in torch.compile(backend="trident") from its first frame and
    eager kernels run interpreted. With a GPU, Triton's own driver is left alone. Either way,
    TRITON_INTERPRET=1 device-function calls stop leaving triton.language patched (Note
    [Interpreted device functions end their patch] in trident/triton_state.py)."""
    triton_state.install()
    if not torch.cuda.is_available():
        ensure_triton_driver()
