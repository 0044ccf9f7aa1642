"""Run a compiled kernel's launch on the CPU through Triton's interpreter.

The native runtime hands over exactly what cuLaunchKernel would get: the grid and the packed
parameter values (pointers as addresses, scalars decoded from their slots). Triton's own
GridExecutor wants torch tensors; here pointers are raw host addresses, so this mirrors its loop
with raw-pointer arguments. Constexprs are passed the way GridExecutor passes them: declared
`tl.constexpr` parameters as their bare values, parameters the specializer folded (None, the
integer 1) through the interpreter's own implicit conversion.

Triton's interpreter is process-global state (Note [Triton's interpreter state] in
trident/triton_state.py): every interpreted launch holds `triton_state.exclusive()`, so no other
launch and no compilation of Trident's sees the patched `triton.language`.

The same executor serves users' own `kernel[grid](...)` calls on CPU tensors once Trident's
host-only driver is active (`InterpretingLauncher`: the driver's launcher_cls), so eager Triton
keeps working on a machine without a GPU after `import trident`.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import re
import sys
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import triton.language as tl
from triton.runtime import interpreter as interp
from triton.runtime.jit import JITFunction

from .. import triton_state


def _arg(ty: str, value: Any):
    tl_ty = tl.str_to_ty(ty, None)
    if ty.startswith("*"):
        handle = interp.TensorHandle(np.array([value], dtype=np.uint64), tl_ty)
        return tl.tensor(handle, tl_ty)
    np_dtype = {
        "i1": np.bool_, "u1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
        "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
        "fp16": np.float16, "bf16": np.float32, "fp32": np.float32, "fp64": np.float64,
    }[ty]
    handle = interp.TensorHandle(np.array([value], dtype=np_dtype), tl_ty)
    return tl.tensor(handle, tl_ty)


_interpreted: dict = {}  # id(JITFunction) -> (it, its InterpretedFunction)

_tl_cast = interp.InterpreterBuilder.cast_impl


def _cast_impl(self, src, dst_type):
    """InterpreterBuilder.cast_impl, right for bfloat16 to and from types other than float32.
    Triton 3.6's interpreter stores bfloat16 as uint16 and converts it correctly only from/to
    float32; any other cast reinterprets the numbers (float64 -> bfloat16 gave NaNs and
    denormals). Such casts go through float32 here, as the compiled kernel's do in effect
    (tests/runtime/test_hostile_inputs.py found it)."""
    s, d = src.dtype.scalar, dst_type.scalar
    if d == tl.bfloat16 and s not in (tl.float32, tl.bfloat16):
        return _tl_cast(self, interp.TensorHandle(src.data.astype(np.float32), tl.float32), dst_type)
    if s == tl.bfloat16 and d not in (tl.float32, tl.bfloat16):
        wide = _tl_cast(self, src, tl.float32)
        return _tl_cast(self, interp.TensorHandle(wide.data, tl.float32), dst_type)
    return _tl_cast(self, src, dst_type)


def _is_libdevice(module_name: str) -> bool:
    return module_name.startswith("triton.language.extra") and module_name.endswith("libdevice")


def _numpy_twin(name: str, np_fn):
    def twin(*args, **kwargs):
        kwargs.pop("_semantic", None)
        first = next((a for a in args if isinstance(a, tl.tensor)), None)
        if first is None or first.dtype not in (tl.float16, tl.float32, tl.float64):
            got = "no tensor" if first is None else str(first.dtype)
            raise NotImplementedError(
                f"libdevice.{name} under Trident's CPU interpreter takes fp16/fp32/fp64 tensors; got {got}: "
                "cast the argument to tl.float32 first (as compiled kernels usually do), or run on the GPU"
            )
        datas = [a.handle.data if isinstance(a, tl.tensor) else np.asarray(getattr(a, "value", a)) for a in args]
        out = np.asarray(np_fn(*datas)).astype(first.handle.data.dtype)
        block = any(isinstance(a, tl.tensor) and a.type.is_block() for a in args)
        ty = tl.block_type(first.dtype, list(out.shape)) if block else first.dtype
        return tl.tensor(interp.TensorHandle(out, first.dtype.scalar), ty)

    return twin


def _math_twin(name: str):
    def twin(*args, **kwargs):  # tl.math's function, patched for the interpreter at call time
        kwargs.pop("_semantic", None)
        return getattr(tl.math, name)(*args, **kwargs)

    return twin


def _missing_twin(name: str):
    def twin(*args, **kwargs):
        raise NotImplementedError(
            f"libdevice.{name} has no twin under Trident's CPU interpreter (Triton's interpreter cannot call "
            "libdevice); run this kernel on the GPU, or use a triton.language function instead"
        )

    return twin


# Note [libdevice under the interpreter]: Triton's interpreter cannot call libdevice (its
# functions are stubs the compiler dispatches; interpreted, `rsqrt(x)` returns None), yet
# third-party kernels import them (Liger-Kernel's RMSNorm: `from triton.language.extra.libdevice
# import rsqrt`). While interpreting, libdevice names -- module attributes and names a kernel's
# module imported -- are replaced by twins: tl.math's own function where it has one, numpy
# otherwise, an error naming the function for the rest.
_LIBDEVICE_TWINS: dict[str, Callable] = {
    **{n: _math_twin(n) for n in ("abs", "ceil", "cos", "erf", "exp", "exp2", "floor", "fma", "log", "log2",
                                   "rsqrt", "sin", "sqrt", "sqrt_rn", "div_rn")},
    **{n: _numpy_twin(n, f) for n, f in {
        "tanh": np.tanh, "sinh": np.sinh, "cosh": np.cosh, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
        "atan": np.arctan, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "log1p": np.log1p,
        "expm1": np.expm1, "log10": np.log10, "exp10": lambda x: np.power(10.0, x), "trunc": np.trunc,
        "round": np.round, "rint": np.rint, "nearbyint": np.rint, "cbrt": np.cbrt, "pow": np.power,
        "atan2": np.arctan2, "fmod": np.fmod, "hypot": np.hypot, "isnan": np.isnan, "isinf": np.isinf,
        "signbit": np.signbit, "copysign": np.copysign,
    }.items()},
}


def _twin(name: str) -> Callable:
    """The twin of libdevice function `name` (made once: a launch patches ~450 names)."""
    twin = _LIBDEVICE_TWINS.get(name)
    if twin is None:
        twin = _LIBDEVICE_TWINS[name] = _missing_twin(name)
    return twin


_libdevice_seen: list = [0, []]  # len(sys.modules) when last scanned, the libdevice modules then


def _libdevice_modules() -> list:
    """The imported libdevice modules; sys.modules is scanned again only when it has grown (not
    on every interpreted launch)."""
    if len(sys.modules) != _libdevice_seen[0]:
        _libdevice_seen[1] = [m for n, m in list(sys.modules.items()) if m is not None and _is_libdevice(n)]
        _libdevice_seen[0] = len(sys.modules)
    return _libdevice_seen[1]


_libdevice_names: dict = {}  # id(libdevice module) -> (its attributes' count, its functions' names)
_libdevice_globals: dict = {}  # id(a kernel module's globals) -> (their count, the libdevice functions' names)


def _libdevice_functions(module) -> list:
    """The names of a libdevice module's functions (~500: scanned again only when the module's
    attributes change in number, not on every interpreted launch; the patches this file makes
    replace values, and are undone before the next launch)."""
    attrs = vars(module)
    known = _libdevice_names.get(id(module))
    if known is None or known[0] != len(attrs):
        names = [name for name, value in list(attrs.items()) if not name.startswith("_") and _is_libdevice_function(value)]
        known = _libdevice_names[id(module)] = (len(attrs), names)
    return known[1]


def _patch_libdevice(fn, scope, replaced: list) -> None:
    """Twins for libdevice in `fn`'s module (Note [libdevice under the interpreter]); the globals
    to restore are appended to `replaced` as they change (module attributes go through `scope`)."""
    for module in _libdevice_modules():
        for name in _libdevice_functions(module):
            scope.set_attr(module, name, _twin(name))
    g = fn.__globals__
    known = _libdevice_globals.get(id(g))
    if known is None or known[0] != len(g) or any(not _is_libdevice_function(g.get(n)) for n in known[1]):
        known = _libdevice_globals[id(g)] = (len(g), [n for n, v in list(g.items()) if _is_libdevice_function(v)])
    for name in known[1]:
        value = g[name]
        replaced.append((name, value))
        g[name] = _twin(value.__name__)


def _is_libdevice_function(value) -> bool:
    return callable(value) and _is_libdevice(getattr(value, "__module__", "") or "")


# Note [Interrupted patches]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# An interpreted launch patches triton.language (160 attributes) and the kernel's globals for
# its duration. A Ctrl-C (KeyboardInterrupt) can arrive anywhere: while patching, while running,
# or while restoring. Were any patch left in place, every later Triton compile in the process
# would fail, eager Triton's included. So every change is recorded before the next one is made
# (the scope is ours, created before any patch: `_patch_lang_into`), the patching sits inside the
# try, and the restore runs to its end whatever arrives meanwhile: an interrupt during it is held
# and raised once everything is back (`_restore`).
def _patch_lang_into(fn, scope) -> None:
    """What Triton 3.6's `interpreter._patch_lang` does, into a scope the caller already holds."""
    langs = [value for _, value in fn.__globals__.items() if inspect.ismodule(value) and value in (tl, tl.core)]
    assert langs, "triton.language must be visible from within jit'd function"
    for lang in langs:
        interp._patch_builtin(lang, interp.interpreter_builder, scope)
        interp._patch_builtin(lang.tensor, interp.interpreter_builder, scope)
        if lang == tl:
            interp._patch_builtin(lang.math, interp.interpreter_builder, scope)
        _patch_lang_tensor(lang.tensor, scope)
        interp._patch_lang_core(lang, scope)
    interp._patch_builtin(tl.core.tensor_descriptor_base, interp.interpreter_builder, scope)
    # tl.extra.cuda.gdc_wait & co.: inline PTX the builder runs as no-ops (`_create_inline_asm`)
    interp._patch_builtin(tl.extra.cuda, interp.interpreter_builder, scope)


