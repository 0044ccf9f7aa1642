"""Programmatic dependent launch (Note [Programmatic dependent launch], issue 25 item 3).

On the CPU: the PTX rule that decides which launches may start early, on hand-written PTX and
on the PTX Triton compiles for sm_90 (Trident's host-only driver compiles real cubins here);
Trident's kernels and Inductor's glue waiting first when TRIDENT_PDL asks, and generate()
through them equal to eager (the waits run as no-ops of the interpreter); user kernels get the
attribute only when their PTX waits first; what a launch writes is still known exactly. On the
GPU: a decode step's graph replays with programmatic launches equal the reference."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import trident
from tests import kernels as K
from trident import knobs, pdl

_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the device machine)")

_HEAD = """
.version 8.7
.target sm_90a
.address_size 64

.visible .entry k(
\t.param .u64 .ptr .global .align 1 k_param_0
)
.reqntid 128
{
\t.reg .pred \t%p<2>;
\t.reg .b32 \t%r<4>;
\t.reg .b64 \t%rd<4>;
\t.loc\t1 3 0
$L__func_begin0:
\tld.param.b64 \t%rd1, [k_param_0];
"""
_WAIT = "\t// begin inline asm\n\tgriddepcontrol.wait; // dummy %r1\n\t// end inline asm\n"
_LOAD = "\tld.global.b32 \t%r2, [%rd1];\n"


@pytest.mark.parametrize("body,expected", [
    (_WAIT + _LOAD + "\tret;\n", True),
    ("\tmov.u32 \t%r3, %ctaid.x;\n\tcvta.to.global.u64 \t%rd2, %rd1;\n" + _WAIT + _LOAD + "\tret;\n", True),
    ("\tld.shared.b32 \t%r2, [%rd1];\n\tld.param.b32 \t%r3, [k_param_0];\n" + _WAIT + _LOAD, True),
    ("$L__tmp0:\n" + _WAIT + _LOAD, True),  # a debug label, no branch goes there
    ("\t{\n\t.reg .b32 t;\n\tgriddepcontrol.wait; // dummy %r1\n\t}\n" + _LOAD, True),  # inline asm's own scope
    (_LOAD + _WAIT, False),  # reads before it waits
    ("\t@%p1 ld.global.b32 \t%r2, [%rd1];\n" + _WAIT, False),  # a masked load is a load
    ("\tld.b32 \t%r2, [%rd1];\n" + _WAIT, False),  # generic addressing may be global
    ("\tld.volatile.global.b32 \t%r2, [%rd1];\n" + _WAIT, False),
    ("\tst.global.b32 \t[%rd1], %r2;\n" + _WAIT, False),  # writes before it waits
    ("\tatom.global.add.u32 \t%r2, [%rd1], 1;\n" + _WAIT, False),
    ("\tcp.async.ca.shared.global [%rd2], [%rd1], 16;\n" + _WAIT, False),
    ("\t@%p1 griddepcontrol.wait;\n" + _LOAD, False),  # a predicated wait may not run
    ("\t@%p1 bra \t$L__BB0_2;\n" + _WAIT + _LOAD + "$L__BB0_2:\n\tret;\n", False),  # not in the entry block
    ("$L__BB0_1:\n" + _WAIT + _LOAD + "\t@%p1 bra \t$L__BB0_1;\n", False),  # a loop head
    ("\tcall.uni \tf, (%rd1);\n" + _WAIT, False),
    ("\tgriddepcontrol.launch_dependents;\n" + _LOAD, False),  # releases, never waits
    (_LOAD + "\tret;\n", False),
    # `::` qualifiers are not labels (an unmasked tl.load with an eviction policy, bulk copies)
    ("\tld.global.L1::evict_last.L2::cache_hint.b32 \t{ %r2 }, [ %rd1 + 0 ], %rd3;\n" + _WAIT, False),
    ("\tst.global.L1::evict_first.b32 \t[ %rd1 + 0 ], { %r2 };\n" + _WAIT, False),
    ("\tld.global.nc.L1::no_allocate.b32 \t%r2, [%rd1];\n" + _WAIT, False),
    ("\tcp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%rd2], [%rd1], 16, [%rd3];\n" + _WAIT,
     False),
    ("\t/* a comment */ ld.global.b32 \t%r2, [%rd1];\n" + _WAIT, False),  # block comments are not code
    ("\t/*\n\tgriddepcontrol.wait;\n\t*/\n" + _LOAD + _WAIT, False),
])
def test_ptx_rule(body, expected):
    assert pdl.waits_before_memory(_HEAD + body + "}\n") is expected


def test_ptx_rule_wants_one_entry():
    one = _HEAD + _WAIT + _LOAD + "}\n"
    assert pdl.waits_before_memory(one)
    assert not pdl.waits_before_memory(one + one.replace(".entry k(", ".entry k2("))
    assert not pdl.waits_before_memory("")


def _warmup(kernel, pdl_on: bool, **overrides):
    """Compile `kernel` for sm_90 (the host-only driver) with small arguments of the right kinds."""
    f = torch.zeros(4096)
    i64 = torch.zeros(64, dtype=torch.int64)
    args = {}
    for p in kernel.params:
        if p.is_constexpr:
            continue
        name = p.name
        if name.startswith("index_ptr"):
            args[name] = i64
        elif "_ptr" in name:
            args[name] = f
        elif name == "scale":
            args[name] = 0.5
        else:
            args[name] = 3  # sizes, strides, counts
    constexprs = {
        "gemv_kernel": dict(K=64, HAS_C=True, SPLIT_K=1, PRECISION="ieee", BLOCK_M=1, BLOCK_N=32, BLOCK_K=64),
        "gemv_reduce_kernel": dict(HAS_C=True, SPLIT_K=2, BLOCK=128),
        "gemv_group_kernel": dict(K=64, N0=64, N1=32, N2=48, MEMBERS=3, HAS_C=True, SPLIT_K=2, PRECISION="ieee",
                                  BLOCK_M=1, BLOCK_N=32, BLOCK_K=32, LAST_REDUCES=True),
        "strided_copy_kernel": dict(DST_CONTIGUOUS=False, OFFSETS_64=False, BLOCK=128),
        "strided_copy2_kernel": dict(DST_CONTIGUOUS=False, OFFSETS_64=False, BLOCK=128),
        "index_copy_kernel": dict(ATEN_RULES=True, WRAP_NEGATIVE=False, OFFSETS_64=False, BLOCK=128),
        "index_copy2_kernel": dict(ATEN_RULES=True, WRAP_NEGATIVE=False, OFFSETS_64=False, BLOCK=128),
        "cache_write_kernel": dict(PAIRS=2, INDEX_OFFSET=True, INCREMENT=True, ATEN_RULES=True, WRAP_NEGATIVE=False,
                                   OFFSETS_64=False, BLOCK=128, ITERS=2),
        "decode_attention_split_kernel": dict(KV_HEADS=2, G=2, LQ=1, D=16, BLOCK_M=16, BLOCK_D=16, BLOCK_N=32,
                                              HAS_MASK=True, MASK_BOOL=False, SPLITS=4, PRECISION="ieee"),
        "decode_attention_combine_kernel": dict(KV_HEADS=2, G=2, LQ=1, D=16, BLOCK_M=16, BLOCK_D=16, SPLITS=4),
    }[kernel.__name__]
    return kernel.warmup(**{**args, **constexprs, **overrides}, PDL=pdl_on, grid=(1, 1, 1))


def _trident_kernels():
    from trident.kernels import attention, copy, gemv

    return [gemv.gemv_kernel, gemv.gemv_reduce_kernel, gemv.gemv_group_kernel, copy.strided_copy_kernel, copy.strided_copy2_kernel,
            copy.index_copy_kernel, copy.index_copy2_kernel, copy.cache_write_kernel,
            attention.decode_attention_split_kernel, attention.decode_attention_combine_kernel]


@pytest.mark.parametrize("kernel", _trident_kernels(), ids=lambda k: k.__name__)
def test_trident_kernels_wait_first_when_asked(kernel):
    """Every kernel of trident/kernels/ takes PDL; with it, its sm_90 PTX waits before any global
    memory access (the rule a launch is made programmatic by) and releases its dependents."""
    ptx = _warmup(kernel, True).asm["ptx"]
    assert pdl.waits_before_memory(ptx)
    assert "griddepcontrol.launch_dependents" in ptx


def test_the_combining_split_kernel_waits_first():
    """The form of the attention split kernel the pass emits for decode (its last program
    combines: Note [The last split combines]) waits before any memory access too."""
    from trident.kernels import attention

    ptx = _warmup(attention.decode_attention_split_kernel, True, COMBINE=True,
                  count_ptr=torch.zeros(64, dtype=torch.int32), count_offset=0).asm["ptx"]
    assert pdl.waits_before_memory(ptx) and "atom.global.gpu.acq_rel.add" in ptx
    assert "griddepcontrol.launch_dependents" in ptx


def test_without_pdl_a_kernel_has_no_grid_dependency_control():
    from trident.kernels import gemv

    ptx = _warmup(gemv.gemv_kernel, False).asm["ptx"]
    assert "griddepcontrol" not in ptx and not pdl.waits_before_memory(ptx)


@triton.jit
def _waits_first_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    tl.extra.cuda.gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + offs, x * 2, mask=offs < n)


@triton.jit
def _loads_first_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.extra.cuda.gdc_wait()
    tl.store(out_ptr + offs, x + 1, mask=offs < n)


@triton.jit
def _evicting_load_first_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, eviction_policy="evict_last")  # unmasked: an unpredicated ld.global.L1::...
    tl.extra.cuda.gdc_wait()
    tl.store(out_ptr + offs, x)


def test_a_compiled_load_with_a_cache_policy_before_the_wait_is_refused():
    x = torch.zeros(128)
    ptx = _evicting_load_first_kernel.warmup(x, x, BLOCK=128, grid=(1,)).asm["ptx"]
    assert "::evict_last" in ptx
    assert not pdl.waits_before_memory(ptx)


def test_other_instructions_beside_a_grid_dependency_stay_refused_by_the_interpreter():
    @triton.jit
    def wait_and_more_kernel(x_ptr, BLOCK: tl.constexpr):
        tl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1)

    def fn(x):
        wait_and_more_kernel[(1,)](x, BLOCK=16)
        return x

    x = torch.zeros(16)
    opt = trident.optimize(trident.capture(fn, x))
    with pytest.raises(Exception, match="inline_asm not supported"):
        opt(x)


def _user_kernels(x):
    a = torch.empty_like(x)
    _waits_first_kernel[(triton.cdiv(x.numel(), 128),)](x, a, x.numel(), BLOCK=128)
    b = torch.empty_like(x)
    _loads_first_kernel[(triton.cdiv(x.numel(), 128),)](a, b, x.numel(), BLOCK=128)
    return b


def _programmatic(opt) -> dict:
    from trident.runtime import SCMRuntime

    return {launch.step.kernel_name: launch.pdl for r in opt.meta["trident_regions"]
            for s in SCMRuntime.get(r).scm.specializations for launch in s.launches}


@pytest.mark.parametrize("mode", ["", "all"])
def test_user_kernels_are_programmatic_only_where_their_ptx_waits_first(mode):
    """A user's kernel calling gdc_wait runs through Trident on the CPU (the interpreter runs the
    grid dependency instructions as no-ops) and equals its meaning; with TRIDENT_PDL the kernel
    that waits first is launched programmatically, the one that reads first is not."""
    x = torch.randn(300)
    with knobs.scope(pdl=mode):
        opt = trident.optimize(trident.capture(_user_kernels, x))
        torch.testing.assert_close(opt(x), x * 2 + 1)
    assert _programmatic(opt) == {"_waits_first_kernel": mode == "all", "_loads_first_kernel": False}
    # the same kernels optimized again with the knob the other way: their native entries follow it
    with knobs.scope(pdl="all" if mode == "" else ""):
        again = trident.optimize(trident.capture(_user_kernels, x))
        torch.testing.assert_close(again(x), x * 2 + 1)
    assert _programmatic(again) == {"_waits_first_kernel": mode == "", "_loads_first_kernel": False}
    # the interpreter's patches are gone: Triton's own functions are back
    from triton.runtime import interpreter

    assert interpreter.InterpreterBuilder.create_inline_asm.__module__ == "triton.runtime.interpreter"
    assert tl.extra.cuda.gdc_wait.__module__ == "triton.language.extra.cuda.gdc"


def test_with_wait_first_puts_the_grid_dependency_first():
    """Note [A user kernel made to wait]: the two instructions go after the entry's declarations,
    before its first instruction, and the PTX rule then proves the kernel waits first; PTX that
    holds either already, or two entries, is left as it is."""
    ptx = _HEAD + _LOAD + "\tret;\n}\n"
    assert not pdl.waits_before_memory(ptx)
    twin = pdl.with_wait_first(ptx)
    assert pdl.waits_before_memory(twin)
    body = twin[twin.index("{"):]
    # after the declarations, the debug location and the function's first label (in its debug range)
    assert body.index(".reg .b64") < body.index(".loc") < body.index("$L__func_begin0:") < body.index(
        "griddepcontrol.wait") < body.index("griddepcontrol.launch_dependents") < body.index("ld.param")
    assert twin.replace("\tgriddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;\n", "") == ptx
    assert pdl.with_wait_first(twin) == twin
    held = _HEAD + _LOAD + _WAIT + "}\n"
    assert pdl.with_wait_first(held) == held
    two = ptx + ptx.replace(".entry k(", ".entry k2(")
    assert pdl.with_wait_first(two) == two
    # a label some branch goes to (a loop head) is where the entry block ends: the wait goes before it
    loop = _HEAD.replace("$L__func_begin0:", "$L__BB0_1:") + _LOAD + "\t@%p1 bra \t$L__BB0_1;\n\tret;\n}\n"
    looped = pdl.with_wait_first(loop)
    assert looped.index("griddepcontrol.wait") < looped.index("$L__BB0_1:") and pdl.waits_before_memory(looped)
    # nothing but declarations, to the end of the text: left as it is (and the walk ends)
    bare = _HEAD.split("\t.loc")[0]
    assert pdl.with_wait_first(bare) == bare and pdl.with_wait_first(bare.rstrip("\n")) == bare.rstrip("\n")


@triton.jit
def _plain_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, x * 3, mask=offs < n)


def _with_plain_kernel(x):
    a = _user_kernels(x)
    b = torch.empty_like(a)
    _plain_kernel[(triton.cdiv(x.numel(), 128),)](a, b, x.numel(), BLOCK=128)
    return b


def _launched(opt) -> dict:
    from trident.runtime import SCMRuntime
    from trident.scm.refs import load_compiled

    return {launch.step.kernel_name: load_compiled(launch.binary, launch.step.kernel_name)
            for r in opt.meta["trident_regions"] for s in SCMRuntime.get(r).scm.specializations
            for launch in s.launches}


def _ordinary(opt) -> dict:
    """Per kernel name, the plan's `ordinary` (the user's kernel ordinary calls launch instead)."""
    from trident.runtime import SCMRuntime

    return {launch.step.kernel_name: launch.ordinary for r in opt.meta["trident_regions"]
            for s in SCMRuntime.get(r).scm.specializations for launch in s.launches}


@pytest.mark.parametrize("user_kernels", [True, False])
def test_a_user_kernel_without_grid_dependency_runs_as_its_twin(user_kernels):
    """Note [A user kernel made to wait]: with TRIDENT_PDL on, a user's kernel that holds no grid
    dependency instruction is launched as its twin (compiled with launch_pdl=True, waiting and
    releasing first) and programmatically; one holding its own instructions is left as the user
    wrote it; TRIDENT_PDL_USER_KERNELS=0 keeps ordinary ordering. Results equal the kernels'
    meaning, and Triton's own compile of the kernel (no launch_pdl) holds no grid dependency."""
    x = torch.randn(300)
    with knobs.scope(pdl="all", pdl_user_kernels=user_kernels):
        opt = trident.optimize(trident.capture(_with_plain_kernel, x))
        torch.testing.assert_close(opt(x), (x * 2 + 1) * 3)
    assert _programmatic(opt) == {"_waits_first_kernel": True, "_loads_first_kernel": False,
                                  "_plain_kernel": user_kernels}
    compiled = _launched(opt)
    twin = compiled["_plain_kernel"]
    assert twin.metadata.launch_pdl == user_kernels
    assert pdl.waits_before_memory(twin.asm["ptx"]) == user_kernels
    assert ("griddepcontrol.launch_dependents" in twin.asm["ptx"]) == user_kernels
    assert not compiled["_loads_first_kernel"].metadata.launch_pdl  # left as written
    from trident.runtime import SCMRuntime
    from trident.scm.printer import format_specialization

    printed = "\n".join(line for r in opt.meta["trident_regions"] for s in SCMRuntime.get(r).scm.specializations
                         for line in format_specialization(s))
    assert ("launch _plain_kernel" in printed and "programmatic, as its waiting twin (ordinary calls: as written)"
            in printed) == user_kernels
    assert printed.count("as its waiting twin") == int(user_kernels), printed
    explained = trident.explain(opt)
    assert ("programmatic dependent launch: " + ("2 of 3 launch(es); user kernels as their waiting twins: "
                                                 "_plain_kernel" if user_kernels else "1 of 3 launch(es)")
            + " (in recorded graphs; ordinary calls keep stream order)\n") in explained
    assert "launch _plain_kernel" in explained
    own = _plain_kernel.warmup(x, x, x.numel(), BLOCK=128, grid=(3,))
    assert "griddepcontrol" not in own.asm["ptx"]
    assert (own.hash != twin.hash) == user_kernels
    assert triton.knobs.runtime.add_stages_inspection_hook is None  # the stage hook is gone
    # Note [Programmatic edges only in graphs]: ordinary calls launch the user's own kernel, whose
    # native entry the twin's names; Trident's kernels and one left as written have none
    assert _ordinary(opt) == {"_waits_first_kernel": None, "_loads_first_kernel": None,
                              "_plain_kernel": own.hash if user_kernels else None}
    from trident.runtime import native

    entries = {launch.step.kernel_name: native.register_launch(launch) for r in opt.meta["trident_regions"]
               for s in SCMRuntime.get(r).scm.specializations for launch in s.launches}
    ordinary = {name: native.C.kernel_ordinary(h) for name, h in entries.items()}
    assert (ordinary.pop("_plain_kernel") >= 0) == user_kernels and set(ordinary.values()) == {-1}, ordinary
    with pytest.raises(RuntimeError, match="cannot stand for"):  # not itself, nor another twin's stand-in
        native.C.set_kernel_ordinary(entries["_plain_kernel"], entries["_plain_kernel"])


