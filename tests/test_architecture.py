"""Rules about how the code is put together. One test function per rule."""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional

import numpy as np
import pytest

from conftest import REPO
from sexpgpu.ir.builder import Builder
from sexpgpu.ir.dtypes import DType
from sexpgpu.ir.graph import Node, Program, TensorType
from sexpgpu.ir.ops import OPS, OpDef, OpKind, all_ops, no_flops
from sexpgpu.runtime.cuda.codegen import KernelSource, assemble, declare
from sexpgpu.runtime.cuda.fusion import lower
from sexpgpu.runtime.cuda.lowering import LOWERINGS_BY_KIND, LOWERINGS_BY_OP, KernelLine, Lowered, LoweringContext, Placement, StepRun, lowering_for
from sexpgpu.runtime.cuda.plan import report
from sexpgpu.runtime.cuda.steps import NodeStep

ImportGraph = dict[str, set[str]]


def module_name(path: Path) -> str:
    """`sexpgpu/runtime/cuda/fusion.py` -> `sexpgpu.runtime.cuda.fusion` (a package is named
    by its folder)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_under(package: str) -> dict[str, Path]:
    folder = REPO.joinpath(*package.split("."))
    return {module_name(path): path for path in sorted(folder.rglob("*.py"))}


def imported_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names (relative levels resolved)."""
    if node.level == 0:
        return node.module or ""
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Every module of KNOWN that MODULE imports, wherever the import statement is: at the
    top, inside a function, under TYPE_CHECKING. `from pkg import name` imports the module
    pkg.name when there is one, and pkg itself in any case."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = imported_base(module, is_package, node)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known and name != module}


def import_graph(package: str) -> ImportGraph:
    """Module -> the modules of PACKAGE it imports."""
    modules = modules_under(package)
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def find_cycle(graph: ImportGraph) -> Optional[list[str]]:
    """One import cycle of GRAPH as [a, b, ..., a], or None when it is acyclic (a depth-first
    walk; a module met again while still on the walk's path closes a cycle)."""
    finished: set[str] = set()
    for start in sorted(graph):
        if start in finished:
            continue
        path = [start]
        unvisited = [iter(sorted(graph[start]))]
        while unvisited:
            target = next(unvisited[-1], None)
            if target is None:
                unvisited.pop()
                finished.add(path.pop())
            elif target in path:
                return path[path.index(target):] + [target]
            elif target not in finished:
                path.append(target)
                unvisited.append(iter(sorted(graph[target])))
    return None


def test_no_import_cycle_inside_the_runtime() -> None:
    """sexpgpu/runtime/ imports in one direction: no module reaches itself through the
    modules it imports, counting imports inside functions (a lazy import that closes a
    circle is still a circle) and under TYPE_CHECKING."""
    graph = import_graph("sexpgpu.runtime")
    assert "sexpgpu.runtime.cuda.fusion" in graph and graph["sexpgpu.runtime.cuda.fusion"], "the graph found no imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle inside sexpgpu/runtime/: " + " -> ".join(cycle or [])


def test_every_op_declares_a_kind_and_has_a_cuda_lowering() -> None:
    """The op table is the one place an op is declared: each entry says its kind, each kind
    has a CUDA lowering (so an op without a rule of its own still lowers), and every rule
    registered by name lowers an op of the table."""
    ops = all_ops()
    assert all(isinstance(op.kind, OpKind) for op in ops.values())
    assert set(OpKind) == set(LOWERINGS_BY_KIND), set(OpKind) ^ set(LOWERINGS_BY_KIND)
    assert set(LOWERINGS_BY_OP) <= set(ops), set(LOWERINGS_BY_OP) - set(ops)
    for op in ops.values():
        lowering_for(op)


def reverse_kernel(node: Node, program: Program) -> KernelSource:
    """Each row of the argument, back to front: out[r, c] = in[r, C - 1 - c]."""
    types = program.types()
    width = types[node.args[0]].shape[-1]
    decls, params = declare([node.args[0]], [node.id], types)
    body = [f"    out0[i] = in0[(i / {width}LL) * {width}LL + ({width - 1}LL - i % {width}LL)];"]
    return assemble("sx_reverse", decls, "i", body, params, node.type.size, 0)


@dataclass
class ReverseStep(NodeStep):
    kind: ClassVar[str] = "reverse"

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        return [reverse_kernel(self.node, program)]

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        out = run.buffer(self.node.id)
        run.launch(kernels[0], [run.contiguous(self.node.args[0]), out])
        run.set(self.node.id, out)

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        kernel = reverse_kernel(self.node, lowered.program)
        return KernelLine(step=index, kind=self.kind, kernel=kernel.name, nodes=[lowered.label(self.node)],
                          elements=kernel.size, bytes=kernel.bytes, flops=0)


def lower_reverse(node: Node, context: LoweringContext) -> Placement:
    return ReverseStep(node)


@pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
def test_an_op_with_a_kernel_of_its_own_needs_only_its_entry_and_its_lowering(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new op, declared by one entry and lowered by one rule with its step type, runs on the
    NumPy backend, is lowered, reported and planned for the CUDA device, and computes the NumPy
    backend's result on the emulated device: nothing else in the runtime names it."""
    from cuda_host import HostRunner

    from sexpgpu.runtime.cuda.executor import ArrayDevice, LoweredProgram
    from sexpgpu.runtime.numpy_backend import CompiledProgram

    def kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
        return np.ascontiguousarray(xs[0][..., ::-1])

    entry = OpDef("reverse_rows", lambda types, attrs: types[0], kernel, grad=None, kind=OpKind.LAYOUT, arity=1, flops=no_flops)
    all_ops()
    monkeypatch.setitem(OPS, entry.name, entry)
    monkeypatch.setitem(LOWERINGS_BY_OP, entry.name, lower_reverse)

    b = Builder("reverse")
    x = b.input("x", "data", TensorType(dtype=DType.f32, shape=(3, 5)))
    flipped = b.op("reverse_rows", b.op("exp", x))
    program = b.program({"out": b.op("add", flipped, x)})
    assert [s.kind for s in lower(program).steps] == ["fused", "reverse", "fused"]
    line = report(program).kernels[1]
    assert line.kernel.startswith("sx_reverse_") and line.nodes[0].startswith("%2 reverse_rows")
    feeds = {"x": np.arange(15, dtype=np.float32).reshape(3, 5) / 10}
    want = CompiledProgram(program).run_copy(feeds)["out"]
    got = LoweredProgram(program, ArrayDevice(np, HostRunner())).run(feeds)["out"]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(want, np.exp(feeds["x"])[:, ::-1] + feeds["x"], rtol=1e-6)
