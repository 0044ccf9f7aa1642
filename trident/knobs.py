"""Every TRIDENT_* environment setting, typed, in one place.

Read at use (not at import) so tests can change them with `knobs.scope(...)`. Each knob of
`_KNOBS` has one type and each type one parser (as Triton's knobs.py: env_bool, env_int, ...),
so "off", "no" and "0" mean the same for every knob. Words are read case-insensitively, with
spaces around them ignored:

  Bool      a switch: on is 1/true/yes/on/y/t, off is 0/false/no/off/n/f/none and '' (empty is
            off, as for every knob below where off is a value; unset is the knob's default)
  Int       a decimal integer within the knob's bounds (e.g. 0..16, >= 0)
  Float     a number; 'inf' and '-inf' allowed, 'nan' not
  Str       any text, kept as it is (a folder; '' is none)
  Choice    one of a few words, or a switch: off (a Bool off spelling) is the knob's off word,
            on (a Bool on spelling) its on word. Device modes ('cuda', 'all', off ''; on means
            'cuda', the default) and TRIDENT_PROGRESS ('auto', 'always', 'never') are Choices.
  Names     a comma list of names from a fixed set (and 'all' where the knob allows it); a
            lone off spelling is the empty list
  Prefixes  a comma list of dotted module prefixes, '*' for any; a lone off spelling is none
  PrefixRules  'auto', or a comma list of module prefixes each marked '+' (always) or '-'
            (never), a bare prefix being '+'; a lone off spelling is never (ModuleRules)

A value that does not parse raises KnobError (a TridentError and a ValueError) naming the
variable, the value that came and what is expected.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Union

from .errors import KnobError


TRUE = ("1", "true", "yes", "on", "y", "t")
FALSE = ("0", "false", "no", "off", "n", "f", "none", "")


def _spellings(words: tuple[str, ...]) -> str:
    return "/".join(w or "''" for w in words)


def _word(raw: str) -> str:
    return raw.strip().lower()


def _fail(env: str, raw: str, expected: str) -> KnobError:
    return KnobError(f"{env}={raw!r}: expected {expected}")


@dataclass(frozen=True)
class Bool:
    """A switch; everything that is neither an on nor an off spelling is refused, not guessed."""

    def parse(self, env: str, raw: str) -> bool:
        word = _word(raw)
        if word in TRUE:
            return True
        if word in FALSE:
            return False
        raise _fail(env, raw, self.expected())

    def expected(self) -> str:
        return f"on ({_spellings(TRUE)}) or off ({_spellings(FALSE)})"


@dataclass(frozen=True)
class Int:
    """An integer within [lo, hi] (None: unbounded on that side)."""

    lo: Optional[int] = None
    hi: Optional[int] = None

    def parse(self, env: str, raw: str) -> int:
        try:
            value = int(raw.strip(), 10)
        except ValueError:
            raise _fail(env, raw, self.expected()) from None
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise _fail(env, raw, self.expected())
        return value

    def expected(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"an integer in {self.lo}..{self.hi}"
        if self.lo is not None:
            return f"an integer >= {self.lo}"
        if self.hi is not None:
            return f"an integer <= {self.hi}"
        return "an integer"


@dataclass(frozen=True)
class Float:
    """A number; nan is refused because every comparison with it is false (the knob would be
    silently ignored)."""

    def parse(self, env: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise _fail(env, raw, self.expected()) from None
        if math.isnan(value):
            raise _fail(env, raw, self.expected())
        return value

    def expected(self) -> str:
        return "a number (or inf, -inf)"


@dataclass(frozen=True)
class Str:
    """Text kept as it came: a folder name may hold any character."""

    def parse(self, env: str, raw: str) -> str:
        return raw

    def expected(self) -> str:
        return "any text ('' for none)"


@dataclass(frozen=True)
class Choice:
    """One of `words`, or a switch: an off spelling is `off`, an on spelling `on` (the knob's
    meaning of plain "on"), so TRIDENT_GRAPHS=no and TRIDENT_GRAPHS=1 both mean something."""

    words: tuple[str, ...]
    on: str
    off: str

    def parse(self, env: str, raw: str) -> str:
        word = _word(raw)
        if word in self.words:
            return word
        if word in FALSE:
            return self.off
        if word in TRUE:
            return self.on
        raise _fail(env, raw, self.expected())

    def expected(self) -> str:
        off = f"off ({_spellings(FALSE)})" if self.off == "" else f"off ({_spellings(FALSE)}: {self.off!r})"
        return f"{', '.join(repr(w) for w in self.words)}, on ({_spellings(TRUE)}: {self.on!r}) or {off}"


@dataclass(frozen=True)
class Names:
    """A comma list of names from `known`; `everything` (if set) stands for all of them. An
    unknown name is refused: a typo must not silently turn a path or a logger off."""

    known: tuple[str, ...]
    everything: Optional[str] = None

    def parse(self, env: str, raw: str) -> tuple[str, ...]:
        if _word(raw) in FALSE:
            return ()
        names = {n.strip().lower() for n in raw.split(",") if n.strip()}
        unknown = sorted(names - set(self.known) - {self.everything})
        if unknown:
            raise KnobError(f"{env}={raw!r}: unknown {unknown}; expected {self.expected()}")
        if self.everything in names:
            return self.known
        return tuple(n for n in self.known if n in names)  # in table order, once each

    def expected(self) -> str:
        listed = f"a comma list of {', '.join(self.known)}"
        if self.everything is not None:
            listed += f" or {self.everything}"
        return f"{listed}; none: {_spellings(FALSE)}"


@dataclass(frozen=True)
class Prefixes:
    """A comma list of dotted module prefixes ('*': any module)."""

    def parse(self, env: str, raw: str) -> tuple[str, ...]:
        if _word(raw) in FALSE:
            return ()
        prefixes = tuple(p.strip() for p in raw.split(",") if p.strip())
        bad = [p for p in prefixes if p != "*" and not all(part.isidentifier() for part in p.split("."))]
        if bad:
            raise KnobError(f"{env}={raw!r}: not module prefixes {bad}; expected {self.expected()}")
        return prefixes

    def expected(self) -> str:
        return f"a comma list of module prefixes (a.b) or '*'; none: {_spellings(FALSE)}"


@dataclass(frozen=True)
class ModuleRules:
    """A PrefixRules value: per module, "trace", "break" or "check". The longest entry of
    `forced` that names the module decides ('*' names every module, as the shortest prefix);
    `rest` decides for modules no entry names."""

    rest: str  # "check" or "break"
    forced: tuple[tuple[str, str], ...] = ()  # (prefix or '*', "trace" or "break")

    def action(self, module: str) -> str:
        longest, action = -1, self.rest
        for prefix, forced in self.forced:
            if prefix == "*":
                length = 0
            elif module == prefix or module.startswith(prefix + "."):
                length = len(prefix)
            else:
                continue
            if length > longest:
                longest, action = length, forced
        return action


@dataclass(frozen=True)
class PrefixRules(Prefixes):
    """'auto' (the check everywhere), or a comma list of dotted module prefixes ('*': any
    module), each '+prefix' (always "trace"), '-prefix' (always "break") or a bare prefix (as
    '+': what a bare list meant when it named the only modules traced), with 'auto' allowed
    among them; modules no entry names get "check". A lone off spelling: "break" everywhere."""

    def parse(self, env: str, raw: str) -> ModuleRules:  # type: ignore[override]
        if _word(raw) in FALSE:
            return ModuleRules("break")
        forced: dict[str, str] = {}
        entries = [e.strip() for e in raw.split(",") if e.strip()]
        if not entries:
            raise _fail(env, raw, self.expected())
        for entry in entries:
            if entry.lower() == "auto":
                continue
            action = "break" if entry[0] == "-" else "trace"
            prefix = entry[1:].strip() if entry[0] in "+-" else entry
            if prefix != "*" and not all(part.isidentifier() for part in prefix.split(".")):
                raise KnobError(f"{env}={raw!r}: not a module prefix {entry!r}; expected {self.expected()}")
            if forced.get(prefix, action) != action:
                raise KnobError(f"{env}={raw!r}: {prefix!r} is both '+' and '-'; expected {self.expected()}")
            forced[prefix] = action
        return ModuleRules("check", tuple(forced.items()))

    def expected(self) -> str:
        return (
            "'auto', or a comma list of module prefixes (a.b) or '*', each +prefix (always traced), -prefix "
            f"(never) or bare (as +), with 'auto' allowed among them; off: {_spellings(FALSE)}"
        )


KnobType = Union[Bool, Int, Float, Str, Choice, Names, Prefixes]  # PrefixRules is a Prefixes


@dataclass(frozen=True)
class _Knob:
    env: str
    default: str
    doc: str
    type: KnobType

    def raw(self) -> str:
        return os.environ.get(self.env, self.default)

    def value(self) -> Any:
        return self.type.parse(self.env, self.raw())


NATIVE_PATHS = ("views", "constants", "typed", "gemm", "arena", "release")
LOG_NAMES = ("misses", "guards", "graphs", "lowering")  # the loggers of trident/logs.py
_DEVICE_MODE = Choice(("cuda", "all"), on="cuda", off="")

_KNOBS = {
    "dump_dir": _Knob("TRIDENT_DUMP_DIR", "", "write every generated artifact (SCM IR, MLIR) here", Str()),
    "repro_dir": _Knob("TRIDENT_REPRO_DIR", "", "where a failed MLIR pipeline saves its input", Str()),
    "cache_dir": _Knob(
        "TRIDENT_CACHE_DIR", "", "persistent plan cache (Note [Persistent plans]); '' (default): off", Str()
    ),
    "tuning_dir": _Knob(
        "TRIDENT_TUNING_DIR",
        "~/.cache/trident/tuning",
        "where measured implementation choices (decode matmuls and their groups, decode attention) are "
        "kept when TRIDENT_CACHE_DIR is not set (Note [Kept measurements]; the default is "
        "$XDG_CACHE_HOME/trident/tuning where XDG_CACHE_HOME is set); '' : measured again by every process",
        Str(),
    ),
    "mlir_opt_level": _Knob(
        "TRIDENT_MLIR_OPT_LEVEL",
        "0",
        "ExecutionEngine (LLVM) optimization level of host programs; 0 is chosen for build time: a 24-layer "
        "decode specialization builds in ~0.6 s of LLVM instead of ~15 s at 2, and the host program's own "
        "instructions are a small part of a call (tools/bench_miss.py)",
        Int(0, 3),
    ),
    "native_paths": _Knob(
        "TRIDENT_NATIVE_PATHS",
        ",".join(NATIVE_PATHS),
        "native operator paths to use (A/B: set to '' for none)",
        Names(NATIVE_PATHS),
    ),
    "compile_cubin_on_cpu": _Knob(
        "TRIDENT_COMPILE_CUBIN_ON_CPU", "1", "compile real cubins for CPU specializations too", Bool()
    ),
    "decode_attention": _Knob(
        "TRIDENT_DECODE_ATTENTION",
        "measured",
        "attention of a few query tokens over a key/value cache (HF's repeat_kv + SDPA) becomes Trident's "
        "flash-decoding Triton kernel reading the grouped heads in place (Note [Decode attention]): 'cuda', "
        "'all', 'measured' (the default: CUDA, and with a static key length only where it is measured no slower than the "
        "traced repeat + SDPA, Note [Decode attention by measurement]), '' (off)",
        Choice(("cuda", "all", "measured"), on="cuda", off=""),
    ),
    "prefill_attention": _Knob(
        "TRIDENT_PREFILL_ATTENTION",
        "cuda",
        "in a capture of a symbolic query length (prompts of any length), cuDNN's attention becomes the "
        "memory-efficient SDPA op, which plans nothing per new length (Note [Prefill attention without per-length "
        "plans]): 'cuda' (the default), 'all' (any device; but its check runs both ops on CUDA only, so elsewhere "
        "nothing changes unless a test installs a check), '' (off: cuDNN plans each new prompt length, ~40 ms on "
        "an H100)",
        _DEVICE_MODE,
    ),
    "cache_attention": _Knob(
        "TRIDENT_CACHE_ATTENTION",
        "1",
        "a StaticCache's row write is done by Trident's decode attention kernel that reads the cache right after "
        "(Note [The cache write inside the attention]): a launch fewer per layer; off keeps the write's own launch",
        Bool(),
    ),
    "triton_copies": _Knob(
        "TRIDENT_TRITON_COPIES",
        "cuda",
        "lower clone, copy_, index_copy(_), index_put(_), slice/select_scatter to Trident's Triton kernels: "
        "'cuda' (CUDA tensors; also any on spelling), 'all', '' (off; also any off spelling)",
        _DEVICE_MODE,
    ),
    "gemm_epilogues": _Knob(
        "TRIDENT_GEMM_EPILOGUES",
        "cuda",
        "residual adds into the matrix product (Note [Residual adds in the GEMM]): 'cuda' (bf16/fp16 CUDA tensors; "
        "also any on spelling), 'all' (also other dtypes and devices: tests), '' (off: eager's two roundings)",
        _DEVICE_MODE,
    ),
    "decode_matmuls": _Knob(
        "TRIDENT_DECODE_MATMULS",
        "cuda",
        "matrix products of at most 16 rows (mm, addmm, residual_mm) run as Trident's Triton GEMV where it is measured "
        "faster than the operator, per shape (Note [Decode matmuls by measurement]): 'cuda' (the default; also any on "
        "spelling), 'all' (also CPU tensors, with a test timer), '' (off)",
        _DEVICE_MODE,
    ),
    "fuse_glue": _Knob(
        "TRIDENT_FUSE_GLUE",
        "cuda",
        "groups of ATen glue between launches (elementwise ops, reductions, casts, views) become Triton kernels "
        "generated by Inductor, launched natively like user kernels (Note [Fused glue]), in static captures: 'cuda' "
        "(the default; also any on spelling), 'all' (also CPU tensors, through Triton's interpreter: tests), '' (off)",
        _DEVICE_MODE,
    ),
    "pdl": _Knob(
        "TRIDENT_PDL",
        "cuda",
        "programmatic dependent launch (Note [Programmatic dependent launch]): Trident's own kernels wait for their "
        "predecessor with griddepcontrol.wait and release their dependents early, user kernels and Inductor's glue "
        "run as twins that wait first (TRIDENT_PDL_USER_KERNELS), and a launch whose kernel provably waits before "
        "touching global memory may start before the kernel before it ends: 'cuda' (the default: sm_90+ CUDA devices "
        "with CUDA 12.3+; also any on spelling), 'all' (also CPU tensors, where the waits are no-ops of Triton's "
        "interpreter: tests), '' (off). Measured on an H100 (results/bench_hf_{llama,qwen2}_liger_75f55ad.json, "
        "results/bench_hf_plain_d4246ab.json): Llama-1B + Liger 1.311 -> 1.237 ms/token, Qwen2-0.5B + Liger 1.026 -> "
        "0.904, plain Llama 1.383 -> 1.306, plain Qwen2 1.115 -> 1.020",
        _DEVICE_MODE,
    ),
    "pdl_user_kernels": _Knob(
        "TRIDENT_PDL_USER_KERNELS",
        "1",
        "with TRIDENT_PDL on, a user's Triton kernel (and an Inductor glue kernel) holding no grid dependency "
        "instruction is launched as its twin: compiled once more by Triton with launch_pdl=True and "
        "griddepcontrol.wait and launch_dependents first (Note [A user kernel made to wait]), so every boundary "
        "around it is programmatic; off: it keeps ordinary ordering",
        Bool(),
    ),
    "graphs": _Knob(
        "TRIDENT_GRAPHS",
        "cuda",
        "graph replay (Note [Graph replay]): 'cuda' (also any on spelling), 'all' (also CPU regions, emulated: "
        "tests), '' (off)",
        _DEVICE_MODE,
    ),
    "graph_limit": _Knob(
        "TRIDENT_GRAPH_LIMIT",
        "4",
        "live graphs per region at most (0..16); past it the least recently used goes (Note [Graph bound])",
        Int(0, 16),
    ),
    "graph_bytes": _Knob(
        "TRIDENT_GRAPH_BYTES",
        str(4 << 30),
        "bytes the live graphs of a region may hold together (private pools, staging buffers); past it the least "
        "recently used go (Note [Graph bound]; 0: no byte bound)",
        Int(0),
    ),
    "graph_lend": _Knob(
        "TRIDENT_GRAPH_LEND",
        "1",
        "replays lend outputs that only later regions of the same call read, instead of copying them out "
        "(Note [Lent outputs]); off: every output is copied out",
        Bool(),
    ),
    "graph_stage_written_bytes": _Knob(
        "TRIDENT_GRAPH_STAGE_WRITTEN_BYTES",
        str(16 << 20),
        "stage a moving input the region writes (copied in before a replay, back after it) when it spans at most this "
        "many bytes; larger ones (KV caches) stay pinned (Note [Staging written inputs]; 0: never)",
        Int(0),
    ),
    "captures": _Knob(
        "TRIDENT_CAPTURES",
        "32",
        "captures one front-door callable keeps (a trident.compile'd function, each graph torch.compile hands the "
        "trident backend); past it a call of a new signature runs eagerly, said once as a warning and in explain() "
        "(Note [One capture cache]); 0: every call eager",
        Int(0),
    ),
    "dynamo_symbolic": _Knob(
        "TRIDENT_DYNAMO_SYMBOLIC",
        "1",
        "torch.compile(backend='trident'): a Dynamo graph with symbolic sizes gets one symbolic capture (Note "
        "[Dynamic Dynamo graphs]); off: static captures per input signature",
        Bool(),
    ),
    "dynamo_trace_disabled": _Knob(
        "TRIDENT_DYNAMO_TRACE_DISABLED",
        "auto",
        "torch.compile(backend='trident'): which torch.compiler.disable()d functions of modules outside torch and "
        "Trident stay in the graph for Trident to trace instead of a graph break (Note [Disabled functions under "
        "backend=\"trident\"]): 'auto' (default) keeps those whose run at compile time changes no Python state they "
        "can reach; '+prefix' always keeps a module's (the user vouches for it), '-prefix' never does, a bare prefix "
        "is '+' (so 'liger_kernel' and '*' keep their meaning for those modules; the rest get the check: add '-*' "
        "for the old 'only these'); off ('', 0, none, ...): never, graph breaks as plain Dynamo",
        PrefixRules(),
    ),
    "progress": _Knob(
        "TRIDENT_PROGRESS",
        "auto",
        "a tqdm progress bar while a miss compiles kernels: 'auto' (on a terminal, 8 kernels or more), "
        "'always' (also any on spelling), 'never' (also any off spelling)",
        Choice(("auto", "always", "never"), on="always", off="never"),
    ),
    "graph_min_saving_us": _Knob(
        "TRIDENT_GRAPH_MIN_SAVING_US",
        "0",
        "record a graph only when a replay is estimated to save more host µs than this (Note [When a graph pays "
        "off]; '-inf': always)",
        Float(),
    ),
    "log": _Knob(
        "TRIDENT_LOG",
        "",
        "loggers turned on at DEBUG on stderr (trident/logs.py): a comma list of "
        f"{', '.join(LOG_NAMES)}, or all; '' (default): none",
        Names(LOG_NAMES, everything="all"),
    ),
}


def settings_markdown() -> str:
    """docs/settings.md: every TRIDENT_* setting, its default, what it does and what it accepts
    (`python tools/settings_doc.py` writes it; tests/test_knobs.py checks the file)."""
    lines = [
        "# Settings",
        "",
        "Every `TRIDENT_*` environment variable Trident reads, generated from `trident/knobs.py`",
        "(`python tools/settings_doc.py`; a test checks this page against it). Each is read",
        "when it is used, so `trident.knobs.scope(name=value)` changes one for a block of code. A value",
        "that does not parse raises `trident.KnobError` naming the variable, the value and what is",
        "expected; on/off settings accept " + Bool().expected() + ".",
        "",
        "| variable | default | what it does | accepts |",
        "|---|---|---|---|",
    ]
    for knob in sorted(_KNOBS.values(), key=lambda k: k.env):
        cells = [f"`{knob.env}`", f"`{knob.default}`" if knob.default else "''", knob.doc, knob.type.expected()]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def get(name: str) -> str:
    """A knob's raw value by name (its environment variable, else its default): what plan keys
    record (trident/runtime/persistent.py)."""
    return _KNOBS[name].raw()


def value(name: str) -> Any:
    """A knob's parsed value by name; KnobError if its variable does not parse."""
    return _KNOBS[name].value()


