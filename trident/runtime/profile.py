"""Host-time profile of SCM calls (Note [Host-time profile] in trident/csrc/scm_runtime.h).

    with trident.profile() as prof:
        for _ in range(20):
            opt(*inputs)
    print(prof.table())

Each runtime service the native host program calls (allocation, kernel launch, operator call,
native view) is timed on the host, per entry; `host` is the whole host program (services
included). Nothing is synchronized: on CUDA these are launch-side costs, the time the host
spends before the device can run the work.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import defaultdict

from .native import C


@dataclasses.dataclass
class ProfileRow:
    kind: str  # call, host, graph, alloc, view, launch, gemm, typed, boxed, constant
    name: str
    calls: int
    ns: int

    @property
    def us_per_call(self) -> float:
        return self.ns / self.calls / 1e3 if self.calls else 0.0


@dataclasses.dataclass
class HostProfile:
    rows: list[ProfileRow] = dataclasses.field(default_factory=list)

    def grouped(self) -> list[ProfileRow]:
        """One row per (kind, name), most total time first."""
        acc: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for r in self.rows:
            acc[(r.kind, r.name)][0] += r.calls
            acc[(r.kind, r.name)][1] += r.ns
        out = [ProfileRow(k, n, c, ns) for (k, n), (c, ns) in acc.items()]
        return sorted(out, key=lambda r: -r.ns)

    def host_calls(self) -> int:
        """Runs of a generated host program (a graph replay runs none)."""
        return sum(r.calls for r in self.rows if r.kind == "host")

    def calls(self) -> int:
        """Calls of SCMs (each user call once, whether it replayed a graph or not)."""
        return sum(r.calls for r in self.rows if r.kind == "call")

    def table(self) -> str:
        steps = max(self.calls(), 1)
        lines = [f"{'kind':8} {'name':44} {'calls/step':>10} {'us/call':>9} {'us/step':>9}"]
        for r in self.grouped():
            lines.append(f"{r.kind:8} {r.name[:44]:44} {r.calls / steps:10.1f} {r.us_per_call:9.2f} {r.ns / steps / 1e3:9.1f}")
        return "\n".join(lines)

    def as_json(self) -> list[dict]:
        steps = max(self.calls(), 1)
        return [
            {"kind": r.kind, "name": r.name, "calls_per_step": r.calls / steps, "us_per_call": round(r.us_per_call, 3),
             "us_per_step": round(r.ns / steps / 1e3, 2)}
            for r in self.grouped()
        ]


@contextlib.contextmanager
def profile():
    """Collects a HostProfile of every SCM call made inside the block (all regions)."""
    prof = HostProfile()
    C.profile_reset()
    previous = C.set_profiling(True)
    try:
        yield prof
    finally:
        C.set_profiling(previous)
        prof.rows = [ProfileRow(*row) for row in C.profile_report()]
