"""Importing Trident leaves a user's own Triton code working on the CPU (Triton's interpreter,
TRITON_INTERPRET=1 set before or after the import, or not at all), and Trident captures such
code. Each case runs tests/capture/triton_user_program.py in a fresh process, since
TRITON_INTERPRET takes effect when kernels are defined, with an empty Triton cache of its own:
a cached binary skips Triton's code generator, and with it the failures these cases are about
(a capture under TRITON_INTERPRET=1 after an eager tl.sum failed only on a cold cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(mode: str, cache_dir) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TRITON_CACHE_DIR"] = str(cache_dir)  # empty: every kernel goes through the code generator
    proc = subprocess.run(
        [sys.executable, "-m", "tests.capture.triton_user_program", mode],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # wrap_triton swallows a failed TTIR generation (it then assumes every input is written)
    assert "Encountered an exception in identify_accessed_tensors" not in proc.stderr, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # eager launches leave triton.language as they found it (Triton's interpreter left
    # triton.language.core patched after a device-function call: tl.sum)
    assert result["patched_after_eager"] == [], result
    return result


@pytest.mark.skipif(torch.cuda.is_available(), reason="the host-only driver is for machines without a GPU")
@pytest.mark.parametrize("mode", ["before", "after"])
def test_interpreted_triton_before_and_after_capture(mode, tmp_path):
    r = _run(mode, tmp_path)
    assert r["kernel_type"] == "InterpretedFunction"
    if mode == "before":  # see reduction() in triton_user_program.py for "after"
        assert r["eager_reduction_first"] == "ok"
    assert r["eager_untuned_before"] == "ok"  # Triton's interpreter, untouched by the import
    assert r["trident"] == "ok" and r["scm_nodes"] == 1  # captured through JITFunction twins
    assert r["eager_after"] == "ok" and r["eager_untuned_after"] == "ok"  # autotune too, once a driver exists


@pytest.mark.skipif(torch.cuda.is_available(), reason="the host-only driver is for machines without a GPU")
def test_compiled_triton_runs_interpreted_on_the_cpu(tmp_path):
    """Without TRITON_INTERPRET, kernels are JITFunctions. Without a GPU Triton has no driver of
    its own ("0 active drivers"); `import trident` sets up its host-only driver, under which eager
    launches on CPU tensors run through Triton's interpreter, before and after a capture."""
    r = _run("unset", tmp_path)
    assert r["kernel_type"] == "JITFunction"
    assert r["eager_reduction_first"] == "ok"  # tl.sum hashed for the first time mid-launch
    assert r["eager_before"] == "ok" and r["eager_untuned_before"] == "ok"
    assert r["trident"] == "ok" and r["eager_after"] == "ok" and r["eager_untuned_after"] == "ok"


_PROBE = """
import torch, triton

def device():  # flash-linear-attention's fla/utils/_device.py, at its import
    try:
        return triton.runtime.driver.active.get_current_target().backend
    except Exception:
        return "cpu"

def cores():  # Liger-Kernel's and flash-linear-attention's core count probes
    try:
        return triton.runtime.driver.active.utils.get_device_properties(0)["multiprocessor_count"]
    except Exception:
        return 1
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the host-only driver is for machines without a GPU")
def test_libraries_probing_the_driver_see_no_gpu():
    """Note [The host target is Triton's and torch's to ask]: a library that asks Triton's driver
    which device it runs on gets, after `import trident`, what it gets without Trident on this
    machine (the RuntimeError of no active driver), so it keeps its CPU path (flash-linear-attention
    asked torch.cuda for the GPU's name next and failed to import); Triton itself still compiles
    for sm_90 and launches (interpreted) through the host-only driver."""
    import types

    import triton

    import trident  # sets up the host-only driver
    from tests import kernels as K

    lib = types.ModuleType("mylib._device")
    exec(compile(_PROBE, "mylib/_device.py", "exec"), lib.__dict__)
    assert (lib.device(), lib.cores()) == ("cpu", 1)
    with pytest.raises(RuntimeError, match=r"0 active drivers.*no device for tests\.capture\.test_triton_interop"):
        triton.runtime.driver.active.get_current_target()  # this test module is no Triton either
    x, y = torch.randn(300), torch.randn(300)
    torch.testing.assert_close(K.axpy(x, y), K.axpy_ref(x, y))  # Triton asks, and launches
    opt = trident.optimize(trident.capture(K.axpy, x, y))  # Trident asks (sm_90 cubins)
    torch.testing.assert_close(opt(x, y), K.axpy_ref(x, y))


@pytest.mark.cuda
def test_users_triton_on_the_gpu_before_and_after_capture():
    """On a GPU Triton's own driver stays active: the user's kernels run eagerly before and after
    Trident captures and runs them."""
    import trident
    from tests.kernels import axpy, axpy_ref

    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    torch.testing.assert_close(axpy(x, y), axpy_ref(x, y))
    opt = trident.optimize(trident.capture(axpy, x, y))
    torch.testing.assert_close(opt(x, y), axpy_ref(x, y))
    import triton

    assert type(triton.runtime.driver.active).__name__ != "HostOnlyDriver"
    torch.testing.assert_close(axpy(x, y), axpy_ref(x, y))


def test_other_threads_launch_eagerly_while_one_traces():
    """kernel[grid] is routed through wrap_triton only in the thread that traces: a user thread
    launching meanwhile runs its kernel as without Trident (it used to recurse into the patch)."""
    import threading

    from tests import kernels as K
    from trident.capture.trace import _launches_as_hops

    inside, done = threading.Event(), threading.Event()

    def tracer():
        with _launches_as_hops([]):
            inside.set()
            done.wait(60)

    t = threading.Thread(target=tracer)
    t.start()
    try:
        assert inside.wait(60)
        x, y = torch.randn(200), torch.randn(200)
        torch.testing.assert_close(K.axpy(x, y), K.axpy_ref(x, y))  # this thread: eager
    finally:
        done.set()
        t.join(60)
