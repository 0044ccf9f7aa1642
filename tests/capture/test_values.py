"""Note [Values a trace specializes]: a nonzero count or a scalar read that the inputs give is
computed at capture from the real inputs, traced as a constant (nonzero as nonzero_static), and
guarded on every call; a value the function computes on the device first is declined."""

from __future__ import annotations

import pytest
import torch
import triton

import trident
from tests import kernels as K
from trident.scm.guards import TracedValue


def unpad_and_branch(x, mask):
    keep = torch.nonzero(mask[:, -1:].flatten()).flatten()
    again = torch.nonzero(mask[:, -1:].flatten()).flatten()  # the same slice: one guard
    h = x.reshape(-1, 16).index_select(0, keep).contiguous()
    out = torch.empty_like(h)
    n = h.numel()
    block = max(16, triton.next_power_of_2(n))  # a constexpr from the count
    K.axpy_kernel[(triton.cdiv(n, block),)](h, h, out, n, 0.5, BLOCK=block)
    if bool(x.sum() > 0):  # a branch on the inputs' values
        return out * 2 + again.sum()
    return out - 1


def _inputs(kept: int, positive: bool):
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(kept))
    x = x.abs() if positive else -x.abs()
    mask = torch.ones(3, 5, dtype=torch.long)
    mask[kept:, -1] = 0
    return x, mask


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "symbolic"])
def test_values_the_inputs_give_are_specialized_and_guarded(dynamic):
    x, mask = _inputs(2, True)
    with pytest.raises(trident.CaptureError) as info:  # the default: refused, as before
        trident.capture(unpad_and_branch, x, mask, dynamic=dynamic)
    assert info.value.data_dependent
    gm = trident.capture(unpad_and_branch, x, mask, dynamic=dynamic, values=True)
    guards = gm.meta["trident_traced_values"]
    assert [(g.kind, g.value) for g in guards] == [("count", 2), ("scalar", True)], guards
    assert "unpad_and_branch" in guards[0].where and "torch.nonzero(mask" in guards[0].where
    assert "aten.nonzero_static.default" in gm.code and "aten.nonzero.default" not in gm.code, gm.code
    opt = trident.optimize(gm)
    torch.testing.assert_close(opt(x, mask), unpad_and_branch(x, mask))
    x2, _ = _inputs(2, True)  # other values, the same count and branch: served
    torch.testing.assert_close(opt(x2 * 3, mask), unpad_and_branch(x2 * 3, mask))
    if dynamic:  # another mask length, the same count
        wide = torch.ones(3, 9, dtype=torch.long)
        wide[2:, -1] = 0
        torch.testing.assert_close(opt(x, wide), unpad_and_branch(x, wide))
    for bad in (_inputs(1, True), _inputs(2, False)):
        with pytest.raises(trident.GuardError) as info:
            opt(*bad)
        assert info.value.traced_value and info.value.before_effects
        assert "test_values.py" in str(info.value) and "these inputs give" in str(info.value), info.value
    assert any(isinstance(g, TracedValue) for g in opt.meta["trident_call_guards"])
    assert "nonzero count at" in trident.explain(opt) and "scalar at" in trident.explain(opt)


def chunk_indices(x, lens):
    """As flash-linear-attention builds its chunk indices: per sequence its chunks of 4 tokens,
    one program per chunk, the segment of each by repeat_interleave (its size only the data gives)."""
    chunks = (lens + 3).div(4, rounding_mode="floor")
    seg = torch.repeat_interleave(torch.arange(chunks.numel()), chunks)
    nt = seg.shape[0]
    out = torch.empty_like(x)
    block = max(16, triton.next_power_of_2(triton.cdiv(x.numel(), nt)))  # a constexpr from the total
    K.axpy_kernel[(triton.cdiv(x.numel(), block),)](x, x, out, x.numel(), 0.5, BLOCK=block)
    return out * 2 + seg.sum()


def test_a_repeat_total_is_specialized_and_guarded():
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    lens = torch.tensor([5, 9, 2])  # 2 + 3 + 1 chunks
    gm = trident.capture(chunk_indices, x, lens, values=True)
    guards = gm.meta["trident_traced_values"]
    assert [(g.kind, g.value) for g in guards] == [("total", 6)], guards
    assert "repeat_interleave" in guards[0].where, guards[0].where
    assert "output_size = 6" in gm.code, gm.code
    opt = trident.optimize(gm)
    torch.testing.assert_close(opt(x, lens), chunk_indices(x, lens))
    torch.testing.assert_close(opt(x * 3, torch.tensor([8, 1, 12])), chunk_indices(x * 3, torch.tensor([8, 1, 12])))
    with pytest.raises(trident.GuardError) as info:
        opt(x, torch.tensor([5, 9, 9]))  # 8 chunks
    assert info.value.traced_value and "the sum of the repeats" in str(info.value) and "give 8" in str(info.value)
    assert "repeat total at" in trident.explain(opt)
    compiled = trident.compile(chunk_indices)  # a capture per total (6, 8, 3), each reused
    for lens in ([5, 9, 2], [5, 9, 9], [8, 1, 12], [4, 4, 4], [1, 1, 1]) * 2:
        lens = torch.tensor(lens)
        torch.testing.assert_close(compiled(x, lens), chunk_indices(x, lens))
    assert len(compiled.captures) == 3 and compiled.dynamo_calls == 0, trident.explain(compiled)


