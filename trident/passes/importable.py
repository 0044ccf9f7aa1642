"""What torch-mlir's FX importer can take: a node it would drop or fail on cannot be a step of
a region (Note [Steps by location] in lowering/region_to_torch.py), so partition_regions keeps
it out, with the reason explain() shows."""

from __future__ import annotations

import torch
from torch_mlir.extras.fx_importer import NODE_CANONICALIZE

try:
    from torch_mlir.extras import fx_as_strided as fas
except ImportError:  # another torch-mlir: its importer has no such rewrite
    fas = None


def _as_strided_reason(node: torch.fx.Node) -> str | None:
    """torch-mlir rewrites as_strided into aten.index over the nearest tensor sharing its storage
    (fx_as_strided.py) and raises for layouts it cannot express that way (storage offsets that
    map to no index of that base, out-of-bounds or symbolic requests). Which ancestor is the base
    depends on where the region starts, so every ancestor on the storage chain is tried: a node
    any of them fails for stays out of regions."""
    if fas is None:
        return None
    try:
        size = fas._ints(fas._arg(node, 1, "size"), "size")
        stride = fas._ints(fas._arg(node, 2, "stride"), "stride")
        offset = fas._arg(node, 3, "storage_offset", None)
        source = fas._arg(node, 0, "self")
        offset = (
            fas._int(fas._tensor(source, "self").storage_offset(), "self.storage_offset")
            if offset is None
            else fas._int(offset, "storage_offset")
        )
        base = source
        while isinstance(base, torch.fx.Node):
            value = fas._tensor(base, "base")
            with fas.unset_fake_temporarily():
                fas._indices(
                    fas._ints(value.shape, "base.shape", meta=True),
                    fas._ints(value.stride(), "base.stride", meta=True),
                    fas._int(value.storage_offset(), "base.storage_offset"),
                    size,
                    stride,
                    offset,
                )
            base = fas._storage_operand(base)
    except Exception as e:  # noqa: BLE001 - any failure here is a failure of the import
        return f"{node.target}: torch-mlir's FX importer cannot rewrite it to indexing ({type(e).__name__}: {e})"
    return None


def import_reason(node: torch.fx.Node) -> str | None:
    """Why the FX importer cannot give an operator node its torch-dialect form (so the node
    cannot be a step of a region), or None when it can. The importer drops the nodes its
    canonicalization maps to None (aten._assert_async.msg: torch-mlir has no asserts) and fails
    on as_strided layouts it cannot rewrite (`_as_strided_reason`)."""
    if node.target is torch.ops.aten.as_strided.default:
        reason = _as_strided_reason(node)
        if reason is not None:
            return reason
    canonicalize = NODE_CANONICALIZE.get(node.target)
    if canonicalize is None:
        return None
    scratch = torch.fx.Graph()  # the canonicalization may rewrite the node it is given
    env: dict[torch.fx.Node, torch.fx.Node] = {}

    def arg(n: torch.fx.Node) -> torch.fx.Node:
        if n not in env:
            env[n] = scratch.placeholder(n.name)
            env[n].meta.update(n.meta)
        return env[n]

    try:
        dropped = canonicalize(scratch.node_copy(node, arg)) is None
    except Exception as e:  # a canonicalization that fails here fails the import too
        return f"{node.target}: torch-mlir's FX importer cannot canonicalize it ({type(e).__name__}: {e})"
    return f"{node.target}: torch-mlir's FX importer drops it (no torch-dialect form)" if dropped else None
