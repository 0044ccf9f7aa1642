"""The SCM IR: plain data describing one Specialization Cache Module.

An SCM serves one region of an FX graph. It has
  * a RegionProgram: what the region does, independent of any specialization: its inputs
    (which ones kernels write), its steps (allocations and Triton launches, in order) and its
    outputs. It is the FX subgraph the partitioner cut, kept as a GraphModule.
  * Specializations: for one set of input facts (dtype, device, sizes, strides, Triton's
    16-byte alignment), the guards that recognise those facts (the prologue) and the concrete
    plan (allocation layouts, compiled kernels with their Triton keys and parameter sources).

Guards are kept apart from the plan (a prologue, as in Thunder) so the lowering can order and
share them. A static capture has ints for sizes; a symbolic one (Note [Symbolic sizes]) has
SizeExprs where sizes vary: grids, integer arguments, allocation layouts, size arguments.

This module is the single description the lowering (trident/lowering) consumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch

from ..layout import span
from .refs import KernelRef, compiled_kernel, live, operator


@dataclass(frozen=True)
class RegionInput:
    name: str
    mutated: bool  # some kernel of the region writes it


@dataclass(frozen=True)
class AllocStep:
    """A tensor allocated inside the region (aten.empty/empty_like/zeros/...)."""

    name: str
    op: str  # the ATen overload it came from, e.g. "aten.empty_like.default"
    zero: bool
    slot: int  # its place in the region's value table


@dataclass(frozen=True)
class AtenStep:
    """Any other operator with a schema, called from native code (boxed, through the
    dispatcher). `args` holds one entry per schema argument: a ValueRef, a list of ValueRefs
    and constants, a constant, or DEFAULT for the schema's default."""

    name: str
    op_name: str  # the operator by name, e.g. "aten.mm.default" (Note [Stable keys])
    args: tuple
    outputs: tuple[int, ...]  # value slots of its tensor results, in return order (-1: not kept)
    # Constant: deterministic, reads no region value, its results never written nor leaving the
    # region -- computed on the first call (per device) and reused (Note [Constant operator calls]).
    cached: bool = False

    @property
    def op(self) -> torch._ops.OpOverload:
        """The torch OpOverload `op_name` names."""
        return operator(self.op_name)


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default()


@dataclass(frozen=True)
class LaunchStep:
    """One Triton launch (a triton_kernel_wrapper_mutation node)."""

    name: str
    kernel: KernelRef  # the @triton.jit function, by stable key (Note [Stable keys]); `fn` is it
    kernel_name: str
    grid: tuple[int, int, int]
    args: dict[str, Any] = field(compare=False)  # param name -> Value ref or Python constant
    writes: tuple[str, ...]  # param names of the tensors it writes (torch's TTIR analysis)
    # A multi-config @triton.autotune launch (Note [Autotuned launches]): the Autotuner (by
    # stable key; `autotuner` is it) and the grid of each of its configs. A specialization picks
    # one config and replaces the step by the launch with that config's grid and arguments
    # (`tuned` then says which and how).
    tuner: Optional[KernelRef] = None
    grids: tuple = ()
    tuned: str = ""
    config: int = -1  # the index of the tuner's config this (tuned) step launches
    # Launched through @triton.heuristics: (the Heuristics by stable key, the values computed at
    # capture), re-checked for every specialization (Note [Autotuned launches]).
    heuristics: Optional[tuple] = field(default=None, compare=False)

    @property
    def fn(self):
        """The triton JITFunction launched."""
        return live(self.kernel)

    @property
    def autotuner(self):
        """The triton Autotuner of a multi-config launch, else None."""
        return None if self.tuner is None else live(self.tuner)


@dataclass(frozen=True)
class ValueRef:
    """A reference to a region value: an input (`kind="input"`, index = input position) or a
    value made inside the region (`kind="value"`, index = slot: allocations, ATen results)."""

    kind: str  # "input" | "value"
    index: int
    name: str