def branch_on_selected(x, mask):
    keep = torch.nonzero(mask).flatten()
    picked = x.index_select(0, keep)
    if bool(picked.sum() > 0):  # a value read from the rows a count selected
        return picked * 2
    return picked - 1


def test_a_later_value_computes_the_earlier_one_anew():
    """The scalar's slice goes through the rows nonzero selected: its guard computes them with
    nonzero, never with the capture's count fixed (with another count, fill rows of -1 would
    index out of bounds: a device-side assert on CUDA, whatever order the guards run in)."""
    x, mask = torch.randn(8).abs(), torch.tensor([1, 0, 1, 1, 0, 0, 1, 0])
    gm = trident.capture(branch_on_selected, x, mask, values=True)
    count, scalar = gm.meta["trident_traced_values"]
    assert (count.kind, count.value, scalar.kind, scalar.value) == ("count", 4, "scalar", True)
    assert "aten.nonzero.default" in scalar.program.code and "nonzero_static" not in scalar.program.code
    # alone, on a mask of another count: nonzero computed anew gives 8 rows where the capture's
    # view holds 4, a host-side error the guard turns into a refusal (with the count fixed it read
    # 4 of the 8 rows and said True)
    assert not scalar.check([x, torch.ones(8, dtype=torch.long)])
    opt = trident.optimize(gm)
    torch.testing.assert_close(opt(x * 2, mask), branch_on_selected(x * 2, mask))
    with pytest.raises(trident.GuardError):
        opt(x, torch.ones(8, dtype=torch.long))


def test_negative_repeats_are_not_a_total():
    """Eager refuses negative repeats; a total guard does too (a kernel given the total would
    not), and a capture is not made from them."""
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    gm = trident.capture(chunk_indices, x, torch.tensor([5, 9, 2]), values=True)
    guard = gm.meta["trident_traced_values"][0]
    assert not guard.check([x, torch.tensor([17, -9, 10])])  # 5 - 2 + 3 = 6 chunks: one count negative
    assert "negative" in guard.failure([x, torch.tensor([17, -9, 10])], ["x", "lens"])
    with pytest.raises(trident.CaptureError):
        trident.capture(chunk_indices, x, torch.tensor([17, -9, 10]), values=True)


def count_after_a_write(x, mask):
    mask.add_(1)  # written before the count: the value is not the inputs' any more
    keep = torch.nonzero(mask.flatten() - 1).flatten()
    return x.flatten().index_select(0, keep) * 2


def count_of_a_kernel_output(x, mask):
    m = mask.flatten().to(torch.float32)
    seen = torch.empty_like(m)
    K.axpy_kernel[(1,)](m, m, seen, m.numel(), 0.5, BLOCK=64)
    keep = torch.nonzero(seen).flatten()
    return x.flatten().index_select(0, keep) * 2


@pytest.mark.parametrize("fn", [count_after_a_write, count_of_a_kernel_output])
def test_a_value_the_call_computes_first_is_declined(fn):
    """The slice reads a tensor a write traced before it changed (an in-place op, a launch): the
    guard could not compute the value before the call runs, so nothing is specialized: the
    count stays data-dependent (planning refuses it), and trident.compile serves the function
    through Dynamo with eager's results."""
    x, mask = torch.randn(6), torch.tensor([1, 0, 1, 1, 0, 1])
    gm = trident.capture(fn, x, mask.clone(), values=True)
    assert gm.meta["trident_traced_values"] == () and "aten.nonzero.default" in gm.code, gm.code
    with pytest.raises(trident.UnsupportedError) as info:
        trident.optimize(gm)
    assert info.value.data_dependent
    torch._dynamo.reset()
    compiled = trident.compile(fn)
    for m in (mask, torch.tensor([0, 0, 1, 1, 1, 1]), mask, mask):
        got_mask, want_mask = m.clone(), m.clone()
        torch.testing.assert_close(compiled(x, got_mask), fn(x, want_mask))
        assert torch.equal(got_mask, want_mask)
    assert compiled.dynamo_calls >= 1 and not compiled.captures, trident.explain(compiled)
    torch._dynamo.reset()


