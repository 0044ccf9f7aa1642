"""One lock over Triton's process-global language state.

Note [Triton's interpreter state]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Triton's interpreter runs a kernel by patching `triton.language` process-wide
(`interpreter._patch_lang` swaps `tl.load`, `tl.tensor`'s operators and friends for interpreted
versions) and holds the current grid index in one global builder. While a launch has them
patched, any other thread that runs Triton's frontend -- `JITFunction.warmup`/`run` (the cache
key's dependency walk and the code generator read those same attributes), `wrap_triton`'s TTIR
generation during capture, an autotuner's compile -- sees the interpreter's builtins and fails
(`'block_argument' object has no attribute 'dtype'`), and two launches clobber each other's
patches and grid indices. So Trident's interpreted CPU launches and every Triton frontend run of
Trident's own (capture, specialization, tuning) hold `exclusive()`: one reentrant lock, waited
for without the GIL (a Python lock releases it while blocking), so no thread ever waits for it
holding something a holder needs (Note [Locks and the GIL]). Compilations of the user's own
code in other threads do not take it; they race with a concurrent interpreted launch exactly as
they would with Triton's own interpreter.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

_lock = threading.RLock()
_count = threading.Lock()
_waiting = 0


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """Hold Triton's language state: no interpreted launch or frontend run in another thread."""
    global _waiting
    if not _lock.acquire(blocking=False):
        with _count:
            _waiting += 1
        try:
            _lock.acquire()
        finally:
            with _count:
                _waiting -= 1
    try:
        yield
    finally:
        _lock.release()


def waiting() -> int:
    """Threads blocked in exclusive() right now (tests make races deterministic with it)."""
    return _waiting
