"""The IR checker: every reference defined before use, every type re-inferred from the op
table and equal to the recorded one, outputs defined."""

from __future__ import annotations

from .graph import Program
from .ops import OpError, op_def


class IRError(Exception):
    pass


def check_program(program: Program) -> None:
    types = {}
    for i in program.inputs:
        if i.id in types:
            raise IRError(f"{program.name}: id %{i.id} defined twice")
        types[i.id] = i.type
    for node in program.nodes:
        if node.id in types:
            raise IRError(f"{program.name}: id %{node.id} defined twice")
        missing = [a for a in node.args if a not in types]
        if missing:
            raise IRError(f"{program.name}: %{node.id} = {node.op} uses undefined %{missing[0]}")
        try:
            inferred = op_def(node.op).infer([types[a] for a in node.args], node.attrs)
        except OpError as exc:
            raise IRError(f"{program.name}: %{node.id}: {exc}") from None
        if inferred != node.type:
            raise IRError(f"{program.name}: %{node.id} = {node.op} is recorded as {node.type} but its inputs give {inferred}")
        types[node.id] = node.type
    for name, nid in program.outputs.items():
        if nid not in types:
            raise IRError(f"{program.name}: output {name} refers to undefined %{nid}")
