"""TRIDENT_LOG (trident/logs.py): what a miss, a new specialization, a graph recording and a
host-program build write, as goldens."""

from __future__ import annotations

import logging
import re
import sys
import threading

import expecttest
import pytest
import torch
import torch._higher_order_ops.triton_kernel_wrap as tkw
import triton
import triton.language as tl

import trident
from tests.runtime.test_graph_replay import _inplace_reference, _inplace_scaled_add
from trident import disk_cache, knobs, logs


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
  x: f32[256] strides=(1) cpu aligned16
  a: f32[256] strides=(1) cpu aligned16
[trident.lowering] regionN: host program of specialization 0: L lines of host MLIR, built in T s
[trident.graphs] regionN: recorded graph 0 (emulated): staged inputs [1] (written back []), 1 pinned, 1.0 KiB held; 0 retired so far
[trident.guards] regionN: specialization 1 guards:
  x: f64[256] strides=(1) cpu aligned16
  a: f64[256] strides=(1) cpu aligned16
[trident.lowering] regionN: host program of specialization 1: L lines of host MLIR, built in T s
[trident.misses] regionN: miss (specialization 0: tensor 'x' dtype mismatch: expected f32, got f64): compiled specialization 1 in T s""")


def test_unknown_log_names_are_refused():
    with pytest.raises(ValueError, match="expected a comma list of misses, guards, graphs, lowering"):
        logs.configure("misses,everything")


def test_progress_bar_while_a_miss_compiles_kernels(capsys):
    """TRIDENT_PROGRESS=1: a tqdm bar on stderr over the kernels a miss compiles, gone after
    (leave=False); '0' and the default off a terminal: nothing written."""
    from tests.decode_model import Config, decode_step, make_caches, make_weights

    cfg = Config(layers=2)
    weights, cos, sin = make_weights(cfg, "cpu", torch.float32)
    caches = make_caches(cfg, "cpu", torch.float32)
    x, pos = torch.randn(1, cfg.hidden), torch.tensor([3])

    def step(x, pos):
        return decode_step(cfg, x, pos, cos, sin, *caches, *weights)

    for value, shown in (("1", True), ("0", False), ("auto", False)):  # pytest's stderr is no terminal
        capsys.readouterr()
        with knobs.scope(progress=value):
            opt = trident.optimize(trident.capture(step, x, pos))
            opt(x, pos)  # the miss
        err = capsys.readouterr().err
        assert ("compiling kernels" in err) == shown, (value, err)
        if shown:
            launches = len(trident.runtime.SCMRuntime.get(opt.meta["trident_regions"][0]).program.launches)
            assert launches >= logs.PROGRESS_MIN_ITEMS and f"/{launches} " in err, err
    with knobs.scope(progress="sometimes"), pytest.raises(ValueError, match="TRIDENT_PROGRESS"):
        knobs.progress()


@triton.jit
def _analysed_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3, mask=mask)


def _tripled(x):
    out = torch.empty_like(x)
    _analysed_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
    return out


def test_torch_failing_to_analyse_a_launch_is_one_line_of_trident_log(monkeypatch, caplog, tmp_path):
    """Note [torch's launch analysis, quietly]: torch 2.11 fails to compile Liger's RMSNorm to TTIR
    for its analysis of what a launch writes and logs the traceback, ~540 lines a layer. While
    Trident traces and plans, that is one TRIDENT_LOG=lowering line naming the exception; torch's
    fallback (every tensor written) is kept, so the result is right. With torch's logger at DEBUG
    the record is torch's own, traceback and all; outside Trident the filter is gone."""
    def refuse(*args, **kwargs):
        raise AttributeError("'float' object has no attribute 'to'")

    monkeypatch.setattr(tkw, "generate_ttir", refuse)
    caplog.set_level(logging.DEBUG, logger="trident.lowering")
    stored = []
    monkeypatch.setattr(disk_cache, "store", lambda kind, *args: stored.append(kind))
    x = torch.randn(100)
    with knobs.scope(cache_dir=str(tmp_path)):  # torch's fallback is not kept as the kernel's analysis
        opt = trident.optimize(trident.capture(_tripled, x))
    assert "written" not in stored
    torch.testing.assert_close(opt(x), x * 3)
    assert not [r for r in caplog.records if r.name == tkw.log.name]
    ours = [r.getMessage() for r in caplog.records
            if r.name == "trident.lowering" and "could not tell" in r.getMessage()]
    assert ours and all("AttributeError: 'float' object has no attribute 'to'" in m for m in ours), ours
    assert logs._analysis_filter not in logging.getLogger(tkw.log.name).filters
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger=tkw.log.name)
    monkeypatch.setattr(sys.modules["trident.passes.outline_regions"], "_WRITTEN", {})  # analysed again
    trident.optimize(trident.capture(_tripled, x))
    warned = [r for r in caplog.records if r.name == tkw.log.name and r.levelno == logging.WARNING]
    assert warned and warned[0].exc_info is not None


def test_only_the_threads_inside_trident_have_torchs_analysis_warning_condensed(caplog):
    """The filter sits on torch's logger for the whole process while any thread traces: a record
    of another thread (a user's own torch.compile beside) is torch's, as is every record while
    torch's logger is at DEBUG; either way the failure is noted for the thread inside."""
    try:
        raise AttributeError("'float' object has no attribute 'to'")
    except AttributeError as e:
        error, info = e, (type(e), e, e.__traceback__)
    record = logging.LogRecord(tkw.log.name, logging.WARNING, __file__, 1,
                               "Encountered an exception in identify_accessed_tensors, assuming every input is mutated",
                               None, info)
    with logs.torch_analysis_quiet() as seen:
        with logs.torch_analysis_quiet() as inner:
            record.thread = threading.get_ident() + 1
            assert logs._analysis_filter.filter(record) and not seen
            record.thread = threading.get_ident()
            assert not logs._analysis_filter.filter(record) and seen == inner == [error]
            other = logging.LogRecord(tkw.log.name, logging.WARNING, __file__, 1, "another warning", None, info)
            other.thread = threading.get_ident()
            assert logs._analysis_filter.filter(other) and seen == [error]
        caplog.set_level(logging.DEBUG, logger=tkw.log.name)
        assert logs._analysis_filter.filter(record) and seen == [error, error] and inner == [error]
    assert logs._analysis_filter not in tkw.log.filters and not logs._analysis_threads