@dataclass
class RegionProgram:
    name: str
    inputs: list[RegionInput]
    steps: list[Union[AllocStep, AtenStep, LaunchStep]]
    outputs: list[ValueRef]  # values returned, in result order (always kind "value")
    value_names: list[str]  # name of each value slot
    graph_module: torch.fx.GraphModule  # the region as FX: placeholders = inputs, in order
    captured_inputs: list["TensorFacts"]  # facts of the inputs at capture time
    # Note [Symbolic sizes] (trident/scm/sizes.py); all empty for a static capture:
    symbols: dict = field(default_factory=dict)  # symbol name -> Binding (the input fact it is)
    input_exprs: list = field(default_factory=list)  # per input: (sizes, strides), ints and SizeExprs
    value_exprs: list = field(default_factory=list)  # per value slot: (sizes, strides, storage offset)
    size_guards: list = field(default_factory=list)  # what every size served must satisfy (guards.py)
    # Note [Layouts per input facts] (scm/specialize.py): the values' layouts per set of input
    # facts already propagated; a memo, not part of what the program is
    layouts: dict = field(default_factory=dict, compare=False, repr=False)
    # the launch plans built so far, by the facts of their arguments (scm/specialize.py:
    # _memo_launch_plan); a memo, like `layouts`
    launch_plans: dict = field(default_factory=dict, compare=False, repr=False)
    last_uses: dict = field(default_factory=dict, compare=False, repr=False)  # storage_last_uses, per storage ids
    view_plans: dict = field(default_factory=dict, compare=False, repr=False)  # plan_views, per input facts

    @property
    def symbolic(self) -> bool:
        return bool(self.symbols)

    @property
    def allocs(self) -> list[AllocStep]:
        return [s for s in self.steps if isinstance(s, AllocStep)]

    @property
    def launches(self) -> list[LaunchStep]:
        return [s for s in self.steps if isinstance(s, LaunchStep)]

    @property
    def atens(self) -> list[AtenStep]:
        return [s for s in self.steps if isinstance(s, AtenStep)]


