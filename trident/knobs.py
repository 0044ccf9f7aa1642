"""Every TRIDENT_* environment setting, typed, in one place.

Read at use (not at import) so tests can change them with `knobs.scope(...)`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class _Knob:
    env: str
    default: str
    doc: str

    def get(self) -> str:
        return os.environ.get(self.env, self.default)


_KNOBS = {
    "dump_dir": _Knob("TRIDENT_DUMP_DIR", "", "write every generated artifact (SCM IR, MLIR) here"),
    "repro_dir": _Knob("TRIDENT_REPRO_DIR", "", "where a failed MLIR pipeline saves its input"),
    "cache_dir": _Knob(
        "TRIDENT_CACHE_DIR", "", "persistent plan cache (Note [Persistent plans]); '' (default): off"
    ),
    "mlir_opt_level": _Knob(
        "TRIDENT_MLIR_OPT_LEVEL",
        "0",
        "ExecutionEngine (LLVM) optimization level of host programs; 0 is chosen for build time: a 24-layer "
        "decode specialization builds in ~0.6 s of LLVM instead of ~15 s at 2, and the host program's own "
        "instructions are a small part of a call (tools/bench_miss.py)",
    ),
    "native_paths": _Knob(
        "TRIDENT_NATIVE_PATHS", "views,constants,typed,gemm,arena,release", "native operator paths to use (A/B: set to '')"
    ),
    "compile_cubin_on_cpu": _Knob(
        "TRIDENT_COMPILE_CUBIN_ON_CPU", "1", "compile real cubins for CPU specializations too"
    ),
    "triton_copies": _Knob(
        "TRIDENT_TRITON_COPIES",
        "cuda",
        "lower clone, copy_, index_copy(_), index_put(_), slice/select_scatter to Trident's Triton kernels: 'cuda' (CUDA tensors), 'all', '' (off)",
    ),
    "gemm_epilogues": _Knob(
        "TRIDENT_GEMM_EPILOGUES",
        "cuda",
        "residual adds into the matrix product (Note [Residual adds in the GEMM]): 'cuda' (bf16/fp16 CUDA tensors), "
        "'all' (also other dtypes and devices: tests), '' (off: eager's two roundings)",
    ),
    "graphs": _Knob(
        "TRIDENT_GRAPHS",
        "cuda",
        "graph replay (Note [Graph replay]): 'cuda', 'all' (also CPU regions, emulated: tests), '' (off)",
    ),
    "graph_limit": _Knob("TRIDENT_GRAPH_LIMIT", "4", "live graphs per region at most (0..16); past it the least "
                         "recently used goes (Note [Graph bound])"),
    "graph_bytes": _Knob("TRIDENT_GRAPH_BYTES", str(4 << 30), "bytes the live graphs of a region may hold together "
                         "(private pools, staging buffers); past it the least recently used go (Note [Graph bound]; "
                         "0: no byte bound)"),
    "graph_stage_written_bytes": _Knob(
        "TRIDENT_GRAPH_STAGE_WRITTEN_BYTES",
        str(16 << 20),
        "stage a moving input the region writes (copied in before a replay, back after it) when it spans at most this "
        "many bytes; larger ones (KV caches) stay pinned (Note [Staging written inputs]; 0: never)",
    ),
    "dynamo_captures": _Knob(
        "TRIDENT_DYNAMO_CAPTURES",
        "8",
        "torch.compile(backend='trident'): static captures per Dynamo graph (one per input signature) before calls "
        "run the graph eagerly (Note [Dynamo graphs and static capture])",
    ),
    "dynamo_symbolic": _Knob(
        "TRIDENT_DYNAMO_SYMBOLIC",
        "1",
        "torch.compile(backend='trident'): a Dynamo graph with symbolic sizes gets one symbolic capture (Note "
        "[Dynamic Dynamo graphs]); 0: static captures per input signature",
    ),
    "dynamo_trace_disabled": _Knob(
        "TRIDENT_DYNAMO_TRACE_DISABLED",
        "liger_kernel",
        "torch.compile(backend='trident'): modules (comma list of prefixes; '*': any outside torch; '': none) whose "
        "torch.compiler.disable()d functions stay in the graph for Trident to trace instead of a graph break "
        "(Note [Disabled functions under backend=\"trident\"])",
    ),
    "compile_captures": _Knob(
        "TRIDENT_COMPILE_CAPTURES", "8", "trident.compile: captures kept per function, the oldest dropped first"
    ),
    "progress": _Knob(
        "TRIDENT_PROGRESS",
        "auto",
        "a tqdm progress bar while a miss compiles kernels: 'auto' (on a terminal, 8 kernels or more), '1' (always), '0'",
    ),
    "graph_min_saving_us": _Knob(
        "TRIDENT_GRAPH_MIN_SAVING_US",
        "0",
        "record a graph only when a replay is estimated to save more host µs than this (Note [When a graph pays off]; '-inf': always)",
    ),
}


def get(name: str) -> str:
    """A knob's raw value by name (its environment variable, else its default)."""
    return _KNOBS[name].get()


