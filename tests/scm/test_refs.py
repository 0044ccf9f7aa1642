"""Note [Stable keys]: a Specialization is data -- no JITFunction, Autotuner, Heuristics,
OpOverload, CompiledKernel or GraphModule inside, it pickles -- and the keys naming kernels and
operators are the same in another process."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import subprocess
import sys
import types

import pytest
import torch
import triton
from torch._inductor.runtime.cache_dir_utils import triton_cache_dir
from torch._ops import OpOverload
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.runtime.jit import JITFunction

import trident
from tests import kernels as K
from trident.runtime import SCMRuntime
from trident.scm import refs, tuning
from trident.scm.printer import format_specialization
from trident.scm.specialize import PointerStandIn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIVE = (JITFunction, Autotuner, Heuristics, OpOverload, torch.fx.GraphModule, types.FunctionType)


def _live_objects(value, path="spec", seen=None):
    """Paths to every live object reachable from `value` through dataclass fields, containers and
    dict values."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, LIVE) or type(value).__name__ == "CompiledKernel":
        return [f"{path}: {type(value).__name__}"]
    out = []
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            out += _live_objects(getattr(value, f.name), f"{path}.{f.name}", seen)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out += _live_objects(v, f"{path}[{i}]", seen)
    elif isinstance(value, dict):
        for k, v in value.items():
            out += _live_objects(v, f"{path}[{k!r}]", seen)
    return out


def program(x):
    y = K.heuristic_tuned(x)  # @triton.heuristics over @triton.autotune
    z = torch.mm(y.view(10, 100), y.view(100, 10))  # an operator
    return K.axpy(z.reshape(-1), z.reshape(-1))  # a plain @triton.jit launch


@pytest.fixture
def timer():
    tuning.set_cpu_timer(lambda tuner, c, args: -c.kwargs["BLOCK"])
    yield
    tuning.set_cpu_timer(None)


def test_a_specialization_holds_no_live_objects_and_pickles(timer):
    x = torch.randn(1000)
    opt = trident.optimize(trident.capture(program, x))
    torch.testing.assert_close(opt(x), program(x))
    opt(torch.randn(1001)[1:])  # a second specialization (misaligned input)
    specs = [s for rid in opt.meta["trident_regions"] for s in SCMRuntime.get(rid).scm.specializations]
    assert len(specs) >= 2
    launches = [p for s in specs for p in s.launches]
    assert any(p.step.tuner is not None for p in launches) and any(p.step.heuristics is not None for p in launches)
    assert any(s.atens for s in specs)
    for spec in specs:
        assert _live_objects(spec) == []
        back = pickle.loads(pickle.dumps(spec))
        assert format_specialization(back) == format_specialization(spec)
    # what the keys name, resolved in this process
    for p in launches:
        assert isinstance(p.step.fn, JITFunction) and p.step.fn.fn.__name__ == p.step.kernel_name
        assert p.compiled is None or p.compiled.hash == p.binary
    assert all(a.step.op is torch.ops.aten.mm.default for s in specs for a in s.atens if "mm" in a.step.op_name)


def test_operator_names_resolve_back():
    import torch.library

    lib = torch.library.Library("trident_refs_test", "FRAGMENT")  # noqa: TOR901
    lib.define("scaled.twice(Tensor x) -> Tensor")
    for op in (torch.ops.aten.add.Tensor, torch.ops.aten.mm.default, torch.ops.aten._foreach_mul_.Scalar,
               torch.ops.aten.sym_size.int, torch.ops.trident_refs_test.scaled.twice):
        assert refs.operator(refs.op_name(op)) is op


_KEYS = """
import json, sys
sys.path.insert(0, {root!r})
from tests import kernels as K
from trident.scm import refs
print(json.dumps([repr(refs.kernel_ref(k)) + refs.kernel_ref(k).key + refs.kernel_ref(k).kind
                  for k in (K.axpy_kernel, K.tuned_scale_kernel, K.heuristic_tuned_kernel)]))
"""


