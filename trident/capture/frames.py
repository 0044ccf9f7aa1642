"""The user's line in a stack: the innermost frame outside torch, Triton and Trident."""

from __future__ import annotations

import os
import traceback
from typing import Optional

import torch
import triton

LIBRARY_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (torch, triton) if getattr(m, "__file__", None)
) + (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)


def user_line(frames: "list[traceback.FrameSummary]") -> Optional[str]:
    """`file:line in function `source`` of the innermost of `frames` outside the libraries, or
    None: where the traced program did what a capture had to deal with (a `.item()`, a
    data-dependent branch in a library's code)."""
    mine = [f for f in frames if not f.filename.startswith(LIBRARY_DIRS)]
    if not mine:
        return None
    f = mine[-1]
    source = f" `{f.line.strip()}`" if f.line else ""
    return f"{os.path.relpath(f.filename) if not f.filename.startswith('/') else f.filename}:{f.lineno} in {f.name}{source}"