def parse(name: str, raw: str) -> Any:
    """`raw` parsed as knob `name` would parse it (logs.configure's explicit value)."""
    knob = _KNOBS[name]
    return knob.type.parse(knob.env, raw)


def cache_dir() -> str:
    return _KNOBS["cache_dir"].value()


def tuning_dir() -> str:
    """TRIDENT_TUNING_DIR with `~` expanded, the default under XDG_CACHE_HOME where that is set;
    '' when off, or when `~` names no home (no HOME, no passwd entry: never a folder named `~`
    in the working directory)."""
    knob = _KNOBS["tuning_dir"]
    folder = knob.value()
    if folder == knob.default and os.environ.get("XDG_CACHE_HOME"):
        return os.path.join(os.environ["XDG_CACHE_HOME"], "trident", "tuning")
    folder = os.path.expanduser(folder) if folder else ""
    return "" if folder.startswith("~") else folder


def dump_dir() -> str:
    return _KNOBS["dump_dir"].value()


def repro_dir() -> str:
    return _KNOBS["repro_dir"].value()


def mlir_opt_level() -> int:
    return _KNOBS["mlir_opt_level"].value()


def native_path(name: str) -> bool:
    """Whether the native operator path `name` (views, constants, typed, gemm, arena, release) is enabled."""
    if name not in NATIVE_PATHS:
        raise KeyError(f"no native path {name!r}; known: {', '.join(NATIVE_PATHS)}")
    return name in _KNOBS["native_paths"].value()


