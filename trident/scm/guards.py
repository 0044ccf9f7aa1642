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
  SizeRelation     the region, natively   a relation between sizes the symbolic trace     a miss (GuardError
                                          assumed (the shape environment's guards and     on the miss when
                                          ranges: s0 >= 2, Eq(s1, s0))                    a program guard)
  FactEquals       the region, natively   a size or stride tied to a symbol another fact  same
                                          binds (two inputs of one size, a contiguous
                                          tensor's stride s1)
  IntegerKey       the region, natively   Triton's key of an integer kernel argument      a miss: the next
                                          computed from sizes (== 1, % 16, i32 / i64)     specialization
  GraphFacts       the region's graph     a recorded CUDA graph's facts: dtype, sizes,    the ordinary path
                   replay, natively       strides as recorded, pinned inputs at their     (explain() says
                                          addresses, staged inputs not aliasing written   why)
                                          ones (Note [Graph replay])
  TracedShapes     the module's __call__  every assumption of a symbolic trace about the  GuardError
                                          graph's inputs (shape guards, ranges, static
                                          dims, facts tied to symbols), also those no
                                          region checks natively (a guard of Python code
                                          outside regions, an expression with no native
                                          form): generated Python, ~1 µs a call
  TracedValue      the module's __call__  a value the trace specialized (a nonzero count, GuardError
                                          a repeat total, a scalar read) is the same for
                                          this call: its slice of the graph run on the
                                          call's inputs
                                          (Note [Values a trace specializes])

Every kind has `check(values) -> bool`, the test, `failure(values, names) -> str`, what was
expected, what came and what to do, in the caller's names (torch's guard manager's check and
check_verbose), and `describe(names)`, its one line in explain(). A native kind's `check` is the
Python twin of its native code, which the tests compare on generated inputs; `record()` is its
plain-data form (no live object; KernelGlobal names its value's module dict by the kernel's module).
Guards on the graph's inputs index the graph's placeholders; region guards (`native`) index the
region's inputs.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import sympy
import torch

from ..layout import span_bytes
from .ir import TensorFacts
from .sizes import INT_KEY_CODES, Binding, int_key_condition, to_text

_MISSING = object()


def same_constant(got, want) -> bool:
    """A value equals a captured one: same type; a float by bits (the captured nan passes, -0.0
    is not 0.0: 1 / x differs)."""
    if type(got) is not type(want):
        return False
    if type(got) is float:
        return struct.pack("<d", got) == struct.pack("<d", want)
    return got == want


@dataclass(frozen=True)
class ConstantInput:
    position: int
    value: Any
    native: ClassVar[bool] = False

    def check(self, values: Sequence) -> bool:
        return same_constant(values[self.position], self.value)

    def failure(self, values: Sequence, names: Sequence[str]) -> str:
        i = self.position
        return (
            f"input {names[i]!r} (position {i}) was captured as the constant {self.value!r}, got {values[i]!r}; "
            "non-tensor inputs are baked into the captured graph: capture again with this value"
        )

    def describe(self, names: Sequence[str]) -> str:
        """One line for explain() and the printed program."""
        return f"{names[self.position]} == {self.value!r} (a captured constant)"

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

    def describe(self, names: Sequence[str]) -> str:
        """One line for explain() and the printed program."""
        return f"{names[self.first]} is {names[self.second]} (one tensor at capture)"

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

    def describe(self, names: Sequence[str]) -> str:
        """One line for explain() and the printed program."""
        return f"global {self.name} == {self.value!r} (read by kernel {self.kernel})"

    def record(self) -> dict:
        return {"kind": "kernel_global", "kernel": self.kernel, "name": self.name, "value": repr(self.value),
                "module": self.scope.get("__name__")}  # fmt: skip