def count_after_a_write_to_a_piece(x, mask):
    a, _ = mask.unbind(0)  # pieces of an op returning several views, read through getitem
    a.zero_()
    return x[torch.nonzero(mask).flatten()] * 2


def sum_after_a_write_to_another_input(x, mask, row):
    row.zero_()  # row shares mask's memory (a view passed beside it)
    return x * 2 if bool(mask.sum() > 3) else x - 1


def test_writes_through_pieces_and_aliases_are_seen():
    """A write to a piece of `unbind` (a view reached through getitem) declines the count, so
    nothing is specialized; a write to another input sharing the read input's memory declines
    the value at capture and, in a call where the inputs come to share memory, fails the guard
    (a value read before the write would have been baked in: eager's branch differs)."""
    x, mask = torch.randn(6), torch.tensor([[1, 0, 1], [1, 0, 1]])
    gm = trident.capture(count_after_a_write_to_a_piece, x, mask.clone(), values=True)
    assert gm.meta["trident_traced_values"] == ()
    m = torch.tensor([[1, 1, 1], [1, 0, 1]])
    with pytest.raises(trident.CaptureError):  # the write makes the branch the device's to know
        trident.capture(sum_after_a_write_to_another_input, torch.randn(6), m, m[0], values=True)
    separate = torch.tensor([[1, 1, 1], [1, 0, 1]])
    gm = trident.capture(sum_after_a_write_to_another_input, x, separate, torch.ones(3, dtype=torch.long),
                         values=True)
    (guard,) = gm.meta["trident_traced_values"]
    assert guard.value is True and guard.disjoint == (2,), guard
    opt = trident.optimize(gm)
    torch.testing.assert_close(opt(x, separate.clone(), torch.ones(3, dtype=torch.long)), x * 2)
    m = torch.tensor([[1, 1, 1], [1, 0, 1]])
    with pytest.raises(trident.GuardError) as info:
        opt(x, m, m[0])
    assert "share memory" in str(info.value) and torch.equal(m[0], torch.ones(3, dtype=torch.long))
    compiled = trident.compile(sum_after_a_write_to_another_input)
    for _ in range(4):
        m, m2 = torch.tensor([[1, 1, 1], [1, 0, 1]]), torch.tensor([[1, 1, 1], [1, 0, 1]])
        torch.testing.assert_close(compiled(x, m, m[0]), sum_after_a_write_to_another_input(x, m2, m2[0]))
        assert torch.equal(m, m2)


def two_reads_around_a_write(x, mask, row):
    n = int(mask.sum())
    row.zero_()
    m = int(mask.sum())  # the same slice, read after a write: guarded apart (its own disjointness)
    return x * n + m


def test_a_read_after_a_write_keeps_its_own_guard():
    x, mask, row = torch.randn(4), torch.tensor([1, 1, 0]), torch.ones(2, dtype=torch.long)
    gm = trident.capture(two_reads_around_a_write, x, mask, row, values=True)
    assert [g.disjoint for g in gm.meta["trident_traced_values"]] == [(), (2,)]
    opt = trident.optimize(gm)
    m = torch.tensor([1, 1, 0, 1])
    with pytest.raises(trident.GuardError):  # row now shares mask's memory: the second read moved
        opt(x, m[:3], m[2:])


class _Made:
    pass


def branch_then_new_object(x, state):
    if bool(x.sum() > 0):
        return x * 2
    state["made"] = _Made()  # a new object in the state: that branch cannot be captured
    return x - 1


def test_a_value_no_capture_can_serve_goes_through_dynamo():
    """The capture for the other value is refused: the family goes through Dynamo at once, not
    a failed trace and an eager run on every call."""
    torch._dynamo.reset()
    compiled = trident.compile(branch_then_new_object)
    for x in [torch.ones(4)] * 3 + [-torch.ones(4)] * 5:
        got_state, want_state = {}, {}
        torch.testing.assert_close(compiled(x, got_state), branch_then_new_object(x, want_state))
        assert got_state.keys() == want_state.keys()
    assert compiled.dynamo_calls >= 4 and compiled.eager_calls <= 2, trident.explain(compiled)
    torch._dynamo.reset()


def block_from_data(x, y):
    n = int((x > 0).sum()) + 1  # a value only the data gives, a constexpr below
    block = max(16, triton.next_power_of_2(n))
    z = torch.empty_like(x)
    K.axpy_kernel[(triton.cdiv(x.numel(), block),)](x, y, z, x.numel(), 0.5, BLOCK=block)
    return z


def sign_branch(x, y):
    z = torch.empty_like(x)
    K.axpy_kernel[(triton.cdiv(x.numel(), 64),)](x, y, z, x.numel(), 0.5, BLOCK=64)
    return z * 2 if bool(x[0] > 0) else z - 1


