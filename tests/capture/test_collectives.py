"""Note [Collectives in regions]: while a thread traces, torch.distributed's classic collectives
are their functional forms for that thread only; functions keep their identity across
torch.distributed and distributed_c10d (P2POp checks it), and everything is restored after."""

from __future__ import annotations

import threading

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from trident.capture.collectives import collectives_as_functional


def test_patched_only_while_tracing_and_identities_kept():
    original = dist.all_reduce
    with collectives_as_functional():
        assert dist.all_reduce is not original and dist.all_reduce is c10d.all_reduce
        assert dist.all_reduce.__trident_original__ is original
        assert dist.isend is c10d.isend  # point-to-point ones are left alone (P2POp checks them by identity)
        seen = []
        other = threading.Thread(target=lambda: seen.append(getattr(dist.all_reduce, "__trident_original__", None)))
        other.start()
        other.join()
        assert seen == [original]  # patched module-wide, but routed to the original outside this thread's trace
    assert dist.all_reduce is original and c10d.all_reduce is original


def test_nested_and_concurrent_windows_restore_once():
    original = dist.all_gather_into_tensor
    inside = threading.Event()
    release = threading.Event()

    def other():
        with collectives_as_functional():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(10)
    with collectives_as_functional():
        with collectives_as_functional():
            assert dist.all_gather_into_tensor is not original
        assert dist.all_gather_into_tensor is not original
    assert dist.all_gather_into_tensor is not original  # the other thread's window is still open
    release.set()
    t.join()
    assert dist.all_gather_into_tensor is original