@dataclass(frozen=True)
class DisjointInputs:
    written: int
    read: int
    what: str  # "<step> writes input 'cache' and reads input 'k' (src_ptr)"
    eager: bool = True  # eager refuses the overlap too; False: only Trident's kernel needs them apart
    native: ClassVar[bool] = True

    def check(self, values: Sequence) -> bool:
        a, b = values[self.written], values[self.read]
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.device != b.device:
            return True
        a0, b0 = a.data_ptr(), b.data_ptr()
        a1, b1 = a0 + span_bytes(a), b0 + span_bytes(b)
        return a0 == a1 or b0 == b1 or a1 <= b0 or b1 <= a0

    def failure(self, values: Sequence = (), names: Sequence[str] = ()) -> str:
        if not self.eager:
            return (
                f"{self.what}, and the two overlap in memory: Trident's decode attention writes the step's cache "
                "rows while its other programs read the rest (Note [The cache write inside the attention]), which "
                "needs them apart; eager, which writes first and reads after, accepts them. Pass tensors that do "
                "not overlap, or set TRIDENT_CACHE_ATTENTION=0 to keep the cache write a launch of its own.")
        return (
            f"{self.what}, and the two overlap in memory. Eager raises here too (unsupported operation: some "
            "elements of the input tensor and the written-to tensor refer to a single memory location); pass "
            "tensors that do not overlap, e.g. a .clone() of the one read."
        )

    def describe(self, names: Sequence[str]) -> str:
        """One line for explain() and the printed program."""
        return f"disjoint: {self.what} (natively, each call)"

    def record(self) -> dict:
        return {"kind": "disjoint_inputs", "written": self.written, "read": self.read, "what": self.what,
                "eager": self.eager}


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
        if not isinstance(t, torch.Tensor) or t.dim() != len(self.sizes):
            return False
        # None: a symbolic size or stride (Note [Symbolic sizes]): the size guards say what it may be.
        # Only significant strides count (torch._prims_common's rule): the stride of a dimension
        # of size 1, or of any dimension of an empty tensor, addresses nothing -- every index
        # along it is 0 -- so a kernel that baked the captured one reads the same elements. Real
        # kernels and their meta functions often disagree there (cuDNN's attention output).
        empty = t.numel() == 0
        return all(w is None or w == g for w, g in zip(self.sizes, t.shape)) and all(
            w is None or w == g or empty or n == 1 for w, g, n in zip(self.strides, t.stride(), t.shape)
        )

    def failure(self, values: Sequence, names: Sequence[str] = ()) -> str:
        t = values[self.input]
        if not isinstance(t, torch.Tensor):
            return f"input {self.name!r}: expected a Tensor, got {type(t).__name__}"
        if any(v is None for v in self.sizes + self.strides):
            fmt = lambda xs: "[" + ", ".join("*" if v is None else str(v) for v in xs) + "]"  # noqa: E731
            return (
                f"input {self.name!r} of {self.region}: expected rank {len(self.sizes)}, sizes {fmt(self.sizes)} and "
                f"strides {fmt(self.strides)} (* varies: captured with symbolic sizes), got sizes {list(t.shape)} "
                f"and strides {list(t.stride())}. The other sizes were static in the trace (0, 1, or the sizes of "
                "tensors the function holds); capture again with inputs of this shape."
            )
        if tuple(t.shape) == tuple(self.sizes):  # the same shape in another memory layout
            return (
                f"input {self.name!r} of {self.region}: expected strides {list(self.strides)} as captured, got "
                f"strides {list(t.stride())} for the same sizes {list(t.shape)} (another memory layout: a "
                "transposed, sliced or expanded tensor). The kernels were planned for the captured layout; pass "
                f"a tensor with it ({self.name}.contiguous() when the captured one was contiguous), or capture "
                "with an example input of this layout (trident.compile does so by itself for a new layout)."
            )
        return (
            f"input {self.name!r} of {self.region}: expected sizes {list(self.sizes)} and strides "
            f"{list(self.strides)} as captured, got sizes {list(t.shape)} and strides {list(t.stride())}. "
            "The graph was captured with static shapes (grids and size arguments are baked in); "
            "capture again with inputs of this shape, or capture with dynamic=True (trident.compile does "
            "when a size changes)."
        )

    def describe(self, names: Sequence[str]) -> str:
        """One line for explain() and the printed program."""
        return f"{self.name}: sizes {list(self.sizes)} strides {list(self.strides)} (static capture, on a miss)"

    def record(self) -> dict:
        return {"kind": "captured_layout", "input": self.input, "sizes": list(self.sizes),
                "strides": list(self.strides)}  # fmt: skip


def environment(symbols: dict, values: Sequence) -> dict:
    """The value of every size symbol for region inputs `values` (Note [Symbolic sizes])."""
    env = {}
    for name, b in symbols.items():
        t = values[b.input]
        if not isinstance(t, torch.Tensor) or t.dim() <= b.dim:
            raise _Unbound(name)
        env[name] = int(t.shape[b.dim] if b.kind == "size" else t.stride(b.dim))
    return env


class _Unbound(Exception):
    pass


