"""The README's results quote the JSON they cite: every number with two decimals in its Results
section (ms/token, ms/step; ratios excepted) is a measured value, rounded, of one of the JSON
files that section links."""

from __future__ import annotations

import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _numbers(obj, out):
    """The medians a JSON reports (ms_per_token, ms_per_step, static_floor_ms_per_token), rounded."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and "ms_per" in k and "samples" not in k:
                out.add(f"{v:.2f}")
            else:
                _numbers(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _numbers(v, out)


def test_readme_results_quote_their_json():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index("## Results"):]
    section = section[: section.index("\n## ", 1)]
    links = sorted(set(re.findall(r"\((results/[^)]+\.json)\)", section)))
    assert links, "the Results section cites no JSON"
    measured: set = set()
    for link in links:
        with open(os.path.join(ROOT, link)) as f:
            _numbers(json.load(f), measured)
    quoted = re.findall(r"(?<![\w.])(\d+\.\d\d)(?![\dx])", section)
    missing = sorted({q for q in quoted if q not in measured})
    assert not missing, f"numbers in the README's Results not in the JSON it cites {links}: {missing}"
