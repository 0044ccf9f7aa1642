"""Writes docs/settings.md from trident/knobs.py (every TRIDENT_* setting)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from trident.knobs import settings_markdown  # noqa: E402

if __name__ == "__main__":
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "settings.md")
    with open(path, "w") as f:
        f.write(settings_markdown())
    print(path)
