"""TRIDENT_LOG: what Trident does off the hit path, through `logging`.

    TRIDENT_LOG=misses,guards,graphs,lowering python my_program.py

Each name is a logger under "trident" (`logging.getLogger("trident.misses")`, ...); TRIDENT_LOG
turns the named ones on at DEBUG with a handler writing to stderr, as TORCH_LOGS does for torch.
Without it the loggers stay quiet and follow the program's own logging configuration. Nothing
is logged on the hit path.
  misses    a miss: the region, why no specialization matched, the one compiled, how long it took
  guards    the guards of each new specialization
  graphs    graph recordings: staged and pinned inputs, memory held, refusals and their reasons
  lowering  each host-program build: specializations, MLIR size, time
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from typing import Iterable, TypeVar

import torch._higher_order_ops.triton_kernel_wrap as tkw

from . import knobs

T = TypeVar("T")

NAMES = knobs.LOG_NAMES  # parsed, with the other TRIDENT_* knobs, by knobs.log

misses = logging.getLogger("trident.misses")
guards = logging.getLogger("trident.guards")
graphs = logging.getLogger("trident.graphs")
lowering = logging.getLogger("trident.lowering")

_handler: "logging.Handler | None" = None


def configure(value: "str | None" = None) -> None:
    """Applies TRIDENT_LOG (or `value`): the named loggers at DEBUG on stderr, the others back
    to the program's configuration. Raises knobs.KnobError (a ValueError) for an unknown name."""
    global _handler
    wanted = set(knobs.log() if value is None else knobs.parse("log", value))
    if _handler is None:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("[trident.%(short)s] %(message)s"))
        _handler.addFilter(_short_name)
    for name in NAMES:
        logger = logging.getLogger(f"trident.{name}")
        if name in wanted:
            logger.setLevel(logging.DEBUG)
            logger.propagate = False  # written once, by our handler (as TORCH_LOGS does)
            if _handler not in logger.handlers:
                logger.addHandler(_handler)
        else:
            logger.setLevel(logging.NOTSET)
            logger.propagate = True
            if _handler in logger.handlers:
                logger.removeHandler(_handler)


_analysis_lock = threading.Lock()
_analysis_threads: dict = {}  # thread id -> the lists of the contexts it is inside, outermost first


class _AnalysisFailure(logging.Filter):
    """Note [torch's launch analysis, quietly]: torch works out which tensors a Triton launch
    writes by compiling the kernel to TTIR (identify_mutated_tensors in torch 2.11,
    identify_accessed_tensors in 2.13); where that fails it takes every tensor argument as written
    and logs a WARNING with the whole traceback. torch 2.11 fails for any kernel that calls a
    method on a float argument (it passes floats to the compiler as constants: Liger-Kernel's
    RMSNorm does `eps.to(tl.float32)`), so every trace of a Liger model printed ~540 lines of
    traceback a layer: ~7,600 lines on the first `generate()` of a 16-layer Llama
    (tools/readme_generate.py on an H100 at c79fb30). In a thread inside torch_analysis_quiet
    (Trident tracing or planning) such a record becomes one line of TRIDENT_LOG=lowering with the
    exception, and each enclosing context notes the failure (outline_regions then keeps torch's
    fallback answer out of its caches); records of other threads, and every record while torch's
    logger is at DEBUG (TORCH_LOGS), are left as they are. The analysis and its fallback are
    torch's, unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or not record.exc_info or "assuming every input is mutated" not in str(
                record.msg):
            return True
        contexts = _analysis_threads.get(record.thread)
        if not contexts:
            return True
        error = record.exc_info[1]
        for seen in contexts:
            seen.append(error)
        if tkw.log.isEnabledFor(logging.DEBUG):
            return True
        lowering.debug("torch could not tell which tensors a Triton launch writes (%s: %s): it takes every tensor "
                       "argument as written", type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        return False


_analysis_filter = _AnalysisFailure()


@contextlib.contextmanager
def torch_analysis_quiet():
    """Note [torch's launch analysis, quietly], for this thread while inside; yields the list of
    the analysis failures seen in it (empty: none)."""
    me, seen = threading.get_ident(), []
    with _analysis_lock:
        _analysis_threads.setdefault(me, []).append(seen)
        tkw.log.addFilter(_analysis_filter)  # once: addFilter keeps one of each
    try:
        yield seen
    finally:
        with _analysis_lock:
            contexts = _analysis_threads[me]
            del contexts[next(i for i, c in enumerate(contexts) if c is seen)]  # by identity: lists compare equal
            if not contexts:
                del _analysis_threads[me]
            if not _analysis_threads:
                tkw.log.removeFilter(_analysis_filter)


def _short_name(record: logging.LogRecord) -> bool:
    record.short = record.name.split(".", 1)[-1]
    return True


PROGRESS_MIN_ITEMS = 8  # TRIDENT_PROGRESS=auto: a bar from this many kernels on


def progress(items: "list[T]", desc: str) -> "Iterable[T]":
    """`items`, with a tqdm bar on stderr while they are worked through (a miss compiling a
    region's kernels: a 24-layer model has hundreds). TRIDENT_PROGRESS: 'auto' shows it on a
    terminal from PROGRESS_MIN_ITEMS items, '1' always, '0' never."""
    mode = knobs.progress()
    if mode == "never" or not items:
        return items
    if mode == "auto" and (len(items) < PROGRESS_MIN_ITEMS or not sys.stderr.isatty()):
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is a dependency; a stripped environment still runs, without a bar
        return items
    return tqdm(items, desc=desc, unit="kernel", leave=False, file=sys.stderr, dynamic_ncols=True)
