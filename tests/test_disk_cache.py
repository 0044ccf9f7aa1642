"""Note [Cached analyses]: answers kept in TRIDENT_CACHE_DIR save work and never decide a result:
entries that do not parse, name another key or fail the caller's check are ignored; the TTIR
write analysis of a launch is read back instead of computed, and a damaged entry is recomputed."""

from __future__ import annotations

import importlib
import os
import stat

import torch

import trident
from tests import kernels as K
from trident import disk_cache, knobs
outline_regions = importlib.import_module("trident.passes.outline_regions")  # the module, not the pass


def _entries(root):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".json"))


def test_round_trip_and_damaged_entries(tmp_path):
    with knobs.scope(cache_dir=str(tmp_path / "c")):
        key = disk_cache.key_of("k", 1)
        assert disk_cache.load("facts", key, lambda v: True) is None
        disk_cache.store("facts", key, ["a", "b"])
        (path,) = _entries(tmp_path)
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert disk_cache.load("facts", key, lambda v: True) == ["a", "b"]
        assert disk_cache.load("facts", key, lambda v: v == ["x"]) is None  # the caller's check
        assert disk_cache.load("facts", disk_cache.key_of("other"), lambda v: True) is None
        with open(path, "w") as f:
            f.write('{"key": "' + key[:10])  # truncated
        assert disk_cache.load("facts", key, lambda v: True) is None
        with open(path, "w") as f:
            f.write('{"key": "another", "value": ["a"]}')  # another key's entry under this name
        assert disk_cache.load("facts", key, lambda v: True) is None
    assert disk_cache.load("facts", key, lambda v: True) is None  # no TRIDENT_CACHE_DIR: nothing


def test_measured_choices_are_kept_in_the_tuning_dir_when_no_cache_dir_is_set(tmp_path):
    """Note [Kept measurements]: without TRIDENT_CACHE_DIR the measured choices (and only they) go
    to TRIDENT_TUNING_DIR, under the same private-folder rules; TRIDENT_CACHE_DIR, when set, keeps
    them beside everything else; with both off nothing is kept."""
    tuning, plans = tmp_path / "tuning", tmp_path / "plans"
    key = disk_cache.key_of("shape", 1)
    with knobs.scope(tuning_dir=str(tuning), cache_dir=None):
        assert [disk_cache.where(k) for k in ("decode-matmul", "decode-attention", "written")] == \
            ["TRIDENT_TUNING_DIR", "TRIDENT_TUNING_DIR", ""]
        for kind in disk_cache.TUNING_KINDS:
            disk_cache.store(kind, key, {"us": {"aten": 1.0}})
            assert disk_cache.load(kind, key, lambda v: True) == {"us": {"aten": 1.0}}
        disk_cache.store("written", key, ["x"])  # an analysis: kept only in TRIDENT_CACHE_DIR
        assert disk_cache.load("written", key, lambda v: True) is None
        assert len(_entries(tuning)) == 3 and all("/written/" not in p for p in _entries(tuning))
        assert stat.S_IMODE(os.stat(tuning).st_mode) == 0o700
        os.chmod(tuning, 0o755 | stat.S_IWOTH)  # a folder others may write is not read
        assert disk_cache.load("decode-matmul", key, lambda v: True) is None
        os.chmod(tuning, 0o700)
        with knobs.scope(cache_dir=str(plans)):
            assert disk_cache.where("decode-matmul") == "TRIDENT_CACHE_DIR"
            assert disk_cache.load("decode-matmul", key, lambda v: True) is None  # another folder
            disk_cache.store("decode-matmul", key, {"us": {}})
            assert len(_entries(plans)) == 1
    with knobs.scope(tuning_dir="", cache_dir=None):
        assert disk_cache.where("decode-matmul") == ""
        assert disk_cache.load("decode-matmul", key, lambda v: True) is None


def test_the_tuning_dir_is_in_the_users_cache_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    with knobs.scope(tuning_dir=None):
        assert knobs.tuning_dir() == os.path.expanduser("~/.cache/trident/tuning")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
        assert knobs.tuning_dir() == str(tmp_path / "trident" / "tuning")
    with knobs.scope(tuning_dir="~/elsewhere"):
        assert knobs.tuning_dir() == os.path.expanduser("~/elsewhere")  # set: XDG_CACHE_HOME not used
    with knobs.scope(tuning_dir=""):
        assert knobs.tuning_dir() == ""
    monkeypatch.setattr(os.path, "expanduser", lambda p: p)  # no HOME, no passwd entry
    with knobs.scope(tuning_dir=None):
        monkeypatch.delenv("XDG_CACHE_HOME")
        assert knobs.tuning_dir() == ""  # not a folder named '~' in the working directory


def test_write_analysis_is_read_back_and_a_damaged_one_recomputed(tmp_path, monkeypatch):
    import torch._higher_order_ops.triton_kernel_wrap as tkw

    calls = []
    real = tkw.get_mutated_tensors
    monkeypatch.setattr(tkw, "get_mutated_tensors", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(100)
    with knobs.scope(cache_dir=str(tmp_path / "c")):
        outline_regions._WRITTEN.clear()
        opt = trident.optimize(trident.capture(K.inplace_mul, x.clone()))
        assert len(calls) == 1
        (entry,) = [e for e in _entries(tmp_path) if os.sep + "written" + os.sep in e]
        outline_regions._WRITTEN.clear()  # a new process, as far as the analysis knows
        trident.optimize(trident.capture(K.inplace_mul, x.clone()))
        assert len(calls) == 1  # read back
        with open(entry, "w") as f:
            f.write('{"key": "x", "value": ["not_a_tensor_argument"]}')
        outline_regions._WRITTEN.clear()
        opt = trident.optimize(trident.capture(K.inplace_mul, x.clone()))
        assert len(calls) == 2  # ignored, computed again and written anew
        y = x.clone()
        opt(y)
        torch.testing.assert_close(y, K.inplace_mul_ref(x.clone()))
        assert disk_cache.load("written", os.path.basename(entry)[:-5], lambda v: True) == ["x_ptr"]


def test_entries_in_a_folder_others_may_write_are_not_read(tmp_path):
    with knobs.scope(cache_dir=str(tmp_path / "c")):
        key = disk_cache.key_of("shared")
        disk_cache.store("facts", key, [1])
        (path,) = _entries(tmp_path)
        assert disk_cache.load("facts", key, lambda v: True) == [1]
        os.chmod(os.path.dirname(path), 0o777)
        assert disk_cache.load("facts", key, lambda v: True) is None
