"""Stage 3: MLIR's LLVM lowering and native code through torch-mlir's ExecutionEngine.

A failed pipeline writes the module it was given and prints the exact command that reproduces
the failure (`python -m trident.lowering.pipeline FILE`, or torch-mlir-opt with the same
pipeline).
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Optional

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d
from torch_mlir.execution_engine import ExecutionEngine
from torch_mlir.passmanager import PassManager

from .. import knobs
from ..errors import LoweringError
from .scm_to_llvm import HOST_SYMBOL, SELECT_SYMBOL

LLVM_PIPELINE = "builtin.module(convert-to-llvm,reconcile-unrealized-casts)"


@dataclass
class HostBinary:
    engine: ExecutionEngine
    address: int  # of the packed entry point `_mlir_scm_host(void**)`
    select_address: int  # of `_mlir_scm_select(void**)`: guards only
    context: ir.Context
    module: ir.Module


def _save_repro(text: str, name: str) -> str:
    folder = knobs.repro_dir() or tempfile.mkdtemp(prefix="trident-repro-")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.mlir")
    with open(path, "w") as f:
        f.write(text)
    return path


def _failure(stage: str, name: str, text: str, error: Exception) -> LoweringError:
    path = _save_repro(text, name)
    return LoweringError(
        f"{stage} failed for {name}: {error}\n"
        f"input saved to {path}; reproduce with:\n"
        f"  {sys.executable} -m trident.lowering.pipeline {path}\n"
        f"  torch-mlir-opt --pass-pipeline='{LLVM_PIPELINE}' {path}"
    )


def lower_to_llvm(module: ir.Module, name: str, text: Optional[str] = None) -> None:
    """`text`: the module as printed, when the caller has it (printing a large module costs
    more than lowering it); kept for the repro of a failure."""
    text = str(module) if text is None else text
    try:
        with module.context:
            PassManager.parse(LLVM_PIPELINE).run(module.operation)
    except Exception as e:
        raise _failure(f"MLIR pipeline {LLVM_PIPELINE!r}", name, text, e) from e


def compile_host(module: ir.Module, name: str, text: Optional[str] = None) -> HostBinary:
    text = str(module) if text is None else text  # the input as given, for a repro of any later failure
    lower_to_llvm(module, name, text)
    try:
        engine = ExecutionEngine(module, opt_level=knobs.mlir_opt_level())
    except Exception as e:
        raise _failure("LLVM translation (ExecutionEngine)", name, text, e) from e
    address = engine.raw_lookup(HOST_SYMBOL)
    select_address = engine.raw_lookup(SELECT_SYMBOL)
    if not address or not select_address:
        raise LoweringError(f"{HOST_SYMBOL}/{SELECT_SYMBOL} not found in the compiled host program of {name}")
    return HostBinary(engine, address, select_address, module.context, module)


def main(argv: list[str]) -> int:
    """Re-run the pipeline on a saved module: python -m trident.lowering.pipeline FILE."""
    with open(argv[1]) as f:
        text = f.read()
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = True  # a saved repro may hold the op that broke it
    torch_d.register_dialect(ctx)
    with ctx:
        module = ir.Module.parse(text)
    compile_host(module, os.path.basename(argv[1]).removesuffix(".mlir"))
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