_ORIGINAL_PATCH_LANG_TENSOR = interp._patch_lang_tensor


def _patch_lang_tensor(tensor, scope) -> None:
    """Triton 3.6's tensor patches, and a scalar's index that numpy 2.4 accepts: Triton makes a
    scalar argument a 1-element 1-D array and takes int() of it, which numpy 2.4 refuses, so a
    loop bounded by a runtime argument (`for i in range(0, n, BLOCK)`) failed to interpret.
    Installed as interpreter._patch_lang_tensor while interpreting, so that Triton's own
    GridExecutor (which patches again) gets it too."""
    _ORIGINAL_PATCH_LANG_TENSOR(tensor, scope)
    scope.set_attr(tensor, "__index__", _scalar_index)


def _scalar_index(self) -> int:
    return int(self.handle.data.item())


_ORIGINAL_CREATE_INLINE_ASM = interp.InterpreterBuilder.create_inline_asm
_GRID_DEPENDENCY = re.compile(r"\s*griddepcontrol\.(?:wait|launch_dependents)\s*;\s*(?://[^\n]*)?\s*")


class _AsmCall:
    def __init__(self, handle):
        self._handle = handle

    def get_result(self, i: int):
        return self._handle


def _create_inline_asm(self, asm, constraints, values, types, is_pure, pack):
    """Triton's gdc_wait and gdc_launch_dependents (the inline PTX of Note [Programmatic dependent
    launch]) as no-ops while interpreting: interpreted launches run one after another. Other
    inline assembly stays refused, as Triton's interpreter refuses it."""
    if not values and len(types) == 1 and _GRID_DEPENDENCY.fullmatch(asm):
        return _AsmCall(interp.TensorHandle(np.zeros(1, dtype=np.int32), tl.int32))
    return _ORIGINAL_CREATE_INLINE_ASM(self, asm, constraints, values, types, is_pure, pack)


