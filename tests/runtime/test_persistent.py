"""Note [Persistent plans]: a second process restores every specialization from TRIDENT_CACHE_DIR
(no planning, no autotuner benchmark, no Triton compile: Triton's cache dir gains no file; no
MLIR build: host programs load from the shared libraries the first process wrote); truncated,
corrupt and foreign-version entries and tampered libraries are rejected with a log line and
rebuilt."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = r"""
import functools, json, sys, torch
import torch._higher_order_ops.triton_kernel_wrap as tkw
import triton.runtime.cache
import trident
analyses = []
# torch's TTIR analysis of what a launch writes (renamed after torch 2.11)
_name = "identify_accessed_tensors" if hasattr(tkw, "identify_accessed_tensors") else "identify_mutated_tensors"
_identify = getattr(tkw, _name)
setattr(tkw, _name, lambda *a, **k: analyses.append(1) or _identify(*a, **k))
from tests import kernels as K
from tests.decode_model import Config, decode_step, make_caches, make_weights, misaligned
from trident.optimize import _regions

torch.manual_seed(0)
dev = sys.argv[1]
cfg = Config()
weights, cos, sin = make_weights(cfg, dev)
caches = make_caches(cfg, dev)
x, pos = torch.randn(1, cfg.hidden, device=dev), torch.tensor([1], device=dev)
decode = trident.optimize(trident.capture(functools.partial(decode_step, cfg), x, pos, cos, sin, *caches, *weights))
v = torch.randn(3000, device=dev)
tuned = trident.optimize(trident.capture(K.tuned_scale, v))
outs = [decode(x, pos, cos, sin, *caches, *weights), decode(misaligned(x), pos, cos, sin, *caches, *weights), tuned(v)]
report = {"sums": [float(o.double().sum()) for o in outs], "regions": [], "ttir_analyses": len(analyses),
          "triton_key": triton.runtime.cache.triton_key.cache_info().currsize}
for opt in (decode, tuned):
    for rt in _regions(opt):
        report["regions"].append({"restored": [bool(c.get("restored")) for c in rt.build_costs],
                                  "native_restored": [bool(c.get("native_restored")) for c in rt.build_costs],
                                  "misses": rt.stats()["misses"]})