def test_the_twin_and_the_users_launch_pdl_compile_never_share_an_entry():
    """Note [A user kernel made to wait]: the twin's options carry ir_override=pdl.TWIN, so the
    user's own `launch_pdl=True` compile of the kernel -- before or after Trident's -- is the
    kernel as written (no grid dependency added), and Trident's twin is rewritten whatever the
    user compiled first."""

    @triton.jit
    def users_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) - 1, mask=offs < n)

    def fn(x):
        out = torch.empty_like(x)
        users_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)
        return out

    x = torch.randn(300)
    before = users_kernel.warmup(x, x, x.numel(), BLOCK=128, launch_pdl=True, grid=(3,))
    with knobs.scope(pdl="all"):
        opt = trident.optimize(trident.capture(fn, x))
        torch.testing.assert_close(opt(x), x - 1)
    after = users_kernel.warmup(x, x, x.numel(), BLOCK=128, launch_pdl=True, grid=(3,))
    twin = _launched(opt)["users_kernel"]
    assert _programmatic(opt) == {"users_kernel": True} and twin.metadata.ir_override == pdl.TWIN
    assert pdl.waits_before_memory(twin.asm["ptx"])
    for own in (before, after):
        assert "griddepcontrol" not in own.asm["ptx"] and own.hash != twin.hash


