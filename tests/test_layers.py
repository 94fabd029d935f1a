"""The rules of the architecture (docs/how-it-works.md, "The layers"), held by reading every
module's imports, those inside functions included, and by watching what a run loads.

- lisp/ knows nothing of tensors or ML; ir/ knows nothing of Lisp; runtime/ knows neither
  Lisp nor the compiler.
- The core never imports Ray, orchestration/ or workers/; the CLI reaches them only inside
  the verbs that ask for them (`sweep --ray`, `submit`).
- A verb's module never imports another verb's module.
- There is one way to start a run: sexpgpu/session.py is the only module that builds the
  runtime's RunOptions and calls its `train`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conftest import REPO

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
    (tmp_path / "experiment.json").write_text(experiment.model_dump_json())
    program = f"""
import json, sys
from sexpgpu.ir.experiment import Experiment
from sexpgpu.runtime.attempt import RunOptions, train
experiment = Experiment.model_validate_json(open({str(tmp_path / "experiment.json")!r}).read())
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