def _fact(t, kind: str, dim: int):
    if not isinstance(t, torch.Tensor) or t.dim() <= dim:
        return None
    return int(t.shape[dim] if kind == "size" else t.stride(dim))


@dataclass(frozen=True)
class SizeRelation:
    """A relation between sizes (a SizeExpr of a sympy relation) that the plan assumes."""

    expr: Any  # SizeExpr
    symbols: dict = field(compare=False, repr=False)  # the program's bindings
    why: str = "shape guard"  # "shape guard" | "range" | "autotune" | "heuristic" | "constexpr"
    native: ClassVar[bool] = True

    def check(self, values: Sequence) -> bool:
        try:
            return bool(self.expr.evaluate(environment(self.symbols, values)))
        except (_Unbound, ZeroDivisionError):
            return False

    def failure(self, values: Sequence, names: Sequence[str] = ()) -> str:
        try:
            env = environment(self.symbols, values)
            got = ", ".join(f"{k} = {v}" for k, v in sorted(env.items()) if k in self.expr.symbols)
        except _Unbound as e:
            got = f"no value for {e.args[0]} (an input has fewer dimensions)"
        where = ", ".join(f"{k} = {_where(self.symbols[k], names)}" for k in sorted(self.expr.symbols))
        if self.why not in ("shape guard", "range"):  # a specialization's own: another one serves it
            return f"{self.expr} ({self.why}; {where}) does not hold for {got}: a specialization for it is built"
        return (
            f"the graph was captured for sizes with {self.expr} ({self.why}; {where}), got {got}. "
            "Sizes 0 and 1 and sizes the traced code compared are specialized by the symbolic trace, as "
            "torch.compile's are; capture again with inputs of these sizes."
        )

    def describe(self, names: Sequence[str]) -> str:
        """One line for explain() and the printed program."""
        return f"{self.expr} ({self.why})"

    def condition(self) -> tuple[sympy.Basic, dict]:
        """What the host program checks (Note [Sizes through the torch dialect]): a relation over
        the program's symbols, and the bindings of any other symbol it names (none)."""
        return self.expr.expr, {}

    def record(self) -> dict:
        return {"kind": "size_relation", "expr": to_text(self.expr), "why": self.why}


def _where(b, names) -> str:
    name = names[b.input] if b.input < len(names) else f"input {b.input}"
    return f"{name}.{'shape' if b.kind == 'size' else 'stride()'}[{b.dim}]"


@dataclass(frozen=True)
class FactEquals:
    """Size or stride `dim` of input `input` equals `expr` over the symbols other facts bind."""

    input: int
    name: str
    kind: str  # "size" | "stride"
    dim: int
    expr: Any  # SizeExpr
    symbols: dict = field(compare=False, repr=False)
    native: ClassVar[bool] = True

    def check(self, values: Sequence) -> bool:
        got = _fact(values[self.input], self.kind, self.dim)
        try:
            return got is not None and got == self.expr.evaluate(environment(self.symbols, values))
        except _Unbound:
            return False

    def failure(self, values: Sequence, names: Sequence[str] = ()) -> str:
        got = _fact(values[self.input], self.kind, self.dim)
        what = "shape" if self.kind == "size" else "stride()"
        where = ", ".join(f"{k} = {_where(self.symbols[k], names)}" for k in sorted(self.expr.symbols))
        try:
            want = self.expr.evaluate(environment(self.symbols, values))
        except _Unbound:
            want = "?"
        return (
            f"input {self.name!r}: {what}[{self.dim}] was traced as {self.expr} ({where}), so it must be {want}; "
            f"got {got}. Capture again with inputs related like these."
        )

    def describe(self, names: Sequence[str]) -> str:
        """One line for explain() and the printed program."""
        return f"{self.name}.{'shape' if self.kind == 'size' else 'stride()'}[{self.dim}] == {self.expr}"

    def condition(self) -> tuple[sympy.Basic, dict]:
        """Eq(the fact, expr), the fact a symbol of its own (see SizeRelation.condition)."""
        fact = f"fact{self.input}_{self.kind}{self.dim}"
        expr = self.expr.expr if hasattr(self.expr, "expr") else sympy.Integer(self.expr)
        return sympy.Eq(sympy.Symbol(fact, integer=True), expr), {fact: Binding(self.input, self.kind, self.dim)}

    def record(self) -> dict:
        return {"kind": "fact_equals", "input": self.input, "fact": self.kind, "dim": self.dim, "expr": to_text(self.expr)}