def test_a_twin_entry_that_does_not_wait_keeps_ordinary_ordering():
    """An entry under the twin's key that does not wait first (compiled without Trident's stage
    hook: anyone can pass ir_override=pdl.TWIN) is not launched programmatically: the kernel as
    the user compiles it runs in ordinary order."""

    @triton.jit
    def planted_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    def fn(x):
        out = torch.empty_like(x)
        planted_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)
        return out

    x = torch.randn(300)
    planted_kernel.warmup(x, x, x.numel(), BLOCK=128, launch_pdl=True, ir_override=pdl.TWIN, grid=(3,))
    with knobs.scope(pdl="all"):
        opt = trident.optimize(trident.capture(fn, x))
        torch.testing.assert_close(opt(x), x * 2)
    assert _programmatic(opt) == {"planted_kernel": False}
    assert _launched(opt)["planted_kernel"].metadata.ir_override is None


@pytest.mark.parametrize("mode", ["", "all"])
def test_a_users_launch_pdl_is_launched_as_triton_launches_it(mode):
    """A launch the user made with launch_pdl=True (their promise: Triton launches it with the
    attribute) is programmatic with PDL off or on, as the user compiled it (no twin)."""

    def fn(x):
        out = torch.empty_like(x)
        _loads_first_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128, launch_pdl=True)
        return out

    x = torch.randn(300)
    with knobs.scope(pdl=mode):
        opt = trident.optimize(trident.capture(fn, x))
        torch.testing.assert_close(opt(x), x + 1)
    assert _programmatic(opt) == {"_loads_first_kernel": True}
    compiled = _launched(opt)["_loads_first_kernel"]
    assert compiled.metadata.launch_pdl and compiled.metadata.ir_override is None


