"""ATen glue between launches -> Inductor-generated Triton kernels (issue 25 item 2).

Note [Fused glue]
~~~~~~~~~~~~~~~~~
A decode step of a plain HF model is ~60 % small ATen kernels: the adds, casts, means, rsqrts
and multiplies of an RMSNorm, the rotary embedding's muls, negs and cats, the residual adds,
the SwiGLU's silu and mul. Eager launches each alone; Inductor fuses them. This pass finds
maximal groups of such ops in a static capture and hands each group to Inductor's code
generator (inductor_glue.lower); the group is replaced by Inductor's launches, which the rest of
the pipeline serves as it serves any user kernel (guards, native launches, graph replay).

Which ops are glue: ATen ops tagged pointwise, the reductions of `_REDUCTIONS`, casts
(`_to_copy` on one device, `convert_element_type`), `clone`, `cat`, softmax; views of a glue
op's result (a view of anything else stays where it is: it is an input of the group). Every
tensor of the op on one device the mode allows (`TRIDENT_FUSE_GLUE`: 'cuda', or 'all' for the
CPU tests, where the kernels run through Triton's interpreter), one tensor result, static
sizes, no complex dtype, nothing empty. Not glue: matrix products (but a product with inner size 1
is an elementwise one: Note [Outer products are glue]), attention, launches, data
movement Trident lowers itself (lower_copies, fuse_cache_writes run first), random ops,
anything that writes.

How groups are formed, in graph order, so that replacing a group by one block keeps every
dependency and every read of a value that something writes:
- windows: any node that may write (a launch, an in-place or out= op, a call Trident cannot
  see into) ends a window; a group lies in one window, so moving its reads to the group's last
  node moves none past a write;
- a glue node joins the group of one of its glue inputs when no other input of it depends on
  that group (else the group would feed itself through an outside node: a cycle); else it
  starts a group; the other groups of its inputs join that group too where no path between
  them leaves both (Note [Groups joined where they meet]);
- the block is inserted at the group's last node; a group member after the first outside
  reader of any member's value is dropped from the group (so every reader follows the block);
- views at a group's end that only outside nodes read (a slice with an offset, a select, an
  expand of the fused value) stay ATen views, moved after the block; a group nothing reads is
  left alone;
- a group is lowered only with at least two computing ops, and kept only when Inductor needs
  fewer kernels than the ops it replaces; outputs of the group that are views of another output
  must come back as views of it (aliasing kept), each output with eager's sizes, strides (of
  dimensions larger than 1) and storage offset; Inductor's `as_strided` views become permutes
  and views where they are dense, and a group whose graph keeps one (a piece of a cat written
  through an offset view) is left as it was: region lowering cannot import as_strided.

Inductor's code has the sizes as constants: each static shape lowers its own kernels, and
kernels are never recycled (Note [Recycled table slots]), so a process capturing ever new shapes
with fusion on keeps one kernel per glue group and shape (in symbolic captures only the groups
whose sizes are all static are fused, the same for every size).

A group Inductor cannot lower (an op it has no lowering for, a failure) stays as it was, with
a debug line on the `trident.lowering` logger; the capture never fails because of this pass.
Results: Inductor's kernels compute in fp32 and round where eager rounds
(`emulate_precision_casts`), as torch.compile's do; they can differ from eager's in the last bit
where eager rounds an intermediate that Inductor keeps (as under torch.compile).
"""

from __future__ import annotations

import operator

import torch

from .. import knobs, logs
from .common import is_launch
from .inductor_glue import GlueLoweringError, lower, register

aten = torch.ops.aten
prims = torch.ops.prims

_REDUCTIONS = {
    aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default, aten.amax.default,
    aten.amin.default, aten.prod.dim_int, aten.var.correction, aten.any.dim, aten.all.dim,
}
_OTHER = {
    aten._to_copy.default, prims.convert_element_type.default, aten.clone.default, aten.cat.default,
    aten._softmax.default, aten._log_softmax.default,
}
_VIEWS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.expand.default, aten.permute.default,
    aten.transpose.int, aten.t.default, aten.slice.Tensor, aten.select.int, aten.alias.default,
}


def _static(t) -> bool:
    return isinstance(t, torch.Tensor) and all(isinstance(s, int) for s in (*t.shape, *t.stride()))


def _tensor_ok(t, mode: str) -> bool:
    return (
        _static(t)
        and t.numel() > 0
        and not t.is_complex()
        and (t.device.type == "cuda" or (mode == "all" and t.device.type == "cpu"))
    )