@dataclass(frozen=True)
class IntegerKey:
    """Triton's key of an integer kernel argument computed from sizes (Note [Integer keys]):
    `code` of INT_KEY_CODES for the value of `expr`."""

    expr: Any  # SizeExpr
    code: int
    specialize: bool
    what: str  # "launch axpy_kernel: n"
    symbols: dict = field(compare=False, repr=False)
    native: ClassVar[bool] = True

    def key_of(self, value: int) -> int:
        """Triton's key of `value` (its specialize_impl): the Python twin of `condition`."""
        ty = "i32" if -(2**31) <= value <= 2**31 - 1 else "i64"
        if not self.specialize:
            return INT_KEY_CODES[(ty, None)]
        if value == 1:
            return INT_KEY_CODES[("constexpr", 1)]
        return INT_KEY_CODES[(ty, "D" if value % 16 == 0 else "")]

    def check(self, values: Sequence) -> bool:
        try:
            return self.key_of(self.expr.evaluate(environment(self.symbols, values))) == self.code
        except (_Unbound, ZeroDivisionError):
            return False

    def failure(self, values: Sequence, names: Sequence[str] = ()) -> str:
        return f"{self.what} = {self.expr} has another Triton key: Triton compiles another binary for it"

    def describe(self, names: Sequence[str]) -> str:
        """One line for explain() and the printed program."""
        key = next((k for k, c in INT_KEY_CODES.items() if c == self.code), self.code)
        return f"Triton key of {self.what} = {self.expr} is {key}"

    def condition(self) -> tuple[sympy.Basic, dict]:
        """The key as a relation of expr (sizes.int_key_condition; see SizeRelation.condition)."""
        return int_key_condition(self.expr.expr, self.code, self.specialize), {}

    def record(self) -> dict:
        return {"kind": "integer_key", "expr": to_text(self.expr), "code": self.code, "specialize": self.specialize,
                "what": self.what}  # fmt: skip


@dataclass(frozen=True)
class TracedShapes:
    """All a symbolic trace assumed about its inputs' sizes (Note [Symbolic sizes]): conditions
    over `sources` (symbol -> (placeholder, "size"|"stride", dim)), each a Python expression torch's
    PythonPrinter wrote, checked together by one generated function."""

    conditions: tuple  # (python source, what it says in the caller's terms)
    sources: tuple  # ((symbol, placeholder, kind, dim), ...)
    ranks: tuple  # ((placeholder, rank), ...)
    native: ClassVar[bool] = False

    def __post_init__(self):
        lines = ["def check(args):", "    try:"]
        for i, r in self.ranks:
            lines.append(f"        if args[{i}].dim() != {r}: return None")
        for name, i, kind, d in self.sources:
            lines.append(f"        {name} = args[{i}].{'size' if kind == 'size' else 'stride'}({d})")
        lines.append("    except (AttributeError, IndexError, TypeError):")
        lines.append("        return None")
        lines.append("    return (" + ", ".join(f"({c})" for c, _ in self.conditions) + ",)")
        namespace: dict = {}
        exec(compile("\n".join(lines), "<trident traced shapes>", "exec"), namespace)  # noqa: S102 - our own text
        object.__setattr__(self, "_results", namespace["check"])
        fast = lines[:-1] + ["    return " + (" and ".join(f"({c})" for c, _ in self.conditions) or "True")]
        fast = [line.replace("return None", "return False") for line in fast]
        namespace = {}
        exec(compile("\n".join(fast), "<trident traced shapes>", "exec"), namespace)  # noqa: S102
        object.__setattr__(self, "_check", namespace["check"])

    def check(self, values: Sequence) -> bool:
        return bool(self._check(values))

    def failure(self, values: Sequence, names: Sequence[str] = ()) -> str:
        results = self._results(values)
        if results is None:
            for i, rank in self.ranks:
                name = names[i] if i < len(names) else f"input {i}"
                if not isinstance(values[i], torch.Tensor):
                    return f"input {name!r} (position {i}): expected a Tensor, got {type(values[i]).__name__}"
                if values[i].dim() != rank:
                    return (f"input {name!r} (position {i}): expected rank {rank} as traced, got rank {values[i].dim()} "
                            f"(sizes {list(values[i].shape)}); capture again with inputs of this rank")
            return "the inputs do not fit the symbolic trace"
        what = next((w for (c, w), ok in zip(self.conditions, results) if not ok), "?")
        if len(what) > 160:  # a condition the traced code computed (next_power_of_2's bit twiddling)
            what = what[:150] + " ... (a condition the traced code computed on these sizes)"
        env = {}
        for name, i, kind, d in self.sources:
            try:
                env[name] = values[i].size(d) if kind == "size" else values[i].stride(d)
            except (AttributeError, IndexError, TypeError):
                pass
        where = ", ".join(f"{n} = {names[i] if i < len(names) else i}.{'shape' if k == 'size' else 'stride()'}[{d}]"
                          f" = {env.get(n)}" for n, i, k, d in self.sources if n in what)
        return (
            f"the graph was traced with symbolic sizes assuming {what}{f' ({where})' if where else ''}; these "
            "inputs break it. Sizes 0 and 1 and sizes the traced code compared are specialized by the trace, as "
            "torch.compile's are; capture again with inputs of these sizes (trident.compile does)."
        )

    def describe(self, names: Sequence[str]) -> str:
        """One line for explain() and the printed program."""
        return "symbolic trace: " + "; ".join(w for _, w in self.conditions)

    def record(self) -> dict:
        return {"kind": "traced_shapes", "conditions": [c for c, _ in self.conditions]}