_RESTORE = """
import json, sys
import torch, trident
from trident import knobs
from trident.optimize import _regions
from tests.test_pdl import _launched, _ordinary, _programmatic, _with_plain_kernel

x = torch.randn(300)
with knobs.scope(pdl="all"):
    opt = trident.optimize(trident.capture(_with_plain_kernel, x))
    torch.testing.assert_close(opt(x), (x * 2 + 1) * 3)
print(json.dumps({"programmatic": _programmatic(opt), "twin": _launched(opt)["_plain_kernel"].hash,
                  "ordinary": _ordinary(opt)["_plain_kernel"],
                  "restored": [bool(c.get("restored")) for rt in _regions(opt) for c in rt.build_costs]}))
"""


def test_a_restored_twin_is_proven_again(tmp_path):
    """A plan record names the twin by Triton's hash; the second process launches it from
    Triton's cache programmatically, without compiling, and only after proving its PTX waits
    first: with the entry's PTX changed to not wait (a planted entry), the restored launch keeps
    ordinary ordering."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TRIDENT_CACHE_DIR=str(tmp_path / "plans"), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               TRITON_HOME=str(tmp_path / "home"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    env.pop("TRIDENT_LOG", None)

    def run():
        proc = subprocess.run([sys.executable, "-c", _RESTORE], cwd=root, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first = run()
    assert first["restored"] == [False] and first["programmatic"]["_plain_kernel"]
    second = run()
    assert second["restored"] == [True] and second["programmatic"] == first["programmatic"]
    assert second["twin"] == first["twin"]
    # the user's own kernel for ordinary calls, from Triton's cache (Note [Programmatic edges only in graphs])
    assert first["ordinary"] not in (None, first["twin"]) and second["ordinary"] == first["ordinary"]
    pair = "\tgriddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;\n"  # with_wait_first's
    twins = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "triton") for f in fs
             if f.endswith(".ptx") and pair in open(os.path.join(d, f)).read()]
    assert len(twins) == 1, twins
    with open(twins[0]) as f:
        text = f.read()
    with open(twins[0], "w") as f:
        f.write(text.replace(pair, ""))
    third = run()
    assert third["restored"] == [True] and third["programmatic"] == {**first["programmatic"], "_plain_kernel": False}
    assert third["ordinary"] is None  # the planted entry is launched as the kernel it is, everywhere


def test_other_inline_assembly_stays_refused_by_the_interpreter():
    @triton.jit
    def asm_kernel(x_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs)
        y = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
        tl.store(x_ptr + offs, y)

    def fn(x):
        asm_kernel[(1,)](x, BLOCK=16)
        return x

    x = torch.zeros(16, dtype=torch.int32)
    opt = trident.optimize(trident.capture(fn, x))
    with pytest.raises(Exception, match="inline_asm not supported"):
        opt(x)


def test_written_params_of_programmatic_launches_stay_exact():
    """torch's analysis of what a launch writes refuses inline PTX: Trident's kernels are
    analysed without their grid dependency instructions, Inductor's by its naming (in_ptr: read),
    so a programmatic copy still writes only its destination."""
    from tests.passes.test_fuse_glue import _args, _rms
    from trident.runtime import SCMRuntime

    def copy_then_add(x):
        y = x.t().contiguous().reshape(-1)  # a clone: strided_copy_kernel
        return K.axpy(y, y)

    x = torch.randn(8, 16)
    with knobs.scope(pdl="all", triton_copies="all"):
        opt = trident.optimize(trident.capture(copy_then_add, x))
        torch.testing.assert_close(opt(x), copy_then_add(x))
    steps = {s.kernel_name: s for r in opt.meta["trident_regions"] for s in SCMRuntime.get(r).program.launches}
    assert steps["strided_copy_kernel"].args["PDL"] is True and steps["strided_copy_kernel"].writes == ("dst_ptr",)
    assert _programmatic(opt)["strided_copy_kernel"]

    args = _args()
    with knobs.scope(pdl="all", fuse_glue="all"):
        opt = trident.optimize(trident.capture(_rms, *args))
        for got, want in zip(opt(*args), _rms(*args)):
            torch.testing.assert_close(got, want)
    glue = [s for r in opt.meta["trident_regions"] for s in SCMRuntime.get(r).program.launches
            if s.kernel_name.startswith("triton_")]
    assert glue and all(s.writes and all(w.startswith("out_ptr") for w in s.writes) for s in glue)
    assert all(_programmatic(opt)[s.kernel_name] for s in glue)


def test_glue_naming_rule_agrees_with_torchs_analysis():
    """Without PDL torch's TTIR analysis reads Inductor's kernels: it finds what the naming rule
    says (every in_ptr read only, every other tensor written) on random glue chains."""
    from torch._higher_order_ops import triton_kernel_wrap as tkw

    from tests.passes.test_fuse_glue import _args, _rms
    from trident.passes.outline_regions import _glue_writes

    with knobs.scope(fuse_glue="all"):
        opt = trident.optimize(trident.capture(_rms, *_args()))
    checked = 0
    from trident.runtime import SCMRuntime

    for r in opt.meta["trident_regions"]:
        gm = SCMRuntime.get(r).program.graph_module
        for node in gm.graph.nodes:
            if node.meta.get("glue_kernel") is None:
                continue
            kwargs = {k: (v.meta["val"] if isinstance(v, torch.fx.Node) else v) for k, v in node.kwargs["kwargs"].items()}
            torch_says = tkw.get_mutated_tensors(node.kwargs["kernel_idx"], node.kwargs["constant_args_idx"], kwargs,
                                                 node.kwargs["tma_descriptor_metadata"])
            assert sorted(torch_says) == sorted(_glue_writes(kwargs)), (torch_says, kwargs.keys())
            checked += 1
    assert checked >= 1


def test_pdl_knob_spellings():
    with knobs.scope(pdl="on"):
        assert knobs.pdl() == "cuda"
    with knobs.scope(pdl="off"):
        assert knobs.pdl() == ""
    assert knobs.pdl() == "cuda"  # default on for sm_90+ CUDA: measured faster with user kernels' twins
    assert knobs.pdl_user_kernels()
    with knobs.scope(pdl="cuda"):
        assert not pdl.wanted("cpu")
    with knobs.scope(pdl="all"):
        assert pdl.wanted("cpu")


def test_a_rocm_device_takes_no_programmatic_launch(monkeypatch):
    """PDL is on by default for CUDA devices: a ROCm build's "cuda" device (torch.version.hip set,
    torch.version.cuda None, a capability that may read 9.x) has no grid dependency instructions
    and is never made programmatic, nor are Trident's kernels asked to wait there."""
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 4))
    assert pdl.enabled() and not pdl.wanted("cuda:0") and not pdl.twins_wanted("cuda:0")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert pdl.wanted("cuda:0")


