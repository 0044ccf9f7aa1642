"""Note [A closed plan]: a specialization written as data and read back plans, prints and lowers
exactly as the original, and serves calls in a fresh region; records that do not fit are
refused."""

from __future__ import annotations

import functools
import json
import re

import pytest
import torch

import trident
from tests import kernels as K
from tests.decode_model import Config, decode_step, decode_step_reference, make_caches, make_weights
from trident.lowering import emit_host_module, import_region
from trident.lowering.host_plan import host_plan
from trident.optimize import _regions
from trident.runtime import SCMRuntime
from trident.scm.printer import format_specialization
from trident.scm.serialize import SerializationError, specialization_from_data, specialization_to_data


def _decode_opt(device):
    cfg = Config()
    weights, cos, sin = make_weights(cfg, device)
    caches = make_caches(cfg, device)
    x, pos = torch.randn(1, cfg.hidden, device=device), torch.tensor([2], device=device)
    inputs = [x, pos, cos, sin, *caches, *weights]
    opt = trident.optimize(trident.capture(functools.partial(decode_step, cfg), *inputs))
    return cfg, opt, inputs


def _programs():
    """(optimized graph, example inputs) covering views, the arena, early release, cache writes,
    autotuned and heuristics launches."""
    cfg, opt, inputs = _decode_opt("cpu")
    yield "decode", opt, inputs
    x = torch.randn(3000)
    yield "autotuned", trident.optimize(trident.capture(K.tuned_scale, x)), [x]
    # Note [Symbolic sizes]: expressions in grids, integer arguments and allocations; size guards
    x, y = torch.randn(1000), torch.randn(1000)
    yield "symbolic", trident.optimize(trident.capture(K.two_kernels, x, y, dynamic=True)), [x, y]
    yield "symbolic_autotuned", trident.optimize(trident.capture(K.tuned_scale, x, dynamic=True)), [x]


def _round_trip(program, spec):
    data = json.loads(json.dumps(specialization_to_data(program, spec)))
    return data, specialization_from_data(program, data, compile_kernels=True)


@pytest.mark.parametrize("case", ["decode", "autotuned", "symbolic", "symbolic_autotuned"])
def test_round_trip_prints_and_lowers_as_the_original(case):
    name, opt, _ = next(p for p in _programs() if p[0] == case)
    for rt in _regions(opt):
        (spec,) = rt.scm.specializations
        data, back = _round_trip(rt.program, spec)
        assert format_specialization(back, rt.program) == format_specialization(spec, rt.program)
        if case.startswith("symbolic"):
            assert data["size_guards"] and back.size_guards
            tampered = json.loads(json.dumps(data))
            tampered["size_guards"] = tampered["size_guards"][:-1]
            with pytest.raises(SerializationError, match="size guards differ"):
                specialization_from_data(rt.program, tampered, compile_kernels=False)
        # native handles are runtime state, not plan (Note [Host plans]): the same ones give the
        # same step table and the same host program
        torch_module = import_region(rt.program, __import__("torch_mlir").ir.Context())
        handles = rt.host_plans[0].handles
        plan, plan_back = host_plan(rt.scm, spec, handles), host_plan(rt.scm, back, handles)
        assert plan_back == plan
        plan.handle = plan_back.handle = rt.host_plans[0].handle
        assert str(emit_host_module(rt.scm, torch_module, [back], [plan_back])) == str(
            emit_host_module(rt.scm, torch_module, [spec], [plan])
        )
        if case == "autotuned":
            (launch,) = back.launches
            assert launch.step.config == spec.launches[0].step.config >= 0 and launch.step.tuned == spec.launches[0].step.tuned


