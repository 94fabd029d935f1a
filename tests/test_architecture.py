"""Rules about how the code is put together, one test function per rule (docs/how-it-works.md,
"The layers" and "Adding an op"). Imports are read from every module's source, those
inside functions included, so a lazy import cannot hide a broken rule.

- lisp/ knows nothing of tensors or ML; ir/ knows nothing of Lisp; runtime/ knows neither
  Lisp nor the compiler, and a run loads neither.
- No import circle inside runtime/; lisp/'s bottom modules (types, objects, typespecs) import
  nothing of lisp/ that imports them back.
- The lowering (runtime/lower/) is device-neutral: the CPU device (runtime/cpu/) and the CUDA
  device (runtime/cuda/) import it, neither imports the other, and it imports neither; it
  writes no CUDA syntax (the CUDA dialect, runtime/cuda/dialect.py, defines its names).
- The core never imports Ray, orchestration/ or workers/; the CLI reaches them only inside
  the verbs that ask for them (`sweep --ray`, `submit`).
- A verb's module never imports another verb's module.
- There is one way to start a run: sexpgpu/session.py.
- results/ and dashboard/ (runs, ui, plot) only read: no Lisp, no compiler, no session.
- Each op is declared once, with its kind; adding one with its own kernel touches its
  entry and one lowering.
- A device writes a step's kernels by the emitter registered for the step's type and the
  device (runtime/lower/emitters.py), never by an isinstance chain on step types.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
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
from sexpgpu.records import dump_json
from sexpgpu.runtime.lower.codegen import KernelSource, assemble, declare
from sexpgpu.runtime.lower.fusion import lower
from sexpgpu.runtime.lower.lowering import LOWERINGS_BY_KIND, LOWERINGS_BY_OP, KernelLine, Lowered, LoweringContext, Placement, StepRun, lowering_for
from sexpgpu.runtime.lower.plan import report
from sexpgpu.runtime.lower.steps import NodeStep

PACKAGES = ("sexpgpu", "orchestration", "workers")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted (relative imports resolved)
    line: int
    in_function: bool
    type_only: bool = False  # under `if TYPE_CHECKING:`: for the type checker, never run


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[Import]:
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            typing = type_only or (isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING")
            if isinstance(child, ast.Import):
                found.extend(Import(name, alias.name, child.lineno, inside, typing) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                found.append(Import(name, base, child.lineno, inside, typing))
                found.extend(Import(name, f"{base}.{alias.name}", child.lineno, inside, typing) for alias in child.names)
            visit(child, inside, typing)

    visit(tree, False, False)
    return found


def all_imports() -> list[Import]:
    return [i for package in PACKAGES for path in sorted((REPO / package).rglob("*.py")) for i in imports_of(path)]


def under(target: str, prefix: str) -> bool:
    return target == prefix or target.startswith(prefix + ".")


def broken(rule: str, offenders: list[Import]) -> str:
    return f"{rule}:\n" + "\n".join(f"  {i.module}:{i.line} imports {i.target}" for i in offenders)


ImportGraph = dict[str, set[str]]


def import_graph(package: str) -> ImportGraph:
    """Module -> the modules of PACKAGE it imports (`from pkg import name` imports the module
    pkg.name when there is one, and pkg itself in any case)."""
    paths = {module_name(path): path for path in sorted(REPO.joinpath(*package.split(".")).rglob("*.py"))}
    return {name: {i.target for i in imports_of(path) if i.target in paths and i.target != name} for name, path in paths.items()}


def reaches(graph: ImportGraph, start: str, goal: str) -> bool:
    """Whether GOAL is START or imported from it, directly or through others, in GRAPH."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name == goal:
            return True
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return False


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
    assert "sexpgpu.runtime.lower.fusion" in graph and graph["sexpgpu.runtime.lower.fusion"], "the graph found no imports"
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

    from sexpgpu.runtime.lower.executor import ArrayDevice, LoweredProgram
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


