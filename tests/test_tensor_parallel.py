"""Issue 12, Note [Collectives in regions]: tensor-parallel regions on torch.distributed. Each
case runs in fresh processes (one per rank, gloo on the CPU; NCCL on one GPU for the CUDA case)
with timeouts, so a rank that fails cannot hang the test."""

from __future__ import annotations

import datetime
import functools
import os
import tempfile
import traceback

import pytest
import torch
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _entry(rank, world, init_file, backend, target, args, queue, pg_timeout_s):
    import torch.distributed as dist

    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=pg_timeout_s))
        try:
            queue.put((rank, True, target(rank, world, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException as e:  # reported to the test, whatever it is
        queue.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"))


def _run(world, target, *args, backend="gloo", timeout_s=300, pg_timeout_s=120) -> dict:
    """{rank: (ok, result or error text)} of `target(rank, world, *args)` in `world` processes."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    fd, init_file = tempfile.mkstemp(prefix="trident-tp-")
    os.close(fd)
    os.remove(init_file)
    procs = [ctx.Process(target=_entry, args=(r, world, init_file, backend, target, args, queue, pg_timeout_s))
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(world):
            rank, ok, payload = queue.get(timeout=timeout_s)
            results[rank] = (ok, payload)
    except Exception as e:  # queue.Empty: some rank hung
        raise AssertionError(f"ranks {sorted(set(range(world)) - set(results))} gave no result in {timeout_s} s "
                             f"(hung?); others: {results}") from e
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return results


def _ok(results):
    for rank, (ok, payload) in sorted(results.items()):
        assert ok, f"rank {rank}: {payload}"
    return {rank: payload for rank, (_, payload) in results.items()}


# -- rank programs (module level: spawned processes import them) ------------------------------

def _decode_steps(rank, world, front, collective, steps=4):
    import trident
    from tests.decode_model import Config, decode_step_reference, make_caches, make_weights
    from tests.tp_decode_model import TP, shard, tp_decode_step

    torch.manual_seed(0)
    cfg = Config(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, max_seq=16)
    weights, cos, sin = make_weights(cfg, "cpu")
    full_caches = make_caches(cfg, "cpu")
    local_weights, caches = shard(cfg, weights, full_caches, rank, world)
    step = functools.partial(tp_decode_step, cfg, TP(rank, world, collective))
    x0, p0 = torch.randn(1, cfg.hidden), torch.tensor([0])
    if front == "capture":
        fn = trident.optimize(trident.capture(step, x0, p0, cos, sin, *[c.clone() for c in caches], *local_weights))
    elif front == "compile":
        fn = trident.compile(step)
    else:
        fn = torch.compile(step, backend="trident")
    diffs = []
    g = torch.Generator().manual_seed(1)  # the same tokens on every rank
    for t in range(steps):
        x, pos = torch.randn(1, cfg.hidden, generator=g), torch.tensor([t])  # fresh, as a loop makes them
        got = fn(x, pos, cos, sin, *caches, *local_weights)
        want = decode_step_reference(cfg, x.clone(), pos, cos, sin, *full_caches, *weights)
        diffs.append(float((got - want).abs().max()))
        for c, full in zip(caches, full_caches):
            torch.testing.assert_close(c, full.chunk(world, 1)[rank], rtol=1e-4, atol=1e-4)
    text = trident.explain(fn)
    info = trident.cache_info(fn)
    return {"diffs": diffs, "explain": text, "info": info}


@pytest.mark.parametrize("front,collective", [("capture", "inplace"), ("capture", "functional"),
                                              ("compile", "inplace"), ("backend", "inplace")])
def test_tensor_parallel_decode_equals_the_unsharded_model(front, collective):
    results = _ok(_run(2, _decode_steps, front, collective))
    for rank, r in results.items():
        assert max(r["diffs"]) < 1e-4, (rank, r["diffs"])
        text = r["explain"]
        # the all-reduces run inside regions, natively: no cut for them, the steps hit
        assert "all_reduce" not in text.split("cuts:")[-1] if "cuts:" in text else True, text
        assert "region" in text and "hits=" in text, text
    assert results[0]["diffs"] == results[1]["diffs"]  # every rank holds the same result


def _collectives_inside(rank, world):
    import torch.distributed as dist

    import trident
    from trident.runtime import SCMRuntime

    def f(x, w):
        y = x @ w
        dist.all_reduce(y)
        return y * 2.0

    torch.manual_seed(0)  # the same x and w on every rank
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    opt = trident.optimize(trident.capture(f, x, w))
    ops = [s.op_name for rid in opt.meta["trident_regions"] for s in SCMRuntime.get(rid).program.atens]
    out = opt(x, w)
    ref = x @ w * world
    return {"ops": ops, "diff": float((out - ref * 2.0).abs().max()), "explain": trident.explain(opt)}


def test_collectives_are_steps_of_the_region():
    results = _ok(_run(2, _collectives_inside))
    for r in results.values():
        ops = r["ops"]
        assert "_c10d_functional.all_reduce.default" in ops and "_c10d_functional.wait_tensor.default" in ops
        assert ops.index("_c10d_functional.all_reduce.default") < ops.index("_c10d_functional.wait_tensor.default")
        # (x @ w) is the same on both ranks here: the sum is twice it
        assert r["diff"] < 1e-4, r


def _refusals(rank, world):
    import torch.distributed as dist
    from torch.distributed import all_reduce as aliased  # bound before capture

    import trident
    from trident.errors import CaptureError

    out = {}

    def through_alias(x):  # noqa: E306
        y = x * 2.0
        aliased(y)
        return y

    def asynchronous(x):
        y = x * 2.0
        dist.all_reduce(y, async_op=True).wait()
        return y

    try:
        trident.capture(asynchronous, torch.randn(4))
        out["async"] = "captured"
    except CaptureError as e:
        out["async"] = str(e)
    # an alias bound before capture: torch's own all_reduce hands a traced call to its functional
    # form too (handle_torch_function), so it is captured, with the wait
    torch.manual_seed(1)
    x = torch.randn(4)
    opt = trident.optimize(trident.capture(through_alias, x))
    out["alias_diff"] = float((opt(x) - x * 2.0 * world).abs().max())
    # a front door runs such a function eagerly, with eager's (right) result
    torch.manual_seed(0)
    compiled = trident.compile(asynchronous)
    diffs = []
    for _ in range(3):  # the first call of a family runs eagerly; the second tries a capture
        x = torch.randn(4)
        diffs.append(float((compiled(x) - x * 2.0 * world).abs().max()))
    out["compile_diff"] = max(diffs)
    out["compile_warning"] = compiled.eager_reason or ""  # also logged as a warning
    # graph replay of a region with a collective is refused on gloo, with the reason
    from trident import knobs

    with knobs.scope(graphs="all"):
        opt = trident.optimize(trident.capture(lambda t: dist.all_reduce(t) or t * 3.0, torch.randn(4)))
        for _ in range(4):
            opt(torch.randn(4))
        out["graphs"] = trident.explain(opt)
    return out


def test_untraceable_collectives_are_refused_and_gloo_regions_get_no_graphs():
    results = _ok(_run(2, _refusals))
    for r in results.values():
        assert "c10d.allreduce_" in r["async"] and "whose wait is not part of the graph" in r["async"], r["async"]
        assert r["alias_diff"] < 1e-5
        assert r["compile_diff"] < 1e-5
        assert "whose wait is not part of the graph" in r["compile_warning"], r["compile_warning"]
        assert "only NCCL collectives can be recorded into CUDA graphs" in r["graphs"], r["graphs"]


def _one_rank_raises(rank, world):
    import trident
    from trident.errors import GuardError

    def f(x):
        import torch.distributed as dist

        y = x + 1.0
        dist.all_reduce(y)
        return y

    opt = trident.optimize(trident.capture(f, torch.randn(8)))
    if rank == 1:
        try:
            opt(torch.randn(9))  # another size: refused before anything runs, no collective issued
        except GuardError as e:
            raise RuntimeError(f"rank 1 refused its input: {e}") from e
    return opt(torch.randn(8)).tolist()  # rank 0 waits in the all-reduce for rank 1


def test_a_rank_that_raises_does_not_hang_the_others():
    import time

    t0 = time.perf_counter()
    results = _run(2, _one_rank_raises, pg_timeout_s=10, timeout_s=200)
    assert not results[1][0] and "GuardError" in results[1][1] and "refused its input" in results[1][1]
    assert not results[0][0], results[0]  # gloo's timeout ended rank 0's wait
    assert time.perf_counter() - t0 < 200


def _nccl_graphs(rank, world):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    import trident
    from tests import kernels as K

    def f(x, w):
        y = funcol.wait_tensor(funcol.all_reduce(x @ w, "sum", dist.group.WORLD))
        return K.axpy(y.reshape(-1), y.reshape(-1))

    w = torch.randn(64, 64, device="cuda")
    opt = trident.optimize(trident.capture(f, torch.randn(8, 64, device="cuda"), w))
    diffs = []
    for _ in range(6):
        x = torch.randn(8, 64, device="cuda")  # fresh: staged into the graph
        y = (x @ w) * world
        diffs.append(float((opt(x, w) - (y.reshape(-1) * 2.5 + y.reshape(-1))).abs().max()))
    torch.cuda.synchronize()
    (info,) = trident.cache_info(opt).values()
    return {"diffs": diffs, "info": info, "explain": trident.explain(opt)}


@pytest.mark.cuda
def test_nccl_collectives_replay_in_cuda_graphs():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    world = min(torch.cuda.device_count(), 2)
    results = _ok(_run(world, _nccl_graphs, backend="nccl"))
    for r in results.values():
        assert max(r["diffs"]) < 1e-2, r["diffs"]
        assert r["info"]["graph_replays"] >= 2, r["explain"]