def test_restored_specialization_serves_a_fresh_region():
    """The record installed in a new region of the same program: the call hits it (no planning,
    no Triton compile: its kernels come from Triton's cache) and computes what eager does."""
    cfg, opt, inputs = _decode_opt("cpu")
    (rt,) = _regions(opt)
    data = json.loads(json.dumps(specialization_to_data(rt.program, rt.scm.specializations[0])))
    fresh = SCMRuntime(rt.program)
    fresh.restore_specialization(data)
    assert fresh.build_costs[-1]["triton_s"] < 0.5 * rt.build_costs[0]["triton_s"] + 0.05
    region_inputs = [t.clone() if i.mutated else t for t, i in zip(_region_inputs(opt, rt, inputs), rt.program.inputs)]
    mutated = [t for t, i in zip(region_inputs, rt.program.inputs) if i.mutated]
    reads = [t for t, i in zip(region_inputs, rt.program.inputs) if not i.mutated]
    got = torch.ops.trident.scm(fresh.region_id, mutated, reads)
    want = torch.ops.trident.scm(rt.region_id, [t.clone() for t in mutated], reads)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert fresh.stats()["hits"] == 1 and fresh.stats()["misses"] == 0
    # and the result is the model's
    caches = [c.clone() for c in inputs[4: 4 + 2 * cfg.layers]]
    ref = decode_step_reference(cfg, inputs[0], inputs[1], inputs[2], inputs[3], *caches, *inputs[4 + 2 * cfg.layers:])
    torch.testing.assert_close(opt(*inputs), ref)


def _region_inputs(opt, rt, inputs):
    """The region's inputs, in its order, from the graph's (the single scm node reads them)."""
    (node,) = [n for n in opt.graph.nodes if n.target is torch.ops.trident.scm.default]
    env = {n.name: v for n, v in zip([p for p in opt.graph.nodes if p.op == "placeholder"], inputs)}
    mutated, reads = node.args[1], node.args[2]
    by_name = {n.name: env[n.name] for n in list(mutated) + list(reads)}
    order_m, order_r = iter(mutated), iter(reads)
    return [by_name[next(order_m).name] if i.mutated else by_name[next(order_r).name] for i in rt.program.inputs]


def test_records_that_do_not_fit_are_refused():
    x, y = torch.randn(100), torch.randn(100)
    opt = trident.optimize(trident.capture(K.axpy, x, y))
    (rt,) = _regions(opt)
    data = specialization_to_data(rt.program, rt.scm.specializations[0])
    with pytest.raises(SerializationError, match="format"):
        specialization_from_data(rt.program, {**data, "format": 999}, compile_kernels=False)
    other = trident.optimize(trident.capture(K.two_kernels, x, y))
    (ort,) = _regions(other)
    with pytest.raises(SerializationError, match="another program"):
        specialization_from_data(ort.program, data, compile_kernels=False)
    forged = json.loads(json.dumps(data))
    forged["launches"][0]["key"]["tuple"][0] = {"tuple": [{"str": "*fp16"}, {"str": "D"}]}  # not what Triton says
    with pytest.raises(SerializationError, match="Triton's key is now"):
        specialization_from_data(rt.program, forged, compile_kernels=False)