def compile_cubin_on_cpu() -> bool:
    return _KNOBS["compile_cubin_on_cpu"].value()


def triton_copies() -> str:
    """Which copies lower_copies rewrites to Triton launches: "cuda", "all" or "" (none)."""
    return _KNOBS["triton_copies"].value()


def pdl_user_kernels() -> bool:
    """Whether, with TRIDENT_PDL on, user kernels are launched as their waiting twins (Note [A user
    kernel made to wait])."""
    return _KNOBS["pdl_user_kernels"].value()


def cache_attention() -> bool:
    """Whether fuse_cache_attention gives a StaticCache write to the decode attention after it."""
    return _KNOBS["cache_attention"].value()


def decode_attention() -> str:
    """Where decode attention becomes Trident's kernel (Note [Decode attention]): "measured" (the
    default: on CUDA, where measured no slower with a static key length), "cuda", "all", ""."""
    return _KNOBS["decode_attention"].value()


def prefill_attention() -> str:
    """Where a symbolic-length cuDNN attention becomes the memory-efficient op (Note [Prefill
    attention without per-length plans]): "cuda" (the default), "all", ""."""
    return _KNOBS["prefill_attention"].value()


def gemm_epilogues() -> str:
    """Where fuse_residual_adds folds `x + a @ b` into one addmm: "cuda", "all" or "" (nowhere)."""
    return _KNOBS["gemm_epilogues"].value()