@dataclass(frozen=True)
class TensorFacts:
    """What a guard may look at on one tensor."""

    dtype: torch.dtype
    device: torch.device
    sizes: tuple[int, ...]
    strides: tuple[int, ...]

    @staticmethod
    def of(t: torch.Tensor) -> "TensorFacts":
        return TensorFacts(t.dtype, t.device, tuple(int(s) for s in t.shape), tuple(int(s) for s in t.stride()))

    def span(self) -> int:
        """Elements from the first to the last one the layout addresses (0 when empty)."""
        return span(self.sizes, self.strides)

    def allocate(self, residue: int, zero: bool = False) -> torch.Tensor:
        """A fresh tensor with this layout at an address whose residue modulo 16 bytes is
        `residue` (a whole number of elements): what a specialization assumed of a tensor."""
        item = self.dtype.itemsize
        make = torch.zeros if zero else torch.empty
        base = make(self.span() + 16 // item, dtype=self.dtype, device=self.device)
        shift = ((residue - base.data_ptr() % 16) % 16) // item
        return base.as_strided(self.sizes, self.strides, shift)


@dataclass(frozen=True)
class TensorGuard:
    """Prologue check of one region input. `aligned16` follows Triton's rule for pointer
    arguments ('D' when data_ptr % 16 == 0): True/False pins it, None means no kernel
    specializes on this input's alignment."""

    input: int
    name: str
    facts: TensorFacts
    aligned16: Optional[bool]
    residue16: Optional[int] = None  # data_ptr % 16 exactly, when views of it reach kernels
    # dimensions whose size / stride is symbolic (Note [Symbolic sizes]): not compared with
    # `facts`; size guards of the specialization say what they may be
    free_sizes: tuple[int, ...] = ()
    free_strides: tuple[int, ...] = ()


@dataclass(frozen=True)
class Param:
    """One non-constexpr kernel parameter, as the compiled kernel receives it."""

    name: str
    ty: str  # Triton's type string: "*fp32", "i32", "fp32", ...
    source: Union[ValueRef, int, float, bool]


@dataclass
class AllocPlan:
    step: AllocStep
    facts: TensorFacts
    arena_offset: int = -1  # byte offset in the call's arena (Note [Allocation arena]); -1: own buffer
    arena_bytes: int = 0  # the arena's size for this specialization
    # Note [Symbolic sizes]: the sizes and strides as expressions, when some are symbolic
    # (computed by the host program on every call)
    sizes_expr: tuple = ()
    strides_expr: tuple = ()
    # Note [Symbolic arena]: >= 0 when this buffer is entry `arena_slot` of the specialization's
    # arena table (its offset computed per call from the sizes); arena_offset is then -1
    arena_slot: int = -1

    @property
    def dynamic(self) -> bool:
        return bool(self.sizes_expr)


@dataclass
class LaunchPlan:
    step: LaunchStep
    key: tuple  # Triton's specialization, e.g. (('*fp32', 'D'), ('i32', ''), ('constexpr', 128))
    params: list[Param]
    constexprs: dict[str, Any]  # every constexpr param (declared or folded by Triton) and its value
    num_warps: int
    num_ctas: int  # > 1: launched as clusters of num_ctas CTAs (Note [Cluster launches])
    shared: int
    aligned_values: tuple[int, ...]  # value slots passed as 'D' pointers: checked at run time
    binary: Optional[str] = None  # the compiled kernel by Triton's hash of it (`compiled` is it); None: not compiled
    cooperative: bool = False  # Triton's launch_cooperative_grid
    pdl: bool = False  # Triton's launch_pdl
    grid: tuple = ()  # the grid as launched (ints and SizeExprs); () -> step.grid
    # Note [Programmatic edges only in graphs]: where `binary` is a user kernel's waiting twin, the
    # user's own kernel by Triton's hash, which ordinary calls launch (recordings: the twin)
    ordinary: Optional[str] = None

    @property
    def compiled(self):
        """Triton's CompiledKernel (Note [Stable keys]), None when not compiled."""
        return None if self.binary is None else compiled_kernel(self.binary, self.step.kernel_name)

    @property
    def ordinary_compiled(self):
        """The CompiledKernel ordinary calls launch instead of `compiled` (None: `compiled`)."""
        return None if self.ordinary is None else compiled_kernel(self.ordinary, self.step.kernel_name)


@dataclass
class AtenPlan:
    step: AtenStep


@dataclass
class ViewPlan:
    """A view operator computed natively from the planned layout (no dispatch). When only
    kernels read it, it is never materialized: the host adds `delta_bytes` to the base's
    pointer."""

    step: AtenStep
    base: ValueRef
    base_facts: TensorFacts
    facts: TensorFacts
    offset_delta: int  # storage offset of the view minus its base's, in elements
    delta_bytes: int
    pointer_only: bool
    # Note [Symbolic views]: when the layout depends on sizes, (base sizes, base strides, sizes,
    # strides, offset delta) as ints and SizeExprs the host program computes on every call
    exprs: tuple = ()

    @property
    def dynamic(self) -> bool:
        return bool(self.exprs)


@dataclass(frozen=True)
class ArenaBuffer:
    """One buffer of a symbolic arena (Note [Symbolic arena], scm/specialize.py): the value slot
    it becomes, its size in bytes when that is fixed (-1: computed from its allocation's sizes
    and strides on every call), and the buffers it is placed above (live at the same time and
    earlier in the placement order): its offset is the highest end among them."""

    slot: int
    nbytes: int
    below: tuple[int, ...]


@dataclass
class Specialization:
    index: int
    guards: list[TensorGuard]
    allocs: list[AllocPlan]
    launches: list[LaunchPlan]
    atens: list[AtenPlan] = field(default_factory=list)
    value_facts: list[TensorFacts] = field(default_factory=list)  # per value slot
    views: dict[str, ViewPlan] = field(default_factory=dict)  # by step name
    # Note [Early release]: after program step i, the value slots dropped from the value table
    releases: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # Note [Symbolic sizes]: the program's size guards, then this specialization's own (Triton's
    # integer keys, values an autotuner or heuristic saw), evaluated natively with the tensor guards
    size_guards: list = field(default_factory=list)
    # Note [Symbolic arena]: the arena's buffers when their offsets depend on sizes (indexed by
    # AllocPlan.arena_slot); empty when the arena, if any, has fixed offsets
    arena: list[ArenaBuffer] = field(default_factory=list)


@dataclass
class SCM:
    program: RegionProgram
    max_rank: int
    specializations: list[Specialization] = field(default_factory=list)