def test_cuda_before_12_3_takes_no_programmatic_launch(monkeypatch):
    """Programmatic edges in captured graphs need CUDA 12.3: below it nothing is made
    programmatic, neither Trident's kernels nor a user kernel that waits first."""
    monkeypatch.setattr(torch.version, "cuda", "12.2")
    x = torch.randn(300)
    with knobs.scope(pdl="all"):
        assert not pdl.enabled() and not pdl.wanted("cpu")
        opt = trident.optimize(trident.capture(_user_kernels, x))
        torch.testing.assert_close(opt(x), x * 2 + 1)
    assert _programmatic(opt) == {"_waits_first_kernel": False, "_loads_first_kernel": False}
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    with knobs.scope(pdl="all"):
        assert pdl.enabled()


def test_generate_with_every_generated_kernel_programmatic(monkeypatch):
    """HF generate() (tiny Llama, StaticCache) with every Trident kernel and the fused glue
    waiting first: tokens equal eager's, and every launch of Trident's and Inductor's kernels is
    programmatic."""
    from tests.frontends.test_generate import PROMPT
    from tests.test_hf import _model
    from trident.passes import choose_matmuls as CM

    torch._dynamo.reset()
    _, model = _model("llama", "plain", monkeypatch)
    # 6 tokens: the first call runs its prefill and first step eagerly, four through the decode capture; each
    # token runs ~40 interpreted launches (20 s a call at 12 tokens)
    kw = dict(max_new_tokens=6, do_sample=False, cache_implementation="static")
    CM.set_timer(lambda name, shape, cfg: 1.0 if name == "aten" else 0.5)  # the GEMV wins
    try:
        with torch.no_grad():
            want = model.generate(torch.tensor(PROMPT), **kw)
            with knobs.scope(pdl="all", fuse_glue="all", triton_copies="all", decode_attention="all",
                             decode_matmuls="all"):
                model.forward = trident.compile(model.forward)
                for _ in range(2):
                    assert torch.equal(model.generate(torch.tensor(PROMPT), **kw), want)
    finally:
        CM.set_timer(None)
    decode = max(model.forward.captures.values(),
                 key=lambda opt: sum(v["hits"] for v in trident.cache_info(opt).values()))
    launched = _programmatic(decode)
    generated = {k: v for k, v in launched.items() if k.startswith(("triton_", "gemv", "strided_copy", "index_copy",
                                                                     "cache_write", "decode_attention"))}
    assert any(k.startswith("triton_") for k in generated) and any(k.startswith("gemv") for k in generated), launched
    assert all(generated.values()), generated
    torch._dynamo.reset()


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_generate_with_liger_kernels_as_waiting_twins(cache, monkeypatch):
    """HF generate() of a tiny Llama with Liger-Kernel's Triton kernels patched in (rms_norm, rope,
    swiglu: user kernels without grid dependency instructions), both cache kinds, TRIDENT_PDL=all:
    tokens equal eager's and every launch is programmatic, Liger's kernels as their waiting twins
    (in the symbolic pieces of a DynamicCache step too)."""
    from tests.frontends.test_generate import PROMPT
    from tests.test_hf import _model

    torch._dynamo.reset()
    _, model = _model("llama", "liger", monkeypatch)
    kw = dict(max_new_tokens=4, do_sample=False, **({"cache_implementation": "static"} if cache == "static" else {}))
    with torch.no_grad():
        want = model.generate(torch.tensor(PROMPT), **kw)
        with knobs.scope(pdl="all"):
            model.forward = trident.compile(model.forward)
            for _ in range(2):
                assert torch.equal(model.generate(torch.tensor(PROMPT), **kw), want)
    decode = max(model.forward.captures.values(),
                 key=lambda opt: sum(v["hits"] for v in trident.cache_info(opt).values()))
    from trident.runtime import SCMRuntime

    launched = _programmatic(decode)
    assert launched and all(launched.values()), launched
    n = sum(len(s.launches) for r in decode.meta["trident_regions"] for s in SCMRuntime.get(r).scm.specializations)
    assert (f"programmatic dependent launch: {n} of {n} launch(es); user kernels as their waiting twins: "
            "_rms_norm_forward_kernel, _swiglu_forward_kernel, _triton_rope") in trident.explain(decode)
    torch._dynamo.reset()