# What a TracedValue specialized, by kind: (explain()'s word, the guard's failure's words)
VALUE_KINDS = {
    "count": ("nonzero count", "the number of nonzero elements"),
    "total": ("repeat total", "the sum of the repeats (the size repeat_interleave makes)"),
    "scalar": ("scalar", "the scalar read"),
}


@dataclass(frozen=True)
class TracedValue:
    """A value the trace specialized (Note [Values a trace specializes], capture/values.py): the
    pure slice of the graph computing an operand (`program`, over `sources`: graph-input positions,
    or the tensors the function holds), what of it was specialized (`kind`: "count", the number of
    nonzero elements; "total", the sum of repeat_interleave's repeats; "scalar", `.item()`) and
    the value it had at capture."""

    program: Any  # torch.fx.GraphModule: one input per source, the operand out
    sources: tuple  # per program input: an int (the graph input at that position) or a tensor held
    kind: str
    value: Any
    where: str  # the user's line that read it
    disjoint: tuple = ()  # sources (as `sources`) written before the read: none may share memory with a source
    native: ClassVar[bool] = False

    def evaluate(self, values: Sequence):
        """The value for these inputs (graph inputs by position, held tensors as they are now)."""
        inputs = [values[s] if isinstance(s, int) else s for s in self.sources]
        with torch.no_grad():
            operand = self.program(*inputs)
        if self.kind == "count":
            return int(torch.count_nonzero(operand))
        if self.kind == "total":  # one read for both: the sum, and that no repeat is negative
            total, least = torch.stack([operand.sum(), operand.min()]).tolist() if operand.numel() else (0, 0)
            if least < 0:  # eager refuses these (on the host); a kernel given the total would not
                raise ValueError(f"repeat_interleave's repeats include {least} (negative)")
            return int(total)
        return operand.item()

    def overlaps(self, values: Sequence) -> bool:
        """Whether a tensor written before the read shares memory with one the slice reads."""
        if not self.disjoint:
            return False
        read = [values[s] if isinstance(s, int) else s for s in self.sources]
        for w in self.disjoint:
            wt = values[w] if isinstance(w, int) else w
            if any(shares_storage(t, wt) for t in read):
                return True
        return False

    def check(self, values: Sequence) -> bool:
        try:
            if self.overlaps(values):
                return False
            got = self.evaluate(values)
        except Exception:  # noqa: BLE001 - inputs the slice cannot take: not this capture's
            return False
        return same_constant(got, self.value)

    def failure(self, values: Sequence, names: Sequence[str] = ()) -> str:
        try:
            if self.overlaps(values):
                return (f"the capture specialized a value read at {self.where} from inputs that a write before it "
                        "does not touch; in this call they share memory: capture again with separate tensors")
            got = repr(self.evaluate(values))
        except Exception as e:  # noqa: BLE001
            got = f"an error ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        what = VALUE_KINDS[self.kind][1]
        return (f"the capture specialized {what} at {self.where} to {self.value!r}; these inputs give {got}. "
                "A value only the data gives is one per capture: trident.compile captures again for it")

    def describe(self, names: Sequence[str]) -> str:
        """One line for explain() and the printed program."""
        return f"{VALUE_KINDS[self.kind][0]} at {self.where} == {self.value!r} (specialized by the trace, each call)"

    def record(self) -> dict:
        return {"kind": "traced_value", "value_kind": self.kind, "value": self.value, "where": self.where,
                "disjoint_from": len(self.disjoint)}


