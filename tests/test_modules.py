"""require: standard modules, relative libraries, scopes, imports, exports, once-only loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from sexpgpu.lisp.program import load_file


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text("")
    monkeypatch.chdir(root)
    return root


def check(path: Path, stdlib: Path | None = None) -> list[str]:
    _, diagnostics = load_file(path, stdlib=stdlib)
    return [d.headline() for d in diagnostics]


def value(path: Path, expr: str, stdlib: Path | None = None) -> str:
    program, diagnostics = load_file(path, stdlib=stdlib)
    assert program is not None and not diagnostics, [d.headline() for d in diagnostics]
    (result,) = program.eval_text(expr)
    assert result.error is None, result.error.headline()
    return result.values[0]


def test_standard_module_lookup(project: Path, tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "util.lisp").write_text("(defun double (x) (* 2 x))\n(defun %hidden (x) x)\n")
    (project / "main.lisp").write_text('(require "sexpgpu/util" :as u)\n(defparameter *r* (u:double 21))\n')
    assert value(Path("main.lisp"), "*r*", stdlib=lib) == "42"


def test_unknown_standard_module_lists_the_known_ones(project: Path, tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "nn.lisp").write_text("")
    (lib / "optim.lisp").write_text("")
    (project / "main.lisp").write_text('(require "sexpgpu/nnn" :as nn)\n')
    assert check(Path("main.lisp"), stdlib=lib) == [
        'main.lisp:1:1: error[M001]: no standard module "sexpgpu/nnn"; the standard modules are: "sexpgpu/nn", "sexpgpu/optim"'
    ]


def test_relative_library_with_prefix_and_import(project: Path) -> None:
    (project / "lib").mkdir()
    (project / "lib" / "blocks.lisp").write_text(
        "(defun width () 64)\n(defun twice (x) (* 2 x))\n(defmacro sq (x) `(* ,x ,x))\n(defvar *depth* 3)\n"
    )
    (project / "main.lisp").write_text(
        '(require "./lib/blocks.lisp" :as b :import (twice sq))\n(defparameter *r* (list (b:width) (twice 5) (sq 3) b:*depth*))\n'
    )
    assert value(Path("main.lisp"), "*r*") == "(64 10 9 3)"


def test_relative_paths_resolve_against_the_requiring_file(project: Path) -> None:
    (project / "a").mkdir()
    (project / "a" / "one.lisp").write_text('(require "./two.lisp" :as two)\n(defun one () (two:two))\n')
    (project / "a" / "two.lisp").write_text("(defun two () 2)\n")
    (project / "main.lisp").write_text('(require "./a/one.lisp" :as one)\n(defparameter *r* (one:one))\n')
    assert value(Path("main.lisp"), "*r*") == "2"


def test_each_module_is_evaluated_once(project: Path) -> None:
    (project / "counter.lisp").write_text("(defvar *loads* 0)\n(setq *loads* (+ *loads* 1))\n(defun loads () *loads*)\n")
    (project / "user.lisp").write_text('(require "./counter.lisp" :as c)\n(defun via-user () (c:loads))\n')
    (project / "main.lisp").write_text(
        '(require "./counter.lisp" :as c)\n(require "./user.lisp" :as u)\n(defparameter *r* (list (c:loads) (u:via-user)))\n'
    )
    assert value(Path("main.lisp"), "*r*") == "(1 1)"


def test_modules_have_their_own_scope(project: Path) -> None:
    (project / "m1.lisp").write_text("(defun helper () :one)\n(defun api () (helper))\n")
    (project / "m2.lisp").write_text("(defun helper () :two)\n(defun api () (helper))\n")
    (project / "main.lisp").write_text(
        '(require "./m1.lisp" :as m1)\n(require "./m2.lisp" :as m2)\n(defun helper () :main)\n'
        "(defparameter *r* (list (m1:api) (m2:api) (helper)))\n"
    )
    assert value(Path("main.lisp"), "*r*") == "(:one :two :main)"


def test_percent_names_are_not_exported(project: Path) -> None:
    (project / "m.lisp").write_text("(defun %secret () 1)\n(defun public () (%secret))\n")
    (project / "main.lisp").write_text('(require "./m.lisp" :as m)\n(m:%secret)\n')
    assert check(Path("main.lisp")) == ["main.lisp:2:2: error[M004]: module `m` exports no `%secret`"]


def test_import_of_a_missing_name(project: Path) -> None:
    (project / "m.lisp").write_text("(defun public () 1)\n")
    (project / "main.lisp").write_text('(require "./m.lisp" :as m :import (nothing))\n')
    assert check(Path("main.lisp")) == [
        "main.lisp:1:1: error[M004]: module `m` exports no `nothing`, so it cannot be imported"
    ]


def test_require_cannot_leave_the_project_root(project: Path, tmp_path: Path) -> None:
    (tmp_path / "evil.lisp").write_text("(defun evil () 1)\n")
    (project / "main.lisp").write_text('(require "../evil.lisp" :as e)\n')
    (diag,) = check(Path("main.lisp"))
    assert "error[M003]" in diag and "outside the project root" in diag
    (project / "abs.lisp").write_text(f'(require "{tmp_path / "evil.lisp"}" :as e)\n')
    (diag,) = check(Path("abs.lisp"))
    assert "error[M003]" in diag and "absolute paths are not allowed" in diag


def test_symlink_out_of_the_project_is_refused(project: Path, tmp_path: Path) -> None:
    (tmp_path / "evil.lisp").write_text("(defun evil () 1)\n")
    (project / "link.lisp").symlink_to(tmp_path / "evil.lisp")
    (project / "main.lisp").write_text('(require "./link.lisp" :as e)\n')
    (diag,) = check(Path("main.lisp"))
    assert "error[M003]" in diag


def test_standard_library_names_cannot_be_redefined(project: Path) -> None:
    (project / "main.lisp").write_text("(defun car (x) x)\n")
    assert check(Path("main.lisp")) == [
        "main.lisp:1:1: error[E107]: cannot define function `car`: it is part of SexpGPU's standard library; choose another name"
    ]
