"""The one capture cache both front doors keep per callable.

Note [One capture cache]
~~~~~~~~~~~~~~~~~~~~~~~~
A trident.compile'd function and each graph torch.compile hands the trident backend own a
CaptureCache: their optimized captures by signature (each door computes its own key), the
signatures Trident refused (a CaptureError or UnsupportedError: they run eagerly, with the
reason), the count and the reasons of eager calls, and the lock under which captures are made.
One bound for both, TRIDENT_CAPTURES (32): a callable that would need one more capture runs that
call eagerly instead, says so once as a warning on the `trident.misses` logger (shown on stderr
unless the program configures logging, as Dynamo's "hit config.recompile_limit" is) and in
explain() for every such call -- as Dynamo's own recompile limit does, so a program cycling
through more signatures than the bound never thrashes (a capture costs seconds, an eager call
what eager costs) and memory stays bounded (each capture holds its plans and its regions' CUDA
graphs, at most TRIDENT_GRAPH_BYTES a region: 2-92 MB a region in the benchmarks' decode and
prefill steps, `graph_bytes` in results/). Symbolic captures make the bound rarely reached: one
serves every size of a family (Note [Symbolic sizes]). But HF's generate() multiplies the
families of one forward: prefill and decode, each cache kind, batch 1 and batch n (sizes 0 and 1
stay static), a sliding window before and after it fills (Note [Symbolic regimes]). Llama
through both cache kinds, at two prompt lengths and batch 1 and 2, takes 10 captures; Gemma2
(sliding windows) 18; at Dynamo's 8 (its recompile limit, whose graphs are per frame, each one
family) the second cache kind or batch size of such a program ran eagerly. Hence 32: past it, the
program is meeting signatures no symbolic capture serves, and each capture costs seconds.
A symbolic capture whose guards refuse a call before anything ran (`retry_static`) lets the
door serve that call with a static capture of its own, the same rule in both doors.
"""

from __future__ import annotations

import collections
import threading
from typing import Optional

import torch

from .. import knobs, logs
from ..errors import GuardError

EAGER_LOG = 16  # eager calls whose reasons explain() lists, the latest


class CaptureCache:
    """Captures, refusals and eager calls of one front-door callable (Note [One capture cache])."""

    def __init__(self, door: str):
        self.door = door  # "trident.compile(f)", "torch.compile(backend='trident')": for messages
        self.captures: dict[tuple, torch.fx.GraphModule] = {}
        self.refused: dict[tuple, str] = {}
        self.eager_calls = 0
        self.eager_reason: Optional[str] = None  # the last reason a capture was refused
        self.eager_log: collections.deque = collections.deque(maxlen=EAGER_LOG)
        self.lock = threading.Lock()
        self.overflowed = False  # the bound was reached and said so (once)

    def full(self) -> bool:
        return len(self.captures) >= knobs.captures()

    def overflow(self) -> str:
        """The reason a call runs eagerly once the cache is full; the first time, a warning."""
        what = "function" if self.door.startswith("trident") else "graph"
        bound = knobs.captures()
        if not self.overflowed and bound > 0:  # 0 asks for every call eager: nothing to warn of
            self.overflowed = True
            logs.misses.warning(
                "%s: %d captures (TRIDENT_CAPTURES) reached; calls of a signature none of them serves run "
                "eagerly from now on. Raise TRIDENT_CAPTURES (e.g. TRIDENT_CAPTURES=%d) if this %s meets more "
                "shapes; trident.explain() lists each eager call and what changed.",
                self.door, bound, 2 * bound, what)
        return f"a new signature past TRIDENT_CAPTURES={bound} captures of this {what}: it runs eagerly"

    def eager(self, reason: str) -> None:
        """Count an eager call and keep why it ran eagerly."""
        self.eager_calls += 1
        self.eager_log.append(reason)

    def refuse(self, key, error: Exception, what: str = "capture this call") -> str:
        """A signature Trident cannot serve: every call of it runs eagerly, with this reason."""
        reason = f"Trident cannot {what}: {type(error).__name__}: {str(error).splitlines()[0]}"
        self.refused[key] = reason
        self.eager_reason = reason
        logs.misses.warning("%s: %s; it runs eagerly", self.door, reason)
        return reason

    def add(self, key, opt: torch.fx.GraphModule) -> None:
        self.captures[key] = opt

    def drop(self, key) -> None:
        self.captures.pop(key, None)

    def clear(self) -> None:
        self.captures.clear()
        self.refused.clear()
        self.overflowed = False


class ServedByCache:
    """What a front-door callable shows of its CaptureCache (`self.cache`): explain(),
    cache_info() and tests read these on both doors' callables."""

    cache: CaptureCache

    @property
    def captures(self) -> dict:
        return self.cache.captures

    @property
    def eager_calls(self) -> int:
        return self.cache.eager_calls

    @property
    def eager_reason(self) -> Optional[str]:
        return self.cache.eager_reason

    @property
    def eager_log(self) -> collections.deque:
        return self.cache.eager_log


def retry_static(opt: torch.fx.GraphModule, error: GuardError) -> bool:
    """Whether a GuardError of `opt` lets the door serve the call with another capture: `opt`
    is symbolic and raised before anything of the call ran (its call guards, or the guards of
    its first region when nothing before that region has an effect), or a value its trace
    specialized differs (Note [Values a trace specializes]: checked before anything ran)."""
    if error.traced_value and error.before_effects:
        return True
    return bool(opt.meta.get("trident_symbolic")) and (
        error.before_effects or error.region == opt.meta.get("trident_retry_region")
    )