@_CUDA
@pytest.mark.parametrize("dtype", [torch.float32])
def test_programmatic_replays_equal_the_reference_on_cuda(dtype):
    """On the GPU with TRIDENT_PDL=cuda: the decode step's copies, cache writes and glue launch
    programmatically inside graph replays, and every step equals the reference."""
    import functools

    from tests.decode_model import Config, check_steps_against_reference, decode_step, make_weights

    cfg = Config(layers=2)
    weights, cos, sin = make_weights(cfg, "cuda")
    from tests.decode_model import make_caches

    caches = make_caches(cfg, "cuda")
    x, pos = torch.randn(1, cfg.hidden, device="cuda"), torch.tensor([0], device="cuda")
    with knobs.scope(pdl="cuda", fuse_glue="cuda"):
        opt = trident.optimize(trident.capture(functools.partial(decode_step, cfg), x, pos, cos, sin, *caches, *weights))
        check_steps_against_reference(cfg, opt, weights, cos, sin, range(12), device="cuda")
    assert any(_programmatic(opt).values()), _programmatic(opt)
    assert sum(v["graph_replays"] for v in trident.cache_info(opt).values()) > 0


@triton.jit
def _scale_shift_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, x * 1.5 - 0.25, mask=offs < n)


@triton.jit
def _reverse_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # reads what another program of the previous kernel wrote: a race would show
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + (n - 1 - offs), mask=offs < n)
    tl.store(out_ptr + offs, x + 1, mask=offs < n)