def test_trident_compile_keeps_a_capture_per_value_and_reuses_them():
    """Two values alternating: two captures, each call served by one (the other's guard refuses
    it first), none made again; every result eager's."""
    compiled = trident.compile(sign_branch)
    y = torch.randn(64)
    for step in range(10):
        x = torch.randn(64, generator=torch.Generator().manual_seed(step)).abs() * (1 if step % 2 else -1)
        torch.testing.assert_close(compiled(x, y), sign_branch(x, y))
    assert len(compiled.captures) == 2 and compiled.dynamo_calls == 0, trident.explain(compiled)
    assert compiled.eager_calls <= 2, trident.explain(compiled)


def test_regimes_are_counted_per_family():
    """float32 and float64 calls share a structure but not a family: float64's values get their
    own captures while float32's are many (before, REGIMES counted the structure's, and float64
    went through Dynamo)."""
    from trident.frontends.compile import REGIMES

    torch._dynamo.reset()
    compiled = trident.compile(block_from_data)
    for dtype, steps in ((torch.float32, range(REGIMES)), (torch.float64, range(3)), (torch.float64, range(3))):
        for step in steps:
            x = torch.zeros(200, dtype=dtype)
            x[: 40 * step + 5] = 1.0
            y = torch.ones(200, dtype=dtype)
            torch.testing.assert_close(compiled(x, y), block_from_data(x, y))
    assert compiled.dynamo_calls == 0 and len(compiled.captures) == REGIMES - 1 + 3, trident.explain(compiled)
    torch._dynamo.reset()


def test_values_that_change_every_call_go_through_dynamo():
    """A value that differs on every call would make a capture per call: past REGIMES captures of
    values the family goes through Dynamo (its captures by value dropped), results eager's."""
    from trident.frontends.compile import REGIMES

    torch._dynamo.reset()
    compiled = trident.compile(block_from_data)
    y = torch.randn(200)
    for step in range(12):
        x = torch.zeros(200)
        x[: 20 * step + 5] = 1.0  # 5, 25, 45, ... positives: another block size from step to step
        torch.testing.assert_close(compiled(x, y), block_from_data(x, y))
    text = trident.explain(compiled)
    assert compiled.dynamo_calls >= 2 and "changed past" in (compiled.dynamo_reason or ""), text
    assert len(compiled.captures) <= REGIMES, text
    torch._dynamo.reset()


class _UnpaddedLayers(torch.nn.Module):
    """Layers as flash-linear-attention writes them, on the device: each unpads the tokens by
    the mask (a nonzero count), runs a kernel with a block size from the count, replaces its
    state entry."""

    def __init__(self, n: int, device: str):
        super().__init__()
        torch.manual_seed(0)
        self.projs = torch.nn.ModuleList(torch.nn.Linear(64, 64, device=device) for _ in range(n))

    def forward(self, x, mask, states: list):
        keep = torch.nonzero(mask[:, -x.shape[1]:].flatten()).flatten()
        for i, proj in enumerate(self.projs):
            h = proj(x).reshape(-1, 64).index_select(0, keep).contiguous()
            out = torch.empty_like(h)
            n = h.numel()
            block = max(16, triton.next_power_of_2(n))
            K.axpy_kernel[(triton.cdiv(n, block),)](h, h, out, n, 0.5, BLOCK=block)
            states[i] = states[i] * 0.5 + out.sum(0)
            x = x + out.reshape(x.shape) * 0.1
        return x


@pytest.mark.cuda
def test_a_count_specialized_decode_replays_graphs_cuda():
    """On the GPU the decode step with the count specialized is one capture whose region replays
    a CUDA graph (nonzero_static is capturable), the guard reading the count before each call;
    outputs and states equal eager's at every step, through two generate()-like loops."""
    model = _UnpaddedLayers(4, "cuda").eval()
    compiled = trident.compile(model)
    with torch.no_grad():
        for _ in range(2):
            states, want_states = [torch.zeros(64, device="cuda") for _ in range(4)], \
                [torch.zeros(64, device="cuda") for _ in range(4)]
            for step in range(10):
                q_len = 5 if step == 0 else 1
                x = torch.randn(1, q_len, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(step))
                mask = torch.ones(1, 5 + step, dtype=torch.long, device="cuda")
                torch.testing.assert_close(compiled(x, mask, states), model(x, mask, want_states))
                for a, b in zip(states, want_states):
                    torch.testing.assert_close(a, b)
    fn = compiled._compiled
    text = trident.explain(compiled)
    assert fn.dynamo_calls == 0 and "nonzero count at" in text, text
    replays = sum(r.get("graph_replays", 0) for c in trident.cache_info(compiled).values() for r in c.values())
    assert replays >= 8, (trident.cache_info(compiled), text)
