"""Reverse-mode autodiff on the IR: each node's gradient comes from its op-table entry,
written as IR; gradients flowing into one value are summed."""

from __future__ import annotations

from typing import Optional

from ..ir.builder import Builder
from ..ir.graph import Node
from ..ir.ops import op_def


def backward(builder: Builder, loss: int, wrt: list[int]) -> dict[int, Optional[int]]:
    """Append the gradient nodes of LOSS (a scalar) with respect to each id in WRT to
    BUILDER. Returns id -> gradient node (None where LOSS does not depend on it)."""
    forward_nodes: list[Node] = [n for n in builder.nodes if n.id <= loss]
    needed = _depends_on(forward_nodes, set(wrt))
    grads: dict[int, int] = {}
    builder.loc, builder.path, builder.site = None, None, None
    grads[loss] = builder.scalar_like(1.0, loss)
    for node in reversed(forward_nodes):
        g = grads.get(node.id)
        if g is None or node.id not in needed:
            continue
        rule = op_def(node.op).grad
        if rule is None:
            continue
        builder.loc, builder.path, builder.site = node.loc, node.path, node.site
        for arg, contribution in zip(node.args, rule(builder, node, g)):
            if contribution is None or arg not in needed:
                continue
            previous = grads.get(arg)
            grads[arg] = contribution if previous is None else builder.op("add", previous, contribution)
        builder.loc, builder.path, builder.site = None, None, None
    return {w: grads.get(w) for w in wrt}


def _depends_on(nodes: list[Node], sources: set[int]) -> set[int]:
    """Ids that depend on any of SOURCES (the only ones worth differentiating)."""
    live = set(sources)
    for node in nodes:
        if any(a in live for a in node.args):
            live.add(node.id)
    return live
