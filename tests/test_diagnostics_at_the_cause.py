"""Diagnostics that name the cause: a deftarget above its defeval says the order is wrong and
where the defeval is; a misspelt module-qualified name gets "did you mean"; the finite guard
names the user's call first and the standard library's line after it. Exact messages and
positions, as tests/test_diagnostics.py checks every code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.lisp.diagnostics import Diagnostic

HEAD = '(require "sexpgpu/nn" :as nn)\n(require "sexpgpu/optim" :as optim)\n'
LOADERS = ("(defloader train :source (synthetic :spirals :n 256 :classes 3) :fields ((x :f32 (2)) (y :i32 ())) :batch 32)\n"
           "(defloader val :source (synthetic :spirals :n 256 :classes 3 :seed 1) :fields ((x :f32 (2)) (y :i32 ())) :batch 32)\n")
MLP = "(defpart net (nn:mlp 2 8 3))\n"
CE = "(defobjective (batch) (nn:cross-entropy (net (field batch x)) (field batch y)))\n"
EVALUATE = "(defevaluate (batch)\n  (metric acc (nn:accuracy (net (field batch x)) (field batch y))))\n"
TAIL = '(defgroups (all "**" (optim:sgd :lr 0.1)))\n(defrun :steps 1)\n'
NN_SOURCE = (REPO / "sexpgpu" / "lib" / "nn.lisp").read_text(encoding="utf-8")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def error_of(project: Path, text: str) -> Diagnostic:
    (project / "t.lisp").write_text(text)
    errors = [d for d in compile_file(Path("t.lisp")).diagnostics if d.severity == "error"]
    assert len(errors) == 1, errors
    return errors[0]


def test_a_deftarget_above_its_defeval_says_the_order_is_the_problem(project: Path) -> None:
    diag = error_of(project, HEAD + LOADERS + MLP + CE + EVALUATE + "(deftarget val acc :>= 0.9)\n(defeval val :every 10)\n" + TAIL)
    assert (diag.code, diag.file, diag.line, diag.col) == ("C008", "t.lisp", 9, 1)
    assert diag.message == ("deftarget val acc: the defeval val comes later, at t.lisp:10:1; "
                            "move it above the deftarget (a deftarget names a defeval defined before it)")


def test_a_deftarget_whose_defeval_never_comes_names_the_evals(project: Path) -> None:
    diag = error_of(project, HEAD + LOADERS + MLP + CE + EVALUATE + "(deftarget vol acc :>= 0.9)\n(defeval val :every 10)\n" + TAIL)
    assert (diag.code, diag.file, diag.line, diag.col) == ("C008", "t.lisp", 9, 1)
    assert diag.message == "deftarget vol acc: no defeval named vol (evals: val)"
    alone = error_of(project, HEAD + LOADERS + MLP + CE + "(deftarget val acc :>= 0.9)\n" + TAIL)
    assert (alone.code, alone.line, alone.col, alone.message) == ("C008", 7, 1, "deftarget val acc: no defeval named val (evals: none)")


def test_a_misspelt_module_name_gets_did_you_mean(project: Path) -> None:
    diag = error_of(project, HEAD + LOADERS + "(defpart net (nn:mpl 2 8 3))\n" + CE + TAIL)
    assert (diag.code, diag.file, diag.line, diag.col) == ("M004", "t.lisp", 5, 15)
    assert diag.message == "module `nn` exports no `mpl`; did you mean `mlp`?"
    imported = error_of(project, '(require "sexpgpu/nn" :as nn :import (cross-entropie))\n')
    assert (imported.code, imported.line, imported.col) == ("M004", 1, 1)
    assert imported.message == "module `nn` exports no `cross-entropie`, so it cannot be imported; did you mean `cross-entropy`?"
    nothing_close = error_of(project, HEAD + "(list nn:zzzzqq)\n")
    assert nothing_close.message == "module `nn` exports no `zzzzqq`"


OVERFLOW = HEAD + LOADERS.splitlines(keepends=True)[0] + MLP + (
    "(defobjective (batch)\n"
    "  (nn:cross-entropy (net (* 3e38 (field batch x))) (field batch y)))\n") + TAIL


def test_the_finite_guard_names_the_users_call_and_then_the_library_line(project: Path) -> None:
    """An input of 3e38 overflows the first layer's matmul, staged in nn.lisp: the run's
    note and its nonfinite event name the user's `(net ...)` call first, the library's line
    after it."""
    (project / "t.lisp").write_text(OVERFLOW)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SEXPGPU_CACHE": str(project / "cache")}
    done = subprocess.run([sys.executable, "-m", "sexpgpu", "run", "t.lisp", "--store", "runs", "--device", "numpy"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    matmul = next(i for i, line in enumerate(NN_SOURCE.splitlines(), 1) if "(defmodel linear" in line)
    matmul = next(i for i, line in enumerate(NN_SOURCE.splitlines(), 1) if i > matmul and "(matmul x w)" in line)
    col = NN_SOURCE.splitlines()[matmul - 1].index("(matmul x w)") + 1
    library = f"sexpgpu/lib/nn.lisp:{matmul}:{col}"
    said = f"matmul (%5) at t.lisp:6:21 in net.layers.0 created it (inside the standard library, at {library})"
    assert f"non-finite at step 1: {said}" in done.stdout.splitlines(), done.stdout
    (run,) = (project / "runs").iterdir()
    (event,) = [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines()) if e["kind"] == "nonfinite"]
    assert (event["location"], event["library_location"], event["message"]) == ("t.lisp:6:21", library, said)