def test_a_recorded_kernel_hash_naming_another_specialization_is_not_used(caplog):
    """issue 23: a record names its compiled kernel by Triton's hash; one naming another
    specialization of the same kernel (compiled for a misaligned x; another launch's, with its
    own BLOCK and num_warps) or another kernel is checked against the launch (its name, source,
    TTIR signature, num_warps) and refused, with a log line, and the launch's own kernel is used."""
    import logging

    from trident.scm.refs import _compiled

    x, y = torch.randn(1000), torch.randn(1000)
    opt = trident.optimize(trident.capture(K.axpy, x, y))
    (rt,) = _regions(opt)
    opt(torch.randn(1001)[1:], y)  # plans specialization 1: x misaligned
    own, other = (s.launches[0].binary for s in rt.scm.specializations[:2])
    assert own != other and _compiled[own].name == _compiled[other].name  # two specializations of one kernel
    data = specialization_to_data(rt.program, rt.scm.specializations[0])
    forged = json.loads(json.dumps(data))
    forged["launches"][0]["kernel_hash"] = other
    with caplog.at_level(logging.WARNING, logger="trident.misses"):
        back = specialization_from_data(rt.program, forged, compile_kernels=True)
    assert back.launches[0].binary == own, "the forged kernel was used"
    assert "is not its specialization: its parameter x_ptr is not assumed 16-divisible" in caplog.text, caplog.text
    assert specialization_from_data(rt.program, data, compile_kernels=True).launches[0].binary == own
    # the same kernel at another launch of one region (its BLOCK and num_warps differ), and another kernel
    opt = trident.optimize(trident.capture(K.two_kernels, x, y))
    (rt,) = _regions(opt)
    data = specialization_to_data(rt.program, rt.scm.specializations[0])
    first, second = (p.binary for p in rt.scm.specializations[0].launches)
    forged = json.loads(json.dumps(data))
    forged["launches"][1]["kernel_hash"] = first
    with caplog.at_level(logging.WARNING, logger="trident.misses"):
        assert specialization_from_data(rt.program, forged, compile_kernels=True).launches[1].binary == second
    assert "it runs 2 warps, the launch 4" in caplog.text, caplog.text
    other = trident.optimize(trident.capture(K.tuned_scale, torch.randn(3000)))
    (ort,) = _regions(other)
    forged = json.loads(json.dumps(data))
    forged["launches"][0]["kernel_hash"] = ort.scm.specializations[0].launches[0].binary
    forged["launches"][0]["kernel"] = ort.scm.specializations[0].launches[0].compiled.name
    with caplog.at_level(logging.WARNING, logger="trident.misses"):
        assert specialization_from_data(rt.program, forged, compile_kernels=True).launches[0].binary == first
    assert "it is kernel tuned_scale_kernel, the launch's is axpy_kernel" in caplog.text, caplog.text


def test_a_recorded_kernel_compiled_in_another_checkout_is_used(caplog, monkeypatch):
    """Triton's key hashes a kernel's source and first line, not its file's path: a Triton cache
    shared by two checkouts of one program (CI's clone and a developer's tree) holds the kernel
    with the path of the checkout that compiled it first. The record's kernel is still this
    launch's and is used, with no warning."""
    import logging

    from trident.scm.refs import _compiled

    x, y = torch.randn(1000), torch.randn(1000)
    opt = trident.optimize(trident.capture(K.axpy, x, y))
    (rt,) = _regions(opt)
    own = rt.scm.specializations[0].launches[0].binary
    ttir = _compiled[own].asm["ttir"]
    # The TTIR names the checkout that compiled the kernel first: this one, or (Triton cache
    # shared, as on CI) another; either way it is moved to a third.
    (path,) = set(re.findall(r'loc\("([^"]*tests/kernels\.py)"', ttir))
    monkeypatch.setitem(_compiled[own].asm, "ttir", ttir.replace(path, "/elsewhere/checkout/tests/kernels.py"))
    data = specialization_to_data(rt.program, rt.scm.specializations[0])
    with caplog.at_level(logging.WARNING, logger="trident.misses"):
        assert specialization_from_data(rt.program, data, compile_kernels=True).launches[0].binary == own
    assert "is not its specialization" not in caplog.text, caplog.text


def test_dump_dir_holds_each_specialization_record(tmp_path):
    from trident import knobs

    x, y = torch.randn(100), torch.randn(100)
    with knobs.scope(dump_dir=str(tmp_path)):
        opt = trident.optimize(trident.capture(K.axpy, x, y))
    (rt,) = _regions(opt)
    (path,) = tmp_path.glob("*.spec0.json")
    data = json.loads(path.read_text())
    back = specialization_from_data(rt.program, data, compile_kernels=False)
    assert format_specialization(back) == format_specialization(rt.scm.specializations[0])