# Why a call replays no recorded graph (the native runtime's `Ordinary` codes, graph_replay.h),
# in the caller's names: GraphFacts.failure and explain() both word a reason from here.
GRAPH_MISS_REASONS = {
    "no_graph": "no graph recorded (yet)",
    "capturing": "the caller's stream was being captured (the caller's own CUDA graph records ordinary launches)",
    "stream": "no graph for this stream and device (a graph replays on the stream it was recorded for)",
    "facts": "input {name!r} has another dtype, rank, sizes or strides than in every graph",
    "pinned_moved": "input {name!r} is pinned in the graphs and came at another address",
    "aliased": "staged input {name!r} shares memory with an input the region writes (or is written and shares "
    "memory with another input)",
    "unstageable": "input {name!r} moves between calls and cannot be staged, so no graph is recorded while it moves",
    "lent_held": "an output the graph lent at its previous replay was still referenced, and a replay would overwrite "
    "it (Note [Lent outputs])",
}


@dataclass(frozen=True)
class GraphFacts:
    """What a call must bring for recorded graph `graph` of a region to replay (Note [Graph
    replay], graph_replay.cpp: facts_match and staged_conflict, whose Python twin `check` is):
    every input's dtype, device, sizes and strides as recorded; the recorded address for each
    input the graph pins (staged ones are copied in, their address is free); and no staged input
    sharing memory with an input the region writes (or, written, with any other input)."""

    graph: int
    facts: tuple  # per region input: its TensorFacts at recording, None for a non-tensor
    addresses: tuple[int, ...]  # per region input: data_ptr at recording (0: not a tensor)
    staged: tuple[bool, ...]
    written: tuple[bool, ...]  # per region input: the region writes it
    native: ClassVar[bool] = True

    @staticmethod
    def of(graph: int, inputs: Sequence, staged: Sequence[bool], written: Sequence[bool]) -> "GraphFacts":
        return GraphFacts(
            graph,
            tuple(TensorFacts.of(t) if isinstance(t, torch.Tensor) else None for t in inputs),
            tuple(t.data_ptr() if isinstance(t, torch.Tensor) else 0 for t in inputs),
            tuple(bool(s) for s in staged),
            tuple(bool(w) for w in written),
        )

    def reason(self, values: Sequence) -> "tuple[str, int] | None":
        """(Ordinary code, input) of the first fact that keeps this graph from replaying, or None."""
        for i, (t, want) in enumerate(zip(values, self.facts)):
            got = TensorFacts.of(t) if isinstance(t, torch.Tensor) else None
            if got != want:
                return "facts", i
            address = t.data_ptr() if isinstance(t, torch.Tensor) else 0
            if address != self.addresses[i] and not self.staged[i]:
                return "pinned_moved", i
        for i, t in enumerate(values):
            if not self.staged[i]:
                continue
            for j, u in enumerate(values):
                if j != i and (self.written[i] or self.written[j]) and shares_storage(t, u):
                    return "aliased", i
        return None

    def check(self, values: Sequence) -> bool:
        return self.reason(values) is None

    def failure(self, values: Sequence, names: Sequence[str]) -> str:
        why = self.reason(values)
        if why is None:
            return ""
        code, i = why
        return f"graph {self.graph}: " + GRAPH_MISS_REASONS[code].format(name=names[i])

    def describe(self, names: Sequence[str]) -> str:
        """One line for explain() and the printed program."""
        pinned = [names[i] for i, st in enumerate(self.staged) if not st]
        return (f"graph {self.graph}: every input's dtype, sizes and strides as recorded; pinned at their "
                f"recorded addresses: {', '.join(pinned) or 'none'}; staged inputs not sharing a written one's memory")

    def record(self) -> dict:
        return {"kind": "graph_facts", "graph": self.graph, "staged": list(self.staged),
                "pinned": [i for i, s in enumerate(self.staged) if not s]}


def shares_storage(a, b) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    pa, pb = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
    return pa == pb and pa != 0


SizeGuard = SizeRelation | FactEquals | IntegerKey
CallGuard = (ConstantInput | SameTensor | KernelGlobal | DisjointInputs | CapturedLayout | TracedShapes | TracedValue
             | GraphFacts)


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