def _tensors(node: torch.fx.Node) -> list:
    return [a.meta.get("val") for a in node.all_input_nodes]


def _glue_kind(node: torch.fx.Node, mode: str) -> "str | None":
    """'compute', 'view' or None."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    op = node.target
    if op._schema.is_mutable or torch.Tag.nondeterministic_seeded in op.tags:
        return None
    kind = "view" if op in _VIEWS else "compute" if (
        op in _REDUCTIONS or op in _OTHER or torch.Tag.pointwise in op.tags) else None
    if kind is None:
        return None
    out = node.meta.get("val")
    ins = _tensors(node)
    if not _tensor_ok(out, mode) or not ins or not all(_tensor_ok(t, mode) for t in ins):
        return None
    if len({t.device for t in (out, *ins)}) != 1:
        return None
    return kind


def _may_write(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return False
    if is_launch(node) or not isinstance(node.target, torch._ops.OpOverload):
        return True
    return node.target._schema.is_mutable


# Note [Groups joined where they meet]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A node joins one group, the first of its inputs' groups it can join; groups grow from their
# first node, so two chains that start apart and meet at a node stay two kernels. HF's rotary
# embedding is such a pair: `q * cos` starts one group, `rotate_half(q) * sin` (slices of q, a
# neg, a cat, a mul) another -- their inputs are views of a launch's output, in no group -- and
# their add joins the first: two kernels for q and two for k in every layer of a plain Llama or
# Qwen2 (tools/bench_hf.py's profiles: 82 pointwise glue launches a Llama-1B step). Where a node
# reads several groups of its window, the others merge into the one it joins when
# - the node reads them over one iteration space (its inputs from each have the numel of its
#   input from the group it joins, each seen through its group's views to the op computing it):
#   Inductor then makes one kernel of them. Groups met through a broadcast stay apart: HF's
#   causal mask compares the positions (one element) with the key indices (the cache length),
#   and merged with the rotary angles' group, which reads the same positions, Inductor made
#   three kernels of what were two;
# - no path between them passes through a node outside both: no member of one, nor the node,
#   has an outside input that depends on the other (`deps` holds, per node, every group it
#   depends on, through any nodes). `_trim` would keep a merge across such a path correct (it
#   splits a group where an outside node reads a member before its last), but cut the groups
#   where they were whole.
# The merged group is one block at its last node, as any group.


def _elements(node: torch.fx.Node, group_of: dict) -> int:
    """The numel of the computing member behind `node` (through the views of its group that lead
    to it: an expand of one element reads one element, whatever it shows)."""
    while node.target in _VIEWS and isinstance(node.args[0], torch.fx.Node) and \
            group_of.get(node.args[0]) == group_of.get(node):
        node = node.args[0]
    return node.meta["val"].numel()


def _merge(groups: list, group_of: dict, deps: dict, into: int, other: int) -> bool:
    """Group `other` into group `into` (Note [Groups joined where they meet]) unless a path
    between them leaves both; returns whether it did."""
    both = set(groups[into]) | set(groups[other])
    for a, b in ((into, other), (other, into)):
        for member in groups[b]:
            if any(p not in both and (deps.get(p, 0) >> a) & 1 for p in member.all_input_nodes):
                return False
    for member in groups[other]:
        group_of[member] = into
    groups[into].extend(groups[other])
    groups[other] = []
    bit, to = 1 << other, 1 << into
    for n, bits in deps.items():
        if bits & bit:
            deps[n] = (bits & ~bit) | to
    return True


def _groups(gm: torch.fx.GraphModule, mode: str) -> list[list[torch.fx.Node]]:
    nodes = list(gm.graph.nodes)
    group_of: dict = {}
    groups: list[list[torch.fx.Node]] = []
    deps: dict = {}  # node -> bitset of the groups (of its window) it depends on
    window_start = 0
    for node in nodes:
        if _may_write(node):
            deps.clear()  # a new window: earlier groups are closed
            window_start = len(groups)
            continue
        kind = _glue_kind(node, mode)
        ins = node.all_input_nodes
        chosen = None
        if kind is not None:
            candidates = []
            for p in ins:
                g = group_of.get(p)
                if g is not None and g >= window_start and g not in candidates:
                    candidates.append(g)
            for g in candidates:
                if all(group_of.get(p) == g or not (deps.get(p, 0) >> g) & 1 for p in ins):
                    chosen = g
                    break
            if chosen is not None:  # Note [Groups joined where they meet]
                size = _elements(next(p for p in ins if group_of.get(p) == chosen), group_of)
                for g in candidates:
                    if g == chosen or not groups[g]:
                        continue
                    if all(_elements(p, group_of) == size for p in ins if group_of.get(p) == g) and all(
                            group_of.get(p) in (chosen, g) or not (deps.get(p, 0) >> g) & 1 for p in ins):
                        _merge(groups, group_of, deps, chosen, g)
            if chosen is None and kind == "compute":
                chosen = len(groups)
                groups.append([])
        bits = 0
        for p in ins:
            bits |= deps.get(p, 0)
        if chosen is not None:
            group_of[node] = chosen
            groups[chosen].append(node)
            bits |= 1 << chosen
        if bits:
            deps[node] = bits
    position = {n: i for i, n in enumerate(nodes)}
    return [part for g in groups if g for part in _trim(sorted(g, key=position.__getitem__), position)]


def _trim(group: list, position: dict) -> list[list]:
    """The group split where an outside node reads a member's value before the group's last
    member: the members before the first such reader, then the rest (itself split the same
    way). Each part keeps the group's property that no path leaves it and comes back."""
    parts = []
    while group:
        members = set(group)
        first = min((position[u] for n in group for u in n.users if u not in members), default=None)
        head = group if first is None else [n for n in group if position[n] < first]
        parts.append(head)
        group = group[len(head):]
    return parts


