"""Process replay: print every generated artifact (captured FX graph, optimized graph, SCM IR,
torch-dialect MLIR, host MLIR) for a fixed set of graphs, normalized, so two commits can be
diffed to prove a refactor changed nothing:

    python tools/print_artifacts.py > /tmp/a.txt   # on commit A
    python tools/print_artifacts.py > /tmp/b.txt   # on commit B
    diff /tmp/a.txt /tmp/b.txt
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import trident  # noqa: E402
from tests.conftest import normalize  # noqa: E402
from tests.goldens import axpy_graph, mixed_graph, tuned_graph  # noqa: E402
from trident.lowering.host_plan import format_plan  # noqa: E402
from trident.runtime import SCMRuntime  # noqa: E402


def main() -> None:
    for name, build in (("axpy", axpy_graph), ("mixed", mixed_graph), ("tuned", tuned_graph)):
        gm, opt = build()
        print(f"##### {name}: captured\n{normalize(gm.code.strip())}\n")
        print(f"##### {name}: optimized\n{normalize(opt.code.strip())}\n")
        print(f"##### {name}: SCM IR\n{trident.scm_text(opt)}")
        for rid in opt.meta["trident_regions"]:
            rt = SCMRuntime.get(rid)
            print(f"##### {name}/{rt.program.name}: torch dialect\n{rt.torch_mlir}")
            print(f"##### {name}/{rt.program.name}: host program\n{rt.host_mlir}")
            plans = "\n".join(format_plan(p, i) for i, p in enumerate(rt.host_plans))
            print(f"##### {name}/{rt.program.name}: host plans (Note [Host plans])\n{plans}\n")


if __name__ == "__main__":
    main()