print(json.dumps(report))
"""


def _files(folder):
    return {os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs}


def _first_records(root):
    """Per region folder, the record of its specialization 0 (Note [Records named by what they serve])."""
    records = [p for p in _files(root) if os.path.basename(p).startswith("spec-") and p.endswith(".json")]
    return sorted(p for p in records if json.load(open(p))["payload"]["index"] == 0)


@pytest.fixture
def dirs(tmp_path):
    # Triton's default cache and Inductor's, where refs.load_compiled also looks (Note [Where
    # Triton's cache is]), are the test's own too: a kernel gone from TRITON_CACHE_DIR is gone
    return {"TRIDENT_CACHE_DIR": str(tmp_path / "plans" / "trident"), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
            "TRITON_HOME": str(tmp_path / "home"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}


def _run(dirs, device="cpu"):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **dirs)
    env.pop("TRIDENT_LOG", None)
    proc = subprocess.run([sys.executable, "-c", CHILD, device], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_second_process_restores_every_specialization(dirs, device):
    """On the GPU too (issue 23: compute-sanitizer runs over this test there): the second process
    launches restored cubins and host programs only."""
    first, _ = _run(dirs, device)
    built = [r["restored"] for r in first["regions"]]
    if device == "cpu":
        assert built == [[False, False], [False]]  # built: decode 2, tuned 1
    else:  # CUDA's default passes (fused glue, decode matmuls) may cut the regions otherwise
        assert len(built) >= 2 and all(n == [False] * len(n) for n in built) and [False, False] in built
    root = dirs["TRIDENT_CACHE_DIR"]
    assert os.stat(root).st_mode & 0o777 == 0o700
    for folder, _, names in os.walk(root):  # folders 0700, files (records, libraries, analyses) 0600
        assert os.stat(folder).st_mode & 0o777 == 0o700, folder
        for name in names:
            assert os.stat(os.path.join(folder, name)).st_mode & 0o777 == 0o600, name
    triton_files = _files(dirs["TRITON_CACHE_DIR"])
    second, _ = _run(dirs, device)
    every = [[True] * len(n) for n in built]
    assert [r["restored"] for r in second["regions"]] == every
    # no MLIR build: each host program is the shared library the first process wrote
    assert [r["native_restored"] for r in second["regions"]] == every
    assert [r["misses"] for r in second["regions"]] == [0] * len(built)  # the misaligned call hit spec 1
    assert second["sums"] == first["sums"]
    assert _files(dirs["TRITON_CACHE_DIR"]) == triton_files  # Triton compiled nothing
    # Note [Cached analyses], refs.load_compiled: no TTIR analysis of what a launch writes, and
    # Triton's compiler never entered (its per-process key of its own installation not computed)
    assert first["ttir_analyses"] > 0 and first["triton_key"] == 1
    assert second["ttir_analyses"] == 0 and second["triton_key"] == 0
    assert any(os.sep + "written" + os.sep in f for f in _files(root))


def test_kernels_gone_from_tritons_cache_are_compiled_again(dirs):
    """refs.load_compiled reads a recorded kernel from Triton's cache by its hash; with Triton's
    cache emptied the restore compiles it through Triton (and gets the same binary)."""
    import shutil

    first, _ = _run(dirs)
    shutil.rmtree(dirs["TRITON_CACHE_DIR"])
    second, _ = _run(dirs)
    assert [r["restored"] for r in second["regions"]] == [[True, True], [True]]
    assert second["triton_key"] == 1 and second["sums"] == first["sums"]
    assert _files(dirs["TRITON_CACHE_DIR"])  # compiled anew


@pytest.mark.parametrize("damage", ["truncated", "not_utf8", "corrupt", "foreign", "library"])
def test_damaged_entries_are_rejected_and_rebuilt(dirs, damage):
    first, _ = _run(dirs)
    entries = _first_records(dirs["TRIDENT_CACHE_DIR"])
    assert len(entries) == 2  # one folder per region
    if damage == "library":  # the host programs' shared libraries, not the plans
        for path in sorted(p for p in _files(dirs["TRIDENT_CACHE_DIR"]) if p.endswith(".so")):
            with open(path, "r+b") as f:
                f.seek(100)
                f.write(b"\x00\x01\x02\x03")
        second, stderr = _run(dirs)
        assert stderr.count("rejected: its hash does not match") == 3, stderr[-3000:]
        assert [r["restored"] for r in second["regions"]] == [[True, True], [True]]  # plans still good
        assert [r["native_restored"] for r in second["regions"]] == [[False, False], [False]]  # rebuilt
        assert second["sums"] == first["sums"]
        third, stderr = _run(dirs)  # the rebuilt libraries were written anew
        assert "rejected" not in stderr
        assert [r["native_restored"] for r in third["regions"]] == [[True, True], [True]]
        return
    for path in entries:
        if damage == "not_utf8":
            with open(path, "wb") as f:
                f.write(b"\xff\xfe{not json")
            continue
        text = open(path).read()
        if damage == "truncated":
            text = text[: len(text) // 2]
        else:
            entry = json.loads(text)
            if damage == "corrupt":
                entry["payload"]["guards"][0]["facts"]["sizes"] = [7]
            else:
                entry["versions"]["torch"] = "0.0.1"
            text = json.dumps(entry)
        with open(path, "w") as f:
            f.write(text)
    second, stderr = _run(dirs)
    assert stderr.count("rejected") == 2, stderr[-3000:]
    # each region's specialization 0 is rebuilt; the decode region's other record, intact, is
    # restored in its place (Note [Records named by what they serve]: a rejected record is skipped)
    assert [r["restored"] for r in second["regions"]] == [[True, False], [False]]
    assert second["sums"] == first["sums"]
    third, stderr = _run(dirs)  # the rebuilt entries were written anew
    assert "rejected" not in stderr
    assert [r["restored"] for r in third["regions"]] == [[True, True], [True]]


@pytest.mark.parametrize("attack", ["moved", "forged", "renamed", "open_root", "symlink"])
def test_entries_others_could_plant_are_never_restored(dirs, attack):
    """Note [Open once, check the descriptor] (issue 23): an entry of another region copied into a
    region's folder is foreign (the key it was filed under is in the entry and its hash); a record
    whose guards name another layout is refused, hash or not; nothing is read from a cache whose
    root anyone may write, nor through a symbolic link. Each is built again; results equal."""
    from trident.runtime.persistent import PlanCache, _digest

    first, _ = _run(dirs)
    root = dirs["TRIDENT_CACHE_DIR"]
    decode_entry, tuned_entry = sorted(_first_records(root),
                                       key=lambda p: len(json.load(open(p))["payload"]["guards"]))[::-1]
    expect = "rejected"
    if attack == "moved":  # the decode region's valid entry over the other region's one
        with open(tuned_entry, "w") as f:
            f.write(open(decode_entry).read())
        expect = "filed under another region's key"
    elif attack == "forged":  # smaller guards, hash recomputed with the right key, named as they say
        entry = json.load(open(tuned_entry))
        entry["payload"]["guards"][0]["facts"]["sizes"] = [8]
        entry["payload"]["guards"][0]["facts"]["strides"] = [1]
        entry["sha256"] = _digest(entry["payload"], entry.get("native"), entry["key"])
        os.remove(tuned_entry)
        with open(os.path.join(os.path.dirname(tuned_entry), PlanCache.record_name(entry["payload"])), "w") as f:
            json.dump(entry, f)
        expect = "not the captured layout"
    elif attack == "renamed":  # a valid entry of the region under another specialization's name
        os.replace(tuned_entry, os.path.join(os.path.dirname(tuned_entry), "spec-" + "0" * 24 + ".json"))
        expect = "filed under another specialization's name"
    elif attack == "open_root":
        os.chmod(root, 0o777)
        expect = "not private to this user"
    else:
        elsewhere = tuned_entry + ".copy"
        os.replace(tuned_entry, elsewhere)
        os.symlink(elsewhere, tuned_entry)
        expect = "not read"
    second, stderr = _run(dirs)
    assert expect in stderr, stderr[-3000:]
    restored = [r["restored"][0] for r in second["regions"]]
    assert restored == ([False, False] if attack == "open_root" else [True, False]), restored
    assert second["sums"] == first["sums"]


def test_entries_of_another_build_are_foreign(dirs):
    """The key covers Trident's own code (a digest of its sources and extension) and the knobs
    that shape plans: entries written under other plan knobs are rejected, not restored."""
    from trident.runtime.persistent import versions

    assert len(versions([])["trident_build"]) == 64
    first, _ = _run(dirs)
    second, stderr = _run({**dirs, "TRIDENT_NATIVE_PATHS": ""})  # the A/B knob: other plans
    assert [r["restored"][0] for r in second["regions"]] == [False, False]
    assert second["sums"] == first["sums"]


CHILD_SYMBOLIC = r"""
import json, torch
import trident
from tests import kernels as K
from trident.optimize import _regions