def _computes(group: list) -> int:
    return sum(1 for n in group if n.target not in _VIEWS)


def fuse_glue(gm: torch.fx.GraphModule) -> int:
    """Replace each glue group worth it by Inductor's launches; returns how many groups."""
    mode = knobs.fuse_glue()
    if not mode:
        return 0
    fused = 0
    rewritten = _outer_products_as_muls(gm, mode)
    for group in _groups(gm, mode):
        if _computes(group) < 2:
            continue
        try:
            if _replace(gm, group):
                fused += 1
        except GlueLoweringError as e:
            logs.lowering.debug("glue of %d ops left unfused (%s): %s", len(group), group[0].name, e)
    if fused or rewritten:
        gm.graph.lint()
        gm.recompile()
    return fused


# Note [Outer products are glue]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A rotary embedding computes its angles as `inv_freq[None, :, None] @ position_ids[:, None, :]`
# (HF's Llama, Qwen2, Mistral, ...): a matrix product with an inner size of 1, i.e. an outer
# product -- one multiply per element, no sum. As an ATen bmm it is a cuBLAS kernel of its own in
# the middle of the angles' glue (cutlass's sgemm, ~3 us of an H100 a decode step, e62c382), which
# cuts that glue in two fused kernels and keeps two ordinary boundaries under PDL. With one term
# the product is x * y rounded once -- what aten.mul computes -- so a floating-point `mm`/`bmm` of
# static sizes with inner size 1 becomes the broadcasting `aten.mul` and joins the glue: the same
# values, where the product computes fp32 in fp32 (`_fp32_products_exact`: torch's default; with
# TF32 or bf16 for fp32 products the inputs are rounded first, and such a product stays). One
# difference: a GEMM adds the product onto +0.0, so where x * y is -0.0 (a zero times a negative)
# it gives +0.0 and the multiply -0.0 -- equal values (a rotary's angles are never -0.0: positive
# frequencies, positions >= 0). Integer and bool products stay (eager has none on CUDA).


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _fp32_products_exact(device: torch.device) -> bool:
    """Whether torch computes fp32 matrix products on `device` from unrounded fp32 inputs (no
    TF32, no bf16): the per-backend setting since torch 2.9 ('ieee', or 'none': the default,
    inheritance resolved), else the legacy global one; False where torch cannot say (a mix of the
    two APIs makes the legacy getter raise)."""
    try:
        backend = torch.backends.cuda if device.type == "cuda" else torch.backends.mkldnn
        return backend.matmul.fp32_precision in ("ieee", "none")
    except (AttributeError, RuntimeError):
        pass
    try:
        return torch.get_float32_matmul_precision() == "highest"
    except RuntimeError:
        return False