# Note [Loop variables under the interpreter]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Compiled, `for i in range(n)` (or tl.range) is a loop whose variable is an integer tensor: a
# kernel may call its methods, as flash-linear-attention's chunk kernels do (`i_t.to(tl.int64)`
# before multiplying by a stride). Triton 3.6's interpreter runs the loop over a Python range, so
# the variable is a Python int and such a kernel fails ("'int' object has no attribute 'to'").
# While Trident interprets (its regions' launches; on a machine without a GPU, eager launches
# through the host-only driver), the kernel source is rewritten (Triton's own AST rewrite, one
# rule more) so that each such loop's body starts by making its variable a tensor, as the
# interpreter makes every assigned value one: typed by its value as Triton types a constant
# (int32; uint32 or int64 past int32's range), where compiled code types it by the bounds (an
# int64 bound gives int64): the two differ only past 2**31. tl.static_range loops keep Python
# ints: compiled, their variable is a constexpr. Rewritten functions are kept in a table of
# Trident's own (Triton's is per process and keyed by function: one rewritten before without
# the rule, under TRITON_INTERPRET=1, would be reused, and Triton's own interpreting would
# reuse Trident's). Under TRITON_INTERPRET=1 a user's own eager launches run Triton's
# interpreter as before, without the rule.


class _LoopVariablesAsTensors(interp.ASTTransformer):
    """Triton's interpreter rewrite (assignments make tensors) and loop variables as tensors
    (Note [Loop variables under the interpreter])."""

    def visit_For(self, node):
        self.generic_visit(node)
        call = node.iter
        func = call.func if isinstance(call, ast.Call) else None
        runtime_range = (isinstance(func, ast.Name) and func.id == "range") or (
            isinstance(func, ast.Attribute) and func.attr == "range")
        if runtime_range and isinstance(node.target, ast.Name):
            name = node.target.id
            node.body.insert(0, self.visit_Assign(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())],
                                                             value=ast.Name(id=name, ctx=ast.Load()))))
        return node