def _user_chain(x):
    for _ in range(12):
        y = torch.empty_like(x)
        _scale_shift_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        x = torch.empty_like(y)
        _reverse_kernel[(triton.cdiv(y.numel(), 256),)](y, x, y.numel(), BLOCK=256)
    return x


@_CUDA
def test_waiting_twins_replay_equal_eager_on_cuda():
    """Note [A user kernel made to wait] on the GPU: a chain of user kernels, each reading what
    other programs of the one before wrote, launched as programmatic twins inside graph replays,
    equals eager on fresh inputs every call."""
    x = torch.randn(1 << 20, device="cuda")
    with knobs.scope(pdl="cuda"):
        opt = trident.optimize(trident.capture(_user_chain, x))
        for _ in range(20):
            x = torch.randn(1 << 20, device="cuda")
            torch.testing.assert_close(opt(x), _user_chain(x))
    assert all(_programmatic(opt).values()), _programmatic(opt)
    assert sum(v["graph_replays"] for v in trident.cache_info(opt).values()) > 0


@_CUDA
def test_ordinary_calls_launch_the_users_kernels_recordings_their_twins_on_cuda():
    """Note [Programmatic edges only in graphs] on the GPU: with graphs off every call is ordinary
    and launches the user's kernels as written (their native entries count the launches, the
    twins' none); with graphs on, the recording launches the twins and the replays equal eager."""
    from trident.runtime import SCMRuntime, native

    x = torch.randn(1 << 16, device="cuda")
    for graphs in ("", "cuda"):
        with knobs.scope(pdl="cuda", graphs=graphs):
            opt = trident.optimize(trident.capture(_user_chain, x))
            plans = [launch for r in opt.meta["trident_regions"] for s in SCMRuntime.get(r).scm.specializations
                     for launch in s.launches]
            twins = sorted({native.register_launch(launch) for launch in plans})
            owns = sorted({native.C.kernel_ordinary(h) for h in twins})
            assert -1 not in owns and not set(owns) & set(twins), (twins, owns)
            with trident.profile():
                for _ in range(6):
                    x = torch.randn(1 << 16, device="cuda")
                    torch.testing.assert_close(opt(x), _user_chain(x))
            twin_launches = sum(native.C.kernel_launches(h) for h in twins)
            own_launches = sum(native.C.kernel_launches(h) for h in owns)
        replays = sum(v["graph_replays"] for v in trident.cache_info(opt).values())
        assert own_launches > 0, graphs
        assert (twin_launches > 0 and replays > 0) if graphs else (twin_launches == 0 and replays == 0), \
            (graphs, twin_launches, replays)


@triton.jit
def _doubling_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def _doubled(x):
    out = torch.empty_like(x)
    _doubling_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)
    return out


def test_a_kernel_as_written_that_cannot_stand_for_its_twin_leaves_the_twin_every_call(monkeypatch, caplog):
    """Note [Programmatic edges only in graphs]: where the native table refuses the user's kernel
    as the twin's stand-in, the region still plans and runs (the twin serves ordinary calls too),
    and the log says why."""
    import logging

    from trident.runtime import native

    def refuse(handle, own):
        raise RuntimeError("their parameters, warps or CTAs differ")

    monkeypatch.setattr(native.C, "set_kernel_ordinary", refuse)
    x = torch.randn(300)
    with knobs.scope(pdl="all"), caplog.at_level(logging.WARNING, logger="trident.misses"):
        opt = trident.optimize(trident.capture(_doubled, x))
        torch.testing.assert_close(opt(x), x * 2)
    assert _ordinary(opt)["_doubling_kernel"] is not None
    assert "cannot stand for its waiting twin in ordinary calls" in caplog.text, caplog.text