def test_kernel_keys_are_the_same_in_another_process():
    here = [repr(refs.kernel_ref(k)) + refs.kernel_ref(k).key + refs.kernel_ref(k).kind
            for k in (K.axpy_kernel, K.tuned_scale_kernel, K.heuristic_tuned_kernel)]
    proc = subprocess.run([sys.executable, "-c", _KEYS.format(root=ROOT)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONHASHSEED": "123"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == here
    assert [r[-3:] for r in here] == ["jit", "une", "ics"]  # jit, autotune, heuristics
    assert len({r for r in here}) == 3


def test_a_changed_autotuner_has_another_key():
    import copy

    import triton

    other = copy.copy(K.tuned_scale_kernel)
    other.configs = list(other.configs) + [triton.Config({"BLOCK": 1024})]
    assert refs.kernel_ref(other) != refs.kernel_ref(K.tuned_scale_kernel)
    assert refs.live(refs.kernel_ref(other)) is other


def test_objects_the_digest_cannot_tell_apart_get_keys_of_their_own():
    """Two @triton.heuristics over one kernel whose value functions differ only in a captured
    value have the same code digest: each still gets its own key, and the key resolves to it."""
    import triton

    def even(m):
        return lambda args: args["n"] % m == 0

    h16 = triton.heuristics({"EVEN": even(16)})(K.heuristic_tuned_kernel.fn.fn)
    h64 = triton.heuristics({"EVEN": even(64)})(K.heuristic_tuned_kernel.fn.fn)
    r16, r64 = refs.kernel_ref(h16), refs.kernel_ref(h64)
    assert r16 != r64 and refs.live(r16) is h16 and refs.live(r64) is h64
    assert refs.kernel_ref(h16) == r16  # stable for the object


def test_an_unpickled_plan_finds_its_kernels_in_tritons_cache(timer):
    x = torch.randn(1000)
    opt = trident.optimize(trident.capture(program, x))
    (spec,) = [s for rid in opt.meta["trident_regions"] for s in SCMRuntime.get(rid).scm.specializations]
    back = pickle.loads(pickle.dumps(spec))
    binaries = [p.binary for p in back.launches if p.binary is not None]
    assert binaries  # kernels are compiled on the CPU machine too (sm_90 cubins)
    for b in binaries:
        refs._compiled.pop(b, None)  # as in another process
    for p in back.launches:
        if p.binary is not None:
            assert p.compiled.hash == p.binary and p.compiled.name == p.step.kernel_name


def _compile_fresh_axpy():
    """A kernel object of its own (an empty in-memory cache), compiled through Triton into the
    cache folder current now; returns its CompiledKernel, registered as specialize registers it."""
    kernel = triton.jit(K.axpy_kernel.fn)
    stand_in = PointerStandIn(torch.float32, True)
    compiled = kernel.warmup(stand_in, stand_in, stand_in, 1003, 2.5, BLOCK=128, grid=(8,))
    refs.register_compiled(compiled)
    return compiled


@pytest.mark.parametrize("compiled_when", ["before", "after"])
def test_a_kernel_is_found_on_either_side_of_inductors_cache_switch(compiled_when, tmp_path, monkeypatch):
    """Note [Where Triton's cache is]: Inductor sets TRITON_CACHE_DIR to a folder of its own the
    first time it makes a Triton kernel in a process (the user having set none). A kernel compiled
    before that switch is found after it, and one compiled after it (in another process, say) is
    found by a process that has not switched. Before the fix the suite failed here depending on
    whether an earlier test had run Inductor (test_an_unpickled_plan_... above)."""
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_MANAGER", raising=False)  # Triton's file cache
    monkeypatch.setenv("TRITON_HOME", str(tmp_path / "home"))  # Triton's default: <home>/.triton/cache
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    inductors = triton_cache_dir(0)  # what Inductor's CachingAutotuner sets TRITON_CACHE_DIR to
    assert inductors.startswith(str(tmp_path / "inductor"))

    if compiled_when == "after":
        monkeypatch.setenv("TRITON_CACHE_DIR", inductors)
    registered = dict(refs._compiled)  # its hash is K.axpy_kernel's: earlier tests' entry is put back
    compiled = _compile_fresh_axpy()
    assert os.path.dirname(next(iter(compiled.metadata_group.values()))).startswith(
        inductors if compiled_when == "after" else str(tmp_path / "home"))
    if compiled_when == "before":
        monkeypatch.setenv("TRITON_CACHE_DIR", inductors)  # the switch
    else:
        monkeypatch.delenv("TRITON_CACHE_DIR")  # a process that has not switched
    try:
        refs._compiled.pop(compiled.hash)  # as in another process
        found = refs.load_compiled(compiled.hash, "axpy_kernel")
        assert found is not None and found.hash == compiled.hash and found.asm["cubin"] == compiled.asm["cubin"]

        # an entry another user could have written is not read: nor is one nobody else wrote, once gone
        refs._compiled.pop(compiled.hash)
        elsewhere = str(tmp_path / "home" / ".triton" / "cache") if compiled_when == "before" else inductors
        os.chmod(elsewhere, 0o777)
        assert refs.load_compiled(compiled.hash, "axpy_kernel") is None
        os.chmod(elsewhere, 0o700)
        assert refs.load_compiled(compiled.hash, "axpy_kernel") is not None
        refs._compiled.pop(compiled.hash)
        shutil.rmtree(elsewhere)
        assert refs.load_compiled(compiled.hash, "axpy_kernel") is None
    finally:
        refs._compiled.clear()
        refs._compiled.update(registered)