_LOOP_REWRITE = _LoopVariablesAsTensors()
_REWRITTEN: dict = {}  # function -> rewritten with _LOOP_REWRITE (InterpretedFunction.rewritten_fn while interpreting)


def _restore(fn, scope, replaced: list) -> None:
    """Note [Interrupted patches]: both restores run to their end; an interrupt meanwhile is
    raised after."""
    interrupted = None
    while True:
        try:
            while replaced:
                name, value = replaced.pop()
                fn.__globals__[name] = value
            scope.restore()  # pops each change as it undoes it: a second call resumes
            break
        except KeyboardInterrupt as e:
            interrupted = e
    if interrupted is not None:
        raise interrupted


def _call_interpreted(self, *args, **kwargs):
    """JITFunction.__call__ while interpreting: device functions (tl.sum, user @jit helpers)
    run interpreted too, as they would had TRITON_INTERPRET=1 been set before import."""
    # Keyed by identity: JITFunction.__hash__ computes its cache key, walking the function's
    # dependencies through triton.language -- patched right now, so that walk would fail
    # ("Unsupported function referenced") for a device function never hashed before (tl.sum).
    entry = _interpreted.get(id(self))
    if entry is None or entry[0] is not self:
        entry = _interpreted[id(self)] = (self, interp.InterpretedFunction(self.fn))
    fn = entry[1]
    # InterpretedFunction.__call__ patches triton.language for good (fine under
    # TRITON_INTERPRET=1, where nothing is compiled); here the patch must end with the call,
    # or later compilations in this process would see the interpreter's builtins.
    scope, replaced = interp._LangPatchScope(), []
    try:  # Note [Interrupted patches]
        _patch_lang_into(self.fn, scope)
        _patch_libdevice(self.fn, scope, replaced)
        return fn.rewrite()(*args, **kwargs)
    finally:
        _restore(self.fn, scope, replaced)


@contextlib.contextmanager
def _interpreting(jit_fn):
    """triton.language interpreted for `jit_fn` (device functions too, and right bfloat16
    casts), holding Triton's language state (Note [Triton's interpreter state])."""
    with triton_state.exclusive():
        patch_scope, replaced = interp._LangPatchScope(), []
        try:  # Note [Interrupted patches]
            _patch_lang_into(jit_fn.fn, patch_scope)
            patch_scope.set_attr(interp, "_patch_lang_tensor", _patch_lang_tensor)
            patch_scope.set_attr(JITFunction, "__call__", _call_interpreted)
            patch_scope.set_attr(interp.InterpreterBuilder, "cast_impl", _cast_impl)
            patch_scope.set_attr(interp.InterpreterBuilder, "create_inline_asm", _create_inline_asm)
            patch_scope.set_attr(interp.FunctionRewriter, "ast_transformer", _LOOP_REWRITE)
            patch_scope.set_attr(interp.InterpretedFunction, "rewritten_fn", _REWRITTEN)
            _patch_libdevice(jit_fn.fn, patch_scope, replaced)
            yield
        finally:
            _restore(jit_fn.fn, patch_scope, replaced)


def _run_grid(jit_fn, interpreted, grid: tuple[int, int, int], args: dict) -> None:
    """Runs the kernel once per program id of `grid`, interpreted. (Rewriting it adds names to
    its module's globals, which _patch_lang iterates: inside the lock too.)"""
    with _interpreting(jit_fn):
        run_program = interpreted.rewrite()
        interp.interpreter_builder.set_grid_dim(*grid)
        for x in range(grid[0]):
            for y in range(grid[1]):
                for z in range(grid[2]):
                    interp.interpreter_builder.set_grid_idx(x, y, z)
                    run_program(**args)


