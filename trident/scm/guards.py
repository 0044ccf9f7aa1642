"""The call guards of an optimized graph, in one table (Note [One guard table]).

Note [One guard table]
Besides the tensor facts of each specialization (TensorGuard, selected by the generated
scm_select), an optimized graph checks a few facts about a whole call that its plans rest on:

  kind             where checked          what                                        on failure
  ConstantInput    the module's __call__  a non-tensor input equals its captured value   GuardError
  SameTensor       the module's __call__  two inputs that were one tensor still are      GuardError
  KernelGlobal     the module's __call__  a Python global a kernel read (Triton's        GuardError
                                          used_global_vals) still has its value
  DisjointInputs   the region, natively   an input a lowered index write writes does not  RuntimeError
                                          overlap an input that call reads (Note [Inputs  (eager's own)
                                          a lowered index write must not overlap])
  CapturedLayout   the region, on a miss  an input has its captured sizes and strides     GuardError
                                          (static capture: grids and sizes are baked in)

Every kind has `check(values) -> bool`, the test, and `failure(values, names) -> str`, what was
expected, what came and what to do, in the caller's names (torch's guard manager's check and
check_verbose). A native kind's `check` is the Python twin of its native code, which the tests
compare on generated inputs; `record()` is its plain-data form (no live object; KernelGlobal
names its value's module dict by the kernel's module). Guards on the graph's inputs index the
graph's placeholders; region guards (`native`) index the region's inputs.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from ..layout import span_bytes

_MISSING = object()


@dataclass(frozen=True)
class ConstantInput:
    position: int
    value: Any
    native: ClassVar[bool] = False

    def check(self, values: Sequence) -> bool:
        got = values[self.position]
        if type(got) is not type(self.value):
            return False
        if type(got) is float:  # by bits: the captured nan passes, -0.0 is not 0.0 (1 / x differs)
            return struct.pack("<d", got) == struct.pack("<d", self.value)
        return got == self.value

    def failure(self, values: Sequence, names: Sequence[str]) -> str:
        i = self.position
        return (
            f"input {names[i]!r} (position {i}) was captured as the constant {self.value!r}, got {values[i]!r}; "
            "non-tensor inputs are baked into the captured graph: capture again with this value"
        )

    def record(self) -> dict:
        return {"kind": "constant_input", "position": self.position, "value": repr(self.value)}


@dataclass(frozen=True)
class SameTensor:
    first: int
    second: int
    native: ClassVar[bool] = False

    def check(self, values: Sequence) -> bool:
        return values[self.first] is values[self.second]

    def failure(self, values: Sequence, names: Sequence[str]) -> str:
        i, j = self.first, self.second
        return (
            f"inputs {names[j]!r} (position {j}) and {names[i]!r} (position {i}) were one tensor at capture, "
            "so the captured graph reads that tensor for both; pass one tensor in both positions again, or "
            "capture with distinct tensors"
        )

    def record(self) -> dict:
        return {"kind": "same_tensor", "first": self.first, "second": self.second}


@dataclass(frozen=True)
class KernelGlobal:
    kernel: str
    name: str
    value: Any
    scope: dict = field(compare=False, repr=False)  # the module globals the kernel reads `name` from
    native: ClassVar[bool] = False

    def check(self, values: Sequence = ()) -> bool:
        return self.scope.get(self.name, _MISSING) == self.value

    def failure(self, values: Sequence = (), names: Sequence[str] = ()) -> str:
        now = self.scope.get(self.name, _MISSING)
        return (
            f"kernel {self.kernel} reads the global {self.name!r}, which was {self.value!r} when it was compiled "
            f"and is {'absent' if now is _MISSING else repr(now)} now; Triton refuses to launch it after such a "
            "change too (kernel[grid] raises): restore the value, or define a new kernel that reads the new one"
        )

    def record(self) -> dict:
        return {"kind": "kernel_global", "kernel": self.kernel, "name": self.name, "value": repr(self.value),
                "module": self.scope.get("__name__")}  # fmt: skip


@dataclass(frozen=True)
class DisjointInputs:
    written: int
    read: int
    what: str  # "<step> writes input 'cache' and reads input 'k' (src_ptr)"
    native: ClassVar[bool] = True

    def check(self, values: Sequence) -> bool:
        a, b = values[self.written], values[self.read]
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.device != b.device:
            return True
        a0, b0 = a.data_ptr(), b.data_ptr()
        a1, b1 = a0 + span_bytes(a), b0 + span_bytes(b)
        return a0 == a1 or b0 == b1 or a1 <= b0 or b1 <= a0

    def failure(self, values: Sequence = (), names: Sequence[str] = ()) -> str:
        return (
            f"{self.what}, and the two overlap in memory. Eager raises here too (unsupported operation: some "
            "elements of the input tensor and the written-to tensor refer to a single memory location); pass "
            "tensors that do not overlap, e.g. a .clone() of the one read."
        )

    def record(self) -> dict:
        return {"kind": "disjoint_inputs", "written": self.written, "read": self.read, "what": self.what}


@dataclass(frozen=True)
class CapturedLayout:
    """A region input has the sizes and strides it was captured with: grids and size arguments
    were computed for them (static capture). Checked on a miss, before planning: a new
    specialization may change dtype, device and alignment, not the layout."""

    input: int
    name: str
    sizes: tuple
    strides: tuple
    region: str = ""
    native: ClassVar[bool] = False

    def check(self, values: Sequence) -> bool:
        t = values[self.input]
        return isinstance(t, torch.Tensor) and tuple(t.shape) == self.sizes and tuple(t.stride()) == self.strides

    def failure(self, values: Sequence, names: Sequence[str] = ()) -> str:
        t = values[self.input]
        if not isinstance(t, torch.Tensor):
            return f"input {self.name!r}: expected a Tensor, got {type(t).__name__}"
        return (
            f"input {self.name!r} of {self.region}: expected sizes {list(self.sizes)} and strides "
            f"{list(self.strides)} as captured, got sizes {list(t.shape)} and strides {list(t.stride())}. "
            "The graph was captured with static shapes (grids and size arguments are baked in); "
            "capture again with inputs of this shape."
        )

    def record(self) -> dict:
        return {"kind": "captured_layout", "input": self.input, "sizes": list(self.sizes),
                "strides": list(self.strides)}  # fmt: skip


CallGuard = ConstantInput | SameTensor | KernelGlobal | DisjointInputs | CapturedLayout


class GuardList(list):
    """The guards of one optimized graph, kept in its meta: copying the graph (deepcopy) shares
    them, as they are immutable and a KernelGlobal's scope is the kernel's module dict itself."""

    def __deepcopy__(self, memo):
        return self


def first_failure(guards: Sequence[CallGuard], values: Sequence) -> "CallGuard | None":
    for g in guards:
        if not g.check(values):
            return g
    return None


def describe(guard: CallGuard, names: Sequence[str]) -> str:
    """One line for explain()."""
    if isinstance(guard, ConstantInput):
        return f"{names[guard.position]} == {guard.value!r} (a captured constant)"
    if isinstance(guard, SameTensor):
        return f"{names[guard.first]} is {names[guard.second]} (one tensor at capture)"
    if isinstance(guard, KernelGlobal):
        return f"global {guard.name} == {guard.value!r} (read by kernel {guard.kernel})"
    if isinstance(guard, CapturedLayout):
        return f"{guard.name}: sizes {list(guard.sizes)} strides {list(guard.strides)} (static capture, on a miss)"
    return f"disjoint: {guard.what} (natively, each call)"