torch.manual_seed(0)
opt = trident.optimize(trident.capture(K.two_kernels, torch.randn(1000), torch.randn(1000), dynamic=True))
sums = []
for n in (1000, 1024, 777, 4096):  # two Triton keys: n % 16 == 0 or not
    x, y = torch.randn(n), torch.randn(n)
    sums.append(float(opt(x, y).double().sum()))
(rt,) = _regions(opt)
print(json.dumps({"sums": sums, "restored": [bool(c.get("restored")) for c in rt.build_costs],
                  "native_restored": [bool(c.get("native_restored")) for c in rt.build_costs],
                  "misses": rt.stats()["misses"]}))
"""


def test_symbolic_region_warm_starts(dirs):
    """Note [Symbolic sizes] plans are records too: a second process restores both
    specializations of a symbolic region (their size guards re-derived and checked against the
    records) and serves every size with no miss, no Triton compile."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **dirs)
    env.pop("TRIDENT_LOG", None)

    def run():
        proc = subprocess.run([sys.executable, "-c", CHILD_SYMBOLIC], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first = run()
    assert first["restored"] == [False, False] and first["misses"] == 1
    triton_files = _files(dirs["TRITON_CACHE_DIR"])
    second = run()
    assert second["restored"] == [True, True] and second["native_restored"] == [True, True]
    assert second["misses"] == 0 and second["sums"] == first["sums"]
    assert _files(dirs["TRITON_CACHE_DIR"]) == triton_files


CHILD_WRITER = r"""
import json, sys, torch
import trident
from tests import kernels as K
from trident.optimize import _regions

torch.manual_seed(0)
x, y = torch.randn(1000), torch.randn(1000)
opt = trident.optimize(trident.capture(K.axpy, x, y))
# a view whose data_ptr % 16 is 4, and half precision: two more specializations
calls = {"aligned": (x, y), "shift4": (torch.randn(1001)[1:], y), "half": (x.half(), y.half())}
sums = {name: float(opt(*calls[name]).double().sum()) for name in sys.argv[1].split(",")}
(rt,) = _regions(opt)
print(json.dumps({"sums": sums, "restored": [bool(c.get("restored")) for c in rt.build_costs],
                  "misses": rt.stats()["misses"]}))
"""


def test_writers_starting_cold_keep_each_others_records(dirs):
    """Note [Records named by what they serve]: two processes start on one cold folder and each
    plans its own specialization 1 (a misaligned view; half precision), the first renaming its files
    in last. With records named by index the first's spec1 replaced the second's. Every record
    is kept, once: a third process restores all three specializations and serves every call
    with no miss; writers of the same specialization (0, both) write one file."""
    import shutil

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **dirs)
    env.pop("TRIDENT_LOG", None)
    root = dirs["TRIDENT_CACHE_DIR"]

    def run(calls):
        proc = subprocess.run([sys.executable, "-c", CHILD_WRITER, calls], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def records():
        return sorted(p for p in _files(root) if os.path.basename(p).startswith("spec-"))

    first = run("shift4")
    folder = os.path.dirname(records()[0])
    late = folder + ".late"  # the first writer's files, renamed in after the second has started cold
    shutil.move(folder, late)
    second = run("half")
    assert first["restored"] == second["restored"] == [False, False]  # both cold: 0 captured, 1 the call's
    for name in os.listdir(late):
        os.replace(os.path.join(late, name), os.path.join(folder, name))
    assert len(records()) == 3
    third = run("aligned,shift4,half")
    assert third["restored"] == [True, True, True] and third["misses"] == 0
    assert [third["sums"][k] for k in ("shift4", "half")] == [first["sums"]["shift4"], second["sums"]["half"]]
    run("half,aligned")
    assert len(records()) == 3  # nothing duplicated


def test_host_libraries_no_record_names_are_removed(dirs):
    """A record rewritten with a rebuilt host library leaves its old library behind: the next
    write removes libraries no record names, except those written in the last minute (another
    process may be about to name it); the named ones stay and still load."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **dirs)
    env.pop("TRIDENT_LOG", None)

    def run(calls):
        proc = subprocess.run([sys.executable, "-c", CHILD_WRITER, calls], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    run("aligned")
    (named,) = [p for p in _files(dirs["TRIDENT_CACHE_DIR"]) if p.endswith(".so")]
    folder = os.path.dirname(named)
    old, fresh = os.path.join(folder, "host." + "a" * 24 + ".so"), os.path.join(folder, "host." + "b" * 24 + ".so")
    for path in (old, fresh):
        with open(path, "wb") as f:
            f.write(b"\x7fELF not named by any record")
        os.chmod(path, 0o600)
    os.utime(old, (1, 1))
    assert run("shift4")["restored"] == [True, False]  # a miss writes a record
    libraries = {os.path.basename(p) for p in _files(folder) if p.endswith(".so")}
    assert os.path.basename(old) not in libraries and {os.path.basename(fresh), os.path.basename(named)} <= libraries
    third = run("aligned,shift4")
    assert third["restored"] == [True, True] and third["misses"] == 0
