"""A process-wide patch held while any thread needs it (capture's routing of `kernel[grid]`,
the remapping of torch.distributed's collectives)."""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator


def setter(owner, name: str, value) -> Callable[[], None]:
    """A function that sets `owner.name = value`: one side of a SharedPatch of an attribute."""

    def install() -> None:
        setattr(owner, name, value)

    return install


class SharedPatch:
    """Installed by the first holder, removed by the last. The patched functions consult
    thread-local state, so threads not holding it keep the original behaviour."""

    def __init__(self, install: Callable[[], None], remove: Callable[[], None]):
        self._install = install
        self._remove = remove
        self._lock = threading.Lock()
        self._users = 0

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._install()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._remove()