def cache_dir() -> str:
    return _KNOBS["cache_dir"].get()


def dump_dir() -> str:
    return _KNOBS["dump_dir"].get()


def repro_dir() -> str:
    return _KNOBS["repro_dir"].get()


def mlir_opt_level() -> int:
    return int(_KNOBS["mlir_opt_level"].get())


def native_path(name: str) -> bool:
    """Whether the native operator path `name` (views, constants, typed, gemm, arena, release) is enabled."""
    return name in {p.strip() for p in _KNOBS["native_paths"].get().split(",")}


def compile_cubin_on_cpu() -> bool:
    return _KNOBS["compile_cubin_on_cpu"].get() not in ("0", "false", "False", "")


def _device_mode(name: str) -> str:
    """A knob naming where a feature applies: "cuda", "all" or "" (off, also 0/off/none/false)."""
    knob = _KNOBS[name]
    value = knob.get().strip().lower()
    if value in ("", "0", "off", "none", "false"):
        return ""
    if value not in ("cuda", "all"):
        raise ValueError(f"{knob.env}={value!r}: expected 'cuda', 'all' or '' (off)")
    return value


def triton_copies() -> str:
    """Which copies lower_copies rewrites to Triton launches: "cuda", "all" or "" (none)."""
    return _device_mode("triton_copies")


def gemm_epilogues() -> str:
    """Where fuse_residual_adds folds `x + a @ b` into one addmm: "cuda", "all" or "" (nowhere)."""
    return _device_mode("gemm_epilogues")


def graphs() -> str:
    """Graph replay mode (Note [Graph replay]): "cuda", "all" (CPU regions emulated) or "" (off)."""
    return _device_mode("graphs")


def graph_min_saving_us() -> float:
    raw = _KNOBS["graph_min_saving_us"].get()
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"TRIDENT_GRAPH_MIN_SAVING_US={raw!r}: expected a number of microseconds (or -inf)") from None


def graph_bytes() -> int:
    raw = _KNOBS["graph_bytes"].get()
    if not raw.isdigit():
        raise ValueError(f"TRIDENT_GRAPH_BYTES={raw!r}: expected a number of bytes >= 0")
    return int(raw)


def graph_limit() -> int:
    value = int(_KNOBS["graph_limit"].get())
    if not 0 <= value <= 16:
        raise ValueError(f"TRIDENT_GRAPH_LIMIT={value}: expected 0..16")
    return value


def dynamo_captures() -> int:
    raw = _KNOBS["dynamo_captures"].get()
    if not raw.isdigit():
        raise ValueError(f"TRIDENT_DYNAMO_CAPTURES={raw!r}: expected a count >= 0")
    return int(raw)


def dynamo_symbolic() -> bool:
    raw = _KNOBS["dynamo_symbolic"].get()
    if raw not in ("0", "1"):
        raise ValueError(f"TRIDENT_DYNAMO_SYMBOLIC={raw!r}: expected 0 or 1")
    return raw == "1"


def dynamo_trace_disabled() -> tuple[str, ...]:
    raw = _KNOBS["dynamo_trace_disabled"].get().strip()
    if raw.lower() in ("0", "false", "off", "none", ""):
        return ()
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def compile_captures() -> int:
    raw = _KNOBS["compile_captures"].get()
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"TRIDENT_COMPILE_CAPTURES={raw!r}: expected a count >= 1")
    return int(raw)


def graph_stage_written_bytes() -> int:
    raw = _KNOBS["graph_stage_written_bytes"].get()
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"TRIDENT_GRAPH_STAGE_WRITTEN_BYTES={raw!r}: expected a number of bytes >= 0")
    return value


def progress() -> str:
    """"auto", "always" or "never" (TRIDENT_PROGRESS)."""
    raw = _KNOBS["progress"].get().strip().lower()
    if raw in ("auto", ""):
        return "auto"
    if raw in ("1", "on", "true", "always"):
        return "always"
    if raw in ("0", "off", "false", "never"):
        return "never"
    raise ValueError(f"TRIDENT_PROGRESS={raw!r}: expected 'auto', '1' (always) or '0' (never)")


@contextlib.contextmanager
def scope(**values: str):
    """Temporarily set knobs by name, e.g. `with knobs.scope(dump_dir="/tmp/x"): ...`."""
    saved = {}
    try:
        for name, value in values.items():
            env = _KNOBS[name].env
            saved[env] = os.environ.get(env)
            os.environ[env] = str(value)
        yield
    finally:
        for env, old in saved.items():
            if old is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = old