_warned_bf16: set = set()


def _warn_bfloat16(jit_fn, param_types: Sequence[str]) -> None:
    """Triton 3.6's interpreter keeps bfloat16 values as their 16-bit patterns and does its
    arithmetic, sums, minima and maxima on those integers (only casts to and from float32 are
    right, and Trident fixes the other casts): a kernel reading or writing bfloat16 gives wrong
    numbers on the CPU (NaNs, garbage) as it does under TRITON_INTERPRET=1. Said once per kernel."""
    name = getattr(jit_fn, "__name__", str(jit_fn))
    if name in _warned_bf16 or not any(t.lstrip("*") == "bf16" for t in param_types):
        return
    _warned_bf16.add(name)
    warnings.warn(
        f"Triton kernel '{name}' takes bfloat16 tensors and runs on the CPU through Triton's interpreter, which "
        "computes bfloat16 arithmetic on the values' bit patterns: its results can be wrong (NaNs, garbage). Use "
        "float32 tensors on the CPU, or run on a CUDA device (see docs/troubleshooting.md).",
        RuntimeWarning,
        stacklevel=2,
    )


def make_cpu_runner(
    jit_fn, param_names: Sequence[str], param_types: Sequence[str], constexprs: dict[str, Any]
) -> Callable[[tuple[int, int, int], list], None]:
    """What the native SCM calls to run `jit_fn` on CPU tensors through Triton's interpreter. Every
    kernel a region registers gets one, on a GPU too (unused there): the bfloat16 warning waits for
    its first run, so a CUDA model never hears of the interpreter."""
    interpreted = interp.InterpretedFunction(jit_fn.fn)
    bf16 = any(t.lstrip("*") == "bf16" for t in param_types)
    declared = {p.name for p in jit_fn.params if p.is_constexpr}
    # a declared constexpr as the bare value, as Triton's GridExecutor passes it (a tl.constexpr
    # wrapper turns `i * BLOCK + tl.arange(0, BLOCK)` into a constexpr holding a tensor, whose
    # `.to(...)` fails: Liger-Kernel's MoE gather kernel)
    const_args = {k: (v if k in declared else interp._implicit_cvt(v)) for k, v in constexprs.items()}

    def run(grid: tuple[int, int, int], values: list) -> None:
        if bf16:
            _warn_bfloat16(jit_fn, param_types)
        args = dict(const_args)
        for name, ty, value in zip(param_names, param_types, values):
            args[name] = _arg(ty, value)
        _run_grid(jit_fn, interpreted, grid, args)

    return run


class InterpretingLauncher:
    """Triton's launcher interface (driver.launcher_cls) for the host-only driver: a compiled
    kernel launched eagerly on CPU tensors runs through Triton's interpreter instead, as it would
    under TRITON_INTERPRET=1 (the sm_90 binary Triton compiled for it is not used)."""

    def __init__(self, src, metadata):
        self.jit_fn = getattr(src, "fn", None)
        if not isinstance(self.jit_fn, JITFunction):
            raise RuntimeError(
                "Trident's host-only Triton driver (no GPU on this machine) runs only @triton.jit kernels, "
                f"through Triton's interpreter; got {type(src).__name__}"
            )

    def __call__(self, gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args):
        jit_fn = self.jit_fn
        names = jit_fn.arg_names
        for name, value in zip(names, args):
            device = getattr(value, "device", None)
            if device is not None and getattr(device, "type", "cpu") != "cpu":
                raise RuntimeError(
                    f"{jit_fn.__name__}: argument {name!r} is on {device}, but this machine has no GPU driver for "
                    "Triton; Trident's host-only driver runs kernels on CPU tensors through Triton's interpreter."
                )
        if enter_hook is not None:
            enter_hook(launch_metadata)
        # Triton's own executor (tensor arguments, constexprs, copies back), inside the patches
        # and the lock it does not know of.
        # A float argument is an fp32 scalar in the compiled kernel (`eps.to(tl.float32)` works
        # there: Liger-Kernel's RMSNorm does it); Triton's executor would pass a bare Python float.
        args = tuple(_arg("fp32", a) if type(a) is float else a for a in args)
        with _interpreting(jit_fn):
            executor = interp.GridExecutor(interp.InterpretedFunction(jit_fn.fn).rewrite(), names, (gx, gy, gz))
            executor(*args)
        if exit_hook is not None:
            exit_hook(launch_metadata)