def _outer_products_as_muls(gm: torch.fx.GraphModule, mode: str) -> int:
    """Note [Outer products are glue]: each static mm/bmm with inner size 1 on a device `mode`
    fuses glue on becomes aten.mul of the same operands ([M, 1] * [1, N] broadcasts to mm's
    [M, N], [B, M, 1] * [B, 1, N] to bmm's [B, M, N]) where its result has the product's layout;
    returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.bmm.default):
            continue
        x, y = node.args[:2]
        vx, vy, out = x.meta.get("val"), y.meta.get("val"), node.meta.get("val")
        if not all(_tensor_ok(t, mode) for t in (vx, vy, out)) or vx.shape[-1] != 1 or vx.dtype not in _FLOATS:
            continue
        if vx.dtype == torch.float32 and not _fp32_products_exact(vx.device):
            continue
        try:
            product = vx * vy
        except Exception:  # noqa: BLE001 - a value fake propagation cannot multiply: the product stays
            continue
        if tuple(product.shape) != tuple(out.shape) or product.stride() != out.stride() or product.dtype != out.dtype:
            continue
        with gm.graph.inserting_before(node):
            mul = gm.graph.call_function(aten.mul.Tensor, (x, y))
        mul.meta.update(node.meta)
        mul.meta["val"] = product
        node.replace_all_uses_with(mul)
        gm.graph.erase_node(node)
        count += 1
    return count


def _outer_views(group: list) -> list:
    """Views at the group's end that only outside nodes read: they stay ATen views of the fused
    result (a slice with an offset, an expand: Inductor would return them as as_strided)."""
    members = set(group)
    dropped: list = []
    changed = True
    while changed:
        changed = False
        for n in reversed(group):
            if n in members and n.target in _VIEWS and n.users and not any(u in members for u in n.users):
                members.discard(n)
                dropped.append(n)
                changed = True
    return sorted(dropped, key=group.index)


def _replace(gm: torch.fx.GraphModule, group: list) -> bool:
    views = _outer_views(group)
    group = [n for n in group if n not in views]
    if _computes(group) < 2:
        return False
    members = set(group)
    inputs: list = []
    for n in group:
        for p in n.all_input_nodes:
            if p not in members and p not in inputs:
                inputs.append(p)
    outputs = [n for n in group if any(u not in members for u in n.users)]
    if not outputs:  # nothing reads the group (capture keeps dead code): nothing to fuse
        return False
    sub = torch.fx.Graph()
    env = {p: sub.placeholder(f"in{i}") for i, p in enumerate(inputs)}
    for n in group:
        env[n] = sub.node_copy(n, lambda a: env[a])
    sub.output(tuple(env[o] for o in outputs))
    lowered = lower(sub, [p.meta["val"] for p in inputs])
    if lowered.kernels >= _computes(group):
        logs.lowering.debug("glue of %d ops at %s: Inductor needs %d kernels, kept as it is",
                            len(group), group[0].name, lowered.kernels)
        return False
    new = _inline(gm, lowered.graph, inputs, group[-1], outputs[0].meta["val"])
    strided = new is not None and any(n.target is aten.as_strided.default for n in new[1])
    if strided:  # a view plain views cannot make (an offset slice, a cat's piece): regions cannot import it
        logs.lowering.debug("glue of %d ops at %s: Inductor's graph keeps an as_strided view, kept as it is",
                            len(group), group[0].name)
    if new is None or strided or not _same_layouts(outputs, new) or not _aliasing_kept(outputs, new, members):
        if new is not None:
            _erase_inlined(gm, new)
        return False
    ops = sorted({n.target._opname for n in group if n.target not in _VIEWS})
    kernels = [getattr(n.meta.get("glue_kernel"), "__name__", "?") for n in new[1] if n.meta.get("glue_kernel")]
    gm.meta.setdefault("trident_fused_glue", []).append(  # explain(): what each group became
        f"{_computes(group)} ops ({', '.join(ops)}) at {group[0].name} -> {len(kernels)} kernel(s) "
        f"{', '.join(kernels)}")
    for o, v in zip(outputs, new[0]):
        o.replace_all_uses_with(v, delete_user_cb=lambda u: u not in members)
    for n in reversed(group):
        gm.graph.erase_node(n)
    anchor = new[1][-1]  # the views left out follow the block (their readers follow the group)
    for view in views:
        anchor.append(view)
        anchor = view
    return True


def _inline(gm, graph: torch.fx.Graph, inputs: list, after: torch.fx.Node, ref):
    """Inductor's graph inserted after `after`: (output nodes, inserted nodes)."""
    env: dict = {}
    added: list = []
    placeholders = iter(inputs)
    outputs = None
    with gm.graph.inserting_before(after.next):  # in order, right after `after`
        for node in graph.nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
                continue
            if node.op == "output":
                values = node.args[0]
                outputs = [env[a] for a in (values if isinstance(values, (list, tuple)) else [values])]
                break
            new = gm.graph.node_copy(node, lambda a: env[a])
            added.append(new)
            env[node] = new
            if node.target is aten.empty_strided.default:
                size, stride = new.args[:2]
                new.kwargs = {**new.kwargs, "device": ref.device}
                new.meta["val"] = ref.new_empty_strided(size, stride, dtype=new.kwargs["dtype"])
            elif node.target is aten.as_strided.default:
                base, size, stride, offset = (list(new.args) + [0])[:4]
                new.meta["val"] = base.meta["val"].as_strided(size, stride, offset)
                views = _as_views(base.meta["val"], size, stride, offset)
                if views is not None:  # the same layout through plain views (Note [Fused glue])
                    env[node] = _emit_views(gm, new, base, views)
                    added.remove(new)
                    added.extend(_chain_nodes(env[node], base))
                    gm.graph.erase_node(new)
            else:
                register(new)
                new.meta["val"] = None
    return outputs, added