def step_type_names() -> set[str]:
    """The names of the lowering's step classes (the classes of its step modules that write
    kernels and a report line)."""
    from sexpgpu.runtime.lower import attention, attention_gemm, images, steps

    return {name for module in (steps, images, attention, attention_gemm) for name, value in vars(module).items()
            if isinstance(value, type) and value.__module__ == module.__name__
            and callable(getattr(value, "kernels", None)) and callable(getattr(value, "describe", None))}


def test_no_device_dispatches_on_step_types_with_isinstance() -> None:
    """runtime/cpu/ and runtime/cuda/ never ask `isinstance(x, SomeStep)`: each step type's
    emitter is registered for its device (`register_emitter(..., platform=)`)."""
    names = step_type_names()
    assert {"FusedGroup", "ReduceGroup", "RowGroup", "AttentionStep", "AttentionGemms", "ConvStep"} <= names, names
    offenders = []
    for folder in ("cpu", "cuda"):
        for path in sorted((REPO / "sexpgpu" / "runtime" / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2:
                    classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                    if any(isinstance(c, ast.Name) and c.id in names for c in classes):
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, "isinstance on a step type in a device package: " + ", ".join(offenders)


def test_an_emitter_is_found_by_step_type_and_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    """The emitter registered for a step's type on a platform writes its kernels; a subclass
    without its own gets its base's; another platform's, or none, leaves the default; a second
    registration for one (type, platform) is refused."""
    from sexpgpu.runtime.cpu import hostc
    from sexpgpu.runtime.lower.attention import AttentionGradStep, AttentionStep
    from sexpgpu.runtime.lower.emitters import EMITTERS, emitter_for, register_emitter
    from sexpgpu.runtime.lower.steps import FusedGroup, ReduceGroup, RowGroup

    for step_type in (FusedGroup, ReduceGroup, RowGroup, AttentionStep, AttentionGradStep):
        assert (step_type, hostc.PLATFORM) in EMITTERS, step_type
    assert EMITTERS[(AttentionGradStep, "cpu")] is not EMITTERS[(AttentionStep, "cpu")]

    class Base:
        pass

    class Derived(Base):
        pass

    def default() -> str:
        return "default"

    def own() -> str:
        return "own"

    monkeypatch.setattr("sexpgpu.runtime.lower.emitters.EMITTERS", dict(EMITTERS))
    register_emitter(Base, platform="cpu")(own)
    assert emitter_for(Derived(), "cpu", default)() == "own"
    assert emitter_for(Derived(), "cuda", default)() == "default"
    assert emitter_for(object(), "cpu", default)() == "default"
    with pytest.raises(ValueError, match="registered twice"):
        register_emitter(Base, platform="cpu")(default)


def test_lisp_knows_nothing_of_tensors_and_ir_nothing_of_lisp() -> None:
    imports = all_imports()
    lisp = [i for i in imports if under(i.module, "sexpgpu.lisp") and any(under(i.target, f"sexpgpu.{p}") for p in ("ir", "compile", "runtime", "cli", "session"))]
    assert not lisp, broken("sexpgpu.lisp imports a layer above it", lisp)
    ir = [i for i in imports if under(i.module, "sexpgpu.ir") and any(under(i.target, f"sexpgpu.{p}") for p in ("lisp", "compile", "runtime", "cli", "session"))]
    assert not ir, broken("sexpgpu.ir imports Lisp or a layer above it", ir)


def test_the_runtime_knows_neither_lisp_nor_the_compiler() -> None:
    offenders = [i for i in all_imports() if under(i.module, "sexpgpu.runtime")
                 and any(under(i.target, f"sexpgpu.{p}") for p in ("lisp", "compile", "cli", "session", "bundle"))]
    assert not offenders, broken("sexpgpu.runtime imports Lisp, the compiler or a layer above it", offenders)


DEVICE_PACKAGES = ("sexpgpu.runtime.lower", "sexpgpu.runtime.cpu", "sexpgpu.runtime.cuda")


def test_the_lowering_is_shared_and_the_devices_know_nothing_of_each_other() -> None:
    """runtime/cpu/ (the host dialect, the ctypes device) and runtime/cuda/ (the CUDA dialect,
    the CuPy device) import the lowering (runtime/lower/); neither imports the other, and the
    lowering imports neither, lazily or not."""
    imports = all_imports()
    for device in DEVICE_PACKAGES[1:]:
        assert any(under(i.module, device) and under(i.target, "sexpgpu.runtime.lower") for i in imports), f"{device} no longer imports the lowering"
    offenders = [i for i in imports for package in DEVICE_PACKAGES if under(i.module, package)
                 and any(under(i.target, other) for other in DEVICE_PACKAGES if other != package and other != "sexpgpu.runtime.lower")]
    assert not offenders, broken("a device package imports the other device, or the lowering imports a device", offenders)


CUDA_SYNTAX = re.compile(r"\b(blockIdx|threadIdx|blockDim|gridDim|warpSize)\b|__(global|shared|device|host|constant|forceinline|launch_bounds)__|"
                         r"__sync(threads|warp)\b|__CUDACC|__(umulhi|uint_as_float|float_as_uint|fadd_rn|fmul_rn|shfl\w*)\b|<<<")


def test_the_lowering_writes_no_cuda_syntax_and_the_cuda_dialect_defines_its_names() -> None:
    """runtime/lower/ writes its kernels over the dialect's names (codegen.DIALECT_NAMES: a
    kernel's head, its lanes and groups, shared memory, barriers, a few intrinsics), never in
    CUDA's own syntax; runtime/cuda/dialect.py defines every one of those names."""
    from sexpgpu.runtime.cuda.dialect import CUDA_PRELUDE
    from sexpgpu.runtime.lower.codegen import DIALECT_NAMES, PRELUDE

    offenders = []
    for path in sorted((REPO / "sexpgpu" / "runtime" / "lower").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found = CUDA_SYNTAX.search(line)
            if found:
                offenders.append(f"{path.relative_to(REPO)}:{number}: {found.group(0)}")
    assert not offenders, "CUDA syntax in the device-neutral lowering (it belongs in runtime/cuda/dialect.py): " + ", ".join(offenders)
    dialect = CUDA_PRELUDE.replace(PRELUDE, "")
    undefined = [name for name in DIALECT_NAMES if not re.search(rf"#define {name}\b|\b{name}\(", dialect)]
    assert not undefined, f"the CUDA dialect leaves {undefined} undefined"


def test_a_run_loads_no_lisp_and_no_compiler_module(tmp_path: Path) -> None:
    """Beyond the imports: train an experiment loaded from its JSON (what a bundle or a
    worker could carry) with diagnostics sampled at every step, and look at sys.modules."""
    from sexpgpu.compile.pipeline import compile_file

    source = (REPO / "examples" / "quickstart.lisp").read_text().replace(
        "(defrun :steps 300 :seed 0)", '(defrun :steps 4 :seed 0 :diagnostics (:every 1 :select ("grad-norm/**" "act/**")))')
    (tmp_path / ".git").mkdir()
    path = tmp_path / "q.lisp"
    path.write_text(source)
    experiment = compile_file(path).experiment
    assert experiment is not None and experiment.run.diagnostics is not None
    (tmp_path / "experiment.json").write_bytes(dump_json(experiment))
    program = f"""
import json, sys
from sexpgpu.ir.experiment import Experiment
from sexpgpu.records import load_json
from sexpgpu.runtime.attempt import RunOptions, train
experiment = load_json(Experiment, open({str(tmp_path / "experiment.json")!r}).read())
outcome = train(experiment, RunOptions(store={str(tmp_path / "runs")!r}, signals=False), say=lambda _: None)
print(json.dumps({{"code": int(outcome.exit_code), "loaded": sorted(m for m in sys.modules if m.startswith(("sexpgpu.lisp", "sexpgpu.compile", "sexpgpu.cli", "sexpgpu.session", "ray", "orchestration", "workers")))}}))
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["code"] == 0, report
    assert report["loaded"] == [], report["loaded"]
    events = [json.loads(line) for line in (tmp_path / "runs").glob("*/events.jsonl").__next__().read_text().splitlines()]
    assert sum(e["kind"] == "diagnostic" for e in events) == 4  # the diagnostic steps did run


def test_the_results_and_the_dashboard_only_read_runs() -> None:
    """sexpgpu/results/ and sexpgpu/dashboard/ (runs, ui, plot) read run folders through the
    runtime's readers: they know neither Lisp nor the compiler, nor the session that starts
    runs, nor the CLI."""
    offenders = [i for i in all_imports() if (under(i.module, "sexpgpu.results") or under(i.module, "sexpgpu.dashboard"))
                 and any(under(i.target, f"sexpgpu.{p}") for p in ("lisp", "compile", "cli", "session", "bundle"))]
    assert not offenders, broken("sexpgpu.results or sexpgpu.dashboard imports Lisp, the compiler or a layer above it", offenders)


def test_the_core_reaches_the_cluster_only_inside_the_verbs_that_ask() -> None:
    cluster = ("ray", "orchestration", "workers")
    core = [i for i in all_imports() if under(i.module, "sexpgpu") and not i.type_only and any(under(i.target, c) for c in cluster)]
    at_import = [i for i in core if not i.in_function]
    assert not at_import, broken("a core module imports the cluster code when it is imported", at_import)
    outside_the_cli = [i for i in core if not under(i.module, "sexpgpu.cli")]
    assert not outside_the_cli, broken("the core outside the CLI reaches the cluster code", outside_the_cli)


def test_no_verb_imports_another_verbs_module() -> None:
    shared = {"sexpgpu.cli.common", "sexpgpu.cli.flags", "sexpgpu.cli.main", "sexpgpu.cli"}
    offenders = [i for i in all_imports() if under(i.module, "sexpgpu.cli") and i.module not in shared
                 and under(i.target, "sexpgpu.cli") and i.target.rpartition(".")[0] not in shared and i.target not in shared
                 and not i.target.startswith(i.module)]
    assert not offenders, broken("a verb's module imports another verb's module (shared flags go to cli/flags.py)", offenders)


def test_there_is_one_way_to_start_a_run() -> None:
    """Only the session builds RunOptions and calls the runtime's train (tests and the
    benchmarks of the runtime itself aside)."""
    starters = []
    for package in (*PACKAGES, "bench"):
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("RunOptions", "train"):
                    starters.append(f"{path.relative_to(REPO)}:{node.lineno} calls {node.func.id}(...)")
    allowed = {"sexpgpu/session.py", "sexpgpu/runtime/attempt.py"}
    assert [s for s in starters if s.split(":")[0] not in allowed] == [], starters


def test_the_bottom_modules_of_lisp_reach_up_nowhere() -> None:
    """types.py, objects.py and typespecs.py import no module of lisp/ that imports them back,
    lazily or not (issue 26): the printer, the builtins and the evaluator sit above them."""
    paths = {module_name(path): path for path in sorted((REPO / "sexpgpu" / "lisp").glob("*.py"))}
    graph = {name: {i.target for i in imports_of(path) if i.target in paths and i.target != name and not i.type_only}
             for name, path in paths.items()}

    offenders = [i for bottom in ("types", "objects", "typespecs") for i in imports_of(paths[f"sexpgpu.lisp.{bottom}"])
                 if i.target in paths and not i.type_only and i.target != i.module and reaches(graph, i.target, i.module)]
    assert not offenders, broken("a bottom module of lisp/ imports one above it", offenders)


def test_no_module_of_lisp_imports_lazily_one_that_imports_it() -> None:
    """A function-level import in lisp/ never breaks an import cycle (issue 26): what two
    modules share lives below both (scope.py, checks.py), and the chapters of builtins are
    installed from chapters.py, above them, not from builtins.py, which they import."""
    paths = {module_name(path): path for path in sorted((REPO / "sexpgpu" / "lisp").glob("*.py"))}
    found = {name: imports_of(path) for name, path in paths.items()}
    eager = {name: {i.target for i in imports if i.target in paths and i.target != name and not i.in_function and not i.type_only}
             for name, imports in found.items()}

    offenders = [i for imports in found.values() for i in imports
                 if i.in_function and not i.type_only and i.target in paths and i.target != i.module and reaches(eager, i.target, i.module)]
    assert not offenders, broken("a module of lisp/ imports lazily one that imports it back", offenders)
