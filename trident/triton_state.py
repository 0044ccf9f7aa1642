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

Note [Interpreted device functions end their patch]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Under TRITON_INTERPRET=1 a kernel calling a @triton.jit device function calls an
InterpretedFunction, whose `__call__` runs `_patch_lang(self.fn)` for the callee's module and
drops the scope it returns: what that patch changes and the launch's own patch (the kernel's
module) does not restore stays patched for good. `tl.sum` is one: triton/language/standard.py
sees `triton.language.core`, so after the first eager `tl.sum` the builtins of
`triton.language.core` (`mul`, `add`, `arange`, ...) are the interpreter's. Triton's interpreter
never compiles, so Triton does not notice; Trident does (captures of such kernels compile their
JITFunction twins, Note [Capture under TRITON_INTERPRET=1]): `tensor.__mul__` calls
`core.mul`, which then builds an interpreter tensor around an `ir.value`, and the code generator
fails at the first operator (`'ir.value' object has no attribute 'dtype'`) -- `kernel.warmup`
compiles only on a cache miss, so a warm Triton cache hid it. `install()` (at `import trident`)
makes the call end its patch with the call, as Trident's own interpreted device calls do
(`_call_interpreted` in trident/runtime/cpu_launcher.py): the attributes it patches are
restored on return to what they were on entry (the launch's patch where both patch one).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Iterator

from triton.runtime import interpreter

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


def _ending_its_patch(call):
    @functools.wraps(call)
    def device_call(self, *args, **kwargs):
        # The same _patch_lang(self.fn) as `call` makes, taken first so that this scope holds
        # the values from before the call (Note [Interpreted device functions end their patch]).
        scope = interpreter._patch_lang(self.fn)
        try:
            return call(self, *args, **kwargs)
        finally:
            scope.restore()

    device_call.__trident_ends_patch__ = True
    return device_call


def install() -> None:
    """At `import trident` (GPU or not): interpreted device-function calls restore the
    triton.language they patched (Note [Interpreted device functions end their patch])."""
    cls = interpreter.InterpretedFunction
    if not getattr(cls.__call__, "__trident_ends_patch__", False):
        cls.__call__ = _ending_its_patch(cls.__call__)