def _strides(t) -> tuple:
    """Strides where they matter: a dimension of size 1 is never stepped."""
    return tuple(st for sz, st in zip(t.shape, t.stride()) if sz != 1)


def _dense_order(shape, stride) -> "list | None":
    """The dimensions from outermost to innermost when (shape, stride) is a dense, non-overlapping
    layout (a permutation of a contiguous one), else None."""
    order = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    expect = 1
    for d in reversed(order):
        if shape[d] != 1 and stride[d] != expect:
            return None
        expect *= shape[d]
    return order


def _as_views(base, size, stride, offset) -> "list | None":
    """as_strided(base, size, stride, offset) as plain views (permute, view), where base and the
    result are dense layouts of the same elements: [(op, args)], or None. Trident serves plain
    views natively; torch-mlir imports as_strided as a gather."""
    size, stride = [int(v) for v in size], [int(v) for v in stride]
    if int(offset) != base.storage_offset() or base.numel() != _numel(size):
        return None
    src, dst = _dense_order(list(base.shape), list(base.stride())), _dense_order(size, stride)
    if src is None or dst is None:
        return None
    views = []
    if src != list(range(base.dim())):
        views.append((aten.permute.default, (src,)))
    views.append((aten.view.default, ([size[d] for d in dst],)))
    if dst != list(range(len(size))):
        views.append((aten.permute.default, ([dst.index(d) for d in range(len(size))],)))
    value = base
    for op, args in views:
        value = op(value, *args)
    if tuple(value.shape) != tuple(size) or _strides(value) != tuple(st for sz, st in zip(size, stride) if sz != 1):
        return None
    return views


def _numel(size) -> int:
    n = 1
    for v in size:
        n *= v
    return n


def _emit_views(gm, at: torch.fx.Node, base: torch.fx.Node, views: list) -> torch.fx.Node:
    value = base
    with gm.graph.inserting_before(at):
        for op, args in views:
            node = gm.graph.call_function(op, (value, *args))
            node.meta["val"] = op(value.meta["val"], *args)
            value = node
    return value


def _chain_nodes(last: torch.fx.Node, base: torch.fx.Node) -> list:
    chain = []
    while last is not base:
        chain.append(last)
        last = last.args[0]
    return chain[::-1]


def _same_layouts(outputs: list, new) -> bool:
    for o, v in zip(outputs, new[0]):
        a, b = o.meta["val"], v.meta.get("val")
        if not isinstance(b, torch.Tensor) or (a.shape, _strides(a), a.dtype) != (b.shape, _strides(b), b.dtype):
            return False
        if a.storage_offset() != b.storage_offset():
            return False
    return True


def _base(node: torch.fx.Node, members: set):
    while node.target in _VIEWS and node.args and node.args[0] in members:
        node = node.args[0]
    return node


def _root(node: torch.fx.Node) -> torch.fx.Node:
    while node.target is aten.as_strided.default or node.target in _VIEWS:
        node = node.args[0]
    return node


def _aliasing_kept(outputs: list, new, members: set) -> bool:
    """Outputs that share a buffer in the group share one in Inductor's graph, and only those."""
    mine = {o: _base(o, members) for o in outputs}
    theirs = {o: _root(v) for o, v in zip(outputs, new[0])}
    if any(v.op == "placeholder" or v not in new[1] for v in theirs.values()):
        return False  # an output Inductor returns as (a view of) an input: a group's are new tensors
    for a in outputs:
        for b in outputs:
            if a is not b and (mine[a] is mine[b]) != (theirs[a] is theirs[b]):
                return False
    return True


def _erase_inlined(gm, new) -> None:
    for n in reversed(new[1]):
        gm.graph.erase_node(n)
