"""TRIDENT_LOG (trident/logs.py): what a miss, a new specialization, a graph recording and a
host-program build write, as goldens."""

from __future__ import annotations

import logging
import re

import expecttest
import pytest
import torch

import trident
from tests.runtime.test_graph_replay import _inplace_reference, _inplace_scaled_add
from trident import knobs, logs


def _normalized(records) -> str:
    text = "\n".join(f"[{r.name}] {r.getMessage()}" for r in records)
    text = re.sub(r"\d+\.\d\d s", "T s", text)
    text = re.sub(r"region\d+", "regionN", text)
    return re.sub(r"\d+ lines of host MLIR", "L lines of host MLIR", text)


class TestLogs(expecttest.TestCase):
    def setUp(self):
        logs.configure("misses,guards,graphs,lowering")

    def tearDown(self):
        logs.configure("")

    def test_log_lines(self):
        records = []

        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record)

        keep = Keep()
        for name in logs.NAMES:
            logging.getLogger(f"trident.{name}").addHandler(keep)
        try:
            x = torch.zeros(256)
            with knobs.scope(graphs="all", graph_min_saving_us="-inf"):
                opt = trident.optimize(trident.capture(_inplace_scaled_add, x, torch.zeros(256)))
            ref = x.clone()
            for a in [torch.randn(256) for _ in range(3)]:
                opt(x, a)
                _inplace_reference(ref, a)
            opt(x.double(), torch.randn(256, dtype=torch.float64))  # a miss: new dtype
        finally:
            for name in logs.NAMES:
                logging.getLogger(f"trident.{name}").removeHandler(keep)
        torch.testing.assert_close(x, ref)
        self.assertExpectedInline(_normalized(records), """\
[trident.guards] regionN: specialization 0 guards:
  x_1: f32[256] strides=(1) cpu aligned16
  a_1: f32[256] strides=(1) cpu aligned16
[trident.lowering] regionN: host program for 1 specialization(s): L lines of host MLIR, built in T s
[trident.graphs] regionN: recorded graph 0 (emulated): staged inputs [1] (written back []), 1 pinned, 1.0 KiB held; 0 retired so far
[trident.guards] regionN: specialization 1 guards:
  x_1: f64[256] strides=(1) cpu aligned16
  a_1: f64[256] strides=(1) cpu aligned16
[trident.lowering] regionN: host program for 2 specialization(s): L lines of host MLIR, built in T s
[trident.misses] regionN: miss (specialization 0: tensor 'x_1' dtype mismatch: expected f32, got f64): compiled specialization 1 in T s""")


def test_unknown_log_names_are_refused():
    with pytest.raises(ValueError, match="expected a comma list of misses, guards, graphs, lowering"):
        logs.configure("misses,everything")