def decode_matmuls() -> str:
    """Where choose_matmuls measures decode products against Trident's GEMV: "cuda", "all", ""."""
    return _KNOBS["decode_matmuls"].value()


def fuse_glue() -> str:
    """Where fuse_glue hands ATen glue to Inductor (Note [Fused glue]): "cuda", "all" or "" (off)."""
    return _KNOBS["fuse_glue"].value()


def pdl() -> str:
    """Where launches use programmatic dependent launch (Note [Programmatic dependent launch]):
    "cuda", "all" or "" (off)."""
    return _KNOBS["pdl"].value()


def graphs() -> str:
    """Graph replay mode (Note [Graph replay]): "cuda", "all" (CPU regions emulated) or "" (off)."""
    return _KNOBS["graphs"].value()


def graph_min_saving_us() -> float:
    return _KNOBS["graph_min_saving_us"].value()


def graph_bytes() -> int:
    return _KNOBS["graph_bytes"].value()


def graph_limit() -> int:
    return _KNOBS["graph_limit"].value()


def captures() -> int:
    """Captures per front-door callable (Note [One capture cache])."""
    return _KNOBS["captures"].value()


def dynamo_symbolic() -> bool:
    return _KNOBS["dynamo_symbolic"].value()


def dynamo_trace_disabled() -> ModuleRules:
    """TRIDENT_DYNAMO_TRACE_DISABLED: `.action(module)` is "trace", "check" or "break" for a
    torch.compiler.disable()d function defined in `module`."""
    return _KNOBS["dynamo_trace_disabled"].value()


def graph_lend() -> bool:
    return _KNOBS["graph_lend"].value()


def graph_stage_written_bytes() -> int:
    return _KNOBS["graph_stage_written_bytes"].value()


def progress() -> str:
    """TRIDENT_PROGRESS: "auto", "always" or "never"."""
    return _KNOBS["progress"].value()


def log() -> tuple[str, ...]:
    """The loggers TRIDENT_LOG turns on ('all' expanded), in LOG_NAMES order."""
    return _KNOBS["log"].value()


def _to_env(value: Any) -> str:
    """A Python value as its variable's text: booleans as 1/0, sequences as comma lists, so
    `scope(graph_limit=1, compile_cubin_on_cpu=False, native_paths=("views",))` works."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


@contextlib.contextmanager
def scope(**values: Any) -> Iterator[None]:
    """Temporarily set knobs by name, e.g. `with knobs.scope(dump_dir="/tmp/x"): ...`; None
    unsets a knob's variable (its default applies). Values are not checked here, so a test can
    set a bad one and see the knob's reader refuse it. The variables are the process's: scopes
    entered and left by several threads at once restore each other's values (enter one around
    the threads instead)."""
    saved = {}
    try:
        for name, new in values.items():
            env = _KNOBS[name].env
            saved[env] = os.environ.get(env)
            if new is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = _to_env(new)
        yield
    finally:
        for env, old in saved.items():
            if old is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = old
