"""Every diagnostic code: its exact message and position (docs/check-and-watch.md lists them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO

from sexpgpu.lisp.diagnostics import CODES, render
from sexpgpu.compile import pipeline
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.lisp.evaluator import Limits
from sexpgpu.lisp.program import load_file

NN_SOURCE = (REPO / "sexpgpu" / "lib" / "nn.lisp").read_text(encoding="utf-8")
HEAD = '(require "sexpgpu/nn" :as nn)\n(require "sexpgpu/optim" :as optim)\n'
LOADER = "(defloader train :source (synthetic :spirals :n 256 :classes 3) :fields ((x :f32 (2)) (y :i32 ())) :batch 32)\n"
GROUPS = '(defgroups (all "**" (optim:sgd :lr 0.1)))\n'
MLP = "(defpart net (nn:mlp 2 8 3))\n"
CE = "(defobjective (batch) (nn:cross-entropy (net (field batch x)) (field batch y)))\n"

# code: (file text, line, col, message, macro named in the diagnostic or None)
CASES: dict[str, tuple[str | bytes, int, int, str, str | None]] = {
    "R001": ("(defun f (x)\n  (+ x 1)\n", 3, 1, "unexpected end of input: the list opened at R001.lisp:1:1 is not closed; add `)`", None),
    "R002": ("(+ 1 2))", 1, 8, "unexpected `)`: no list is open here; delete it", None),
    "R003": ("(list a:b:c)", 1, 7, "`a:b:c` is not a valid symbol: use `prefix:name` with one colon", None),
    "R004": ("(list #\\Bogus)", 1, 7, "unknown character name `#\\Bogus`; use e.g. #\\a, #\\Space, #\\Newline, #\\Tab", None),
    "R005": ("#.(+ 1 2)", 1, 1, "`#.` (read-time evaluation) is refused: the reader never evaluates code", None),
    "R006": ("(list\n  (. 1))", 2, 4, "a dot cannot start a list: write `(a . b)`", None),
    "R007": (b'(list "\xff")', 1, 8, "byte 0xff at offset 7 is not valid UTF-8; save the file as UTF-8", None),
    "R008": ("(list #+(or sbcl 3) 1)", 1, 9,
             "`(or sbcl 3)` is not a feature expression: write a feature name such as sexpgpu, or (and ...), (or ...), (not x)", None),
    "E100": ("(defun f (x)\n  (+ x yy))\n(f 1)", 2, 8, "unbound variable `yy`", None),
    "E101": ("(frobnicate 1 2)", 1, 1, "undefined function `frobnicate`", None),
    "E102": ("(defun f (a b) a)\n(f 1)", 2, 1, "`f` takes 2 arguments, got 1", None),
    "E103": ('(list 1\n      (+ 1 "a"))', 2, 7, '`+`: argument 2 must be a number, got "a" (a string)', None),
    "E104": ('(error "learning rate ~a is negative" -1)', 1, 1, "learning rate -1 is negative", None),
    "E105": ("(let ((x 1 2)) x)", 1, 1, "malformed binding (x 1 2) in let: expected var or (var value)", None),
    "E106": ("(return-from nowhere 1)", 1, 1, "return-from: no enclosing block named `nowhere`", None),
    "E107": ("(defconstant +k+ 1)\n(setq +k+ 2)", 2, 1, "`+k+` is a constant and cannot be assigned or bound", None),
    "E108": ("(/ 1 0)", 1, 1, "`/`: division by zero", None),
    "E109": ('(let ((s "abc")) (setf (aref s 0) #\\z))', 1, 18, "strings are immutable in SexpGPU; build a new one with concatenate or format", "setf"),
    "E110": ("(defun f (&key &optional x) x)", 1, 1, "&optional is out of order in the lambda list", "defun"),
    "L001": ("(loop)", 1, 1, "evaluation step budget of 1000000 steps exhausted; is there an endless loop?", "loop"),
    "L002": ("(defun f (n) (f (1+ n)))\n(f 0)", 1, 14, "evaluation depth limit of 10000 nested calls exceeded in f; is the recursion unbounded?", None),
    "L004": ("(loop)", 1, 1, "evaluation time limit of 0.2 s exceeded; is there an endless loop or a very large computation?", "loop"),
    "L003": ("(length (make-string 100000000))", 1, 9, "allocation limit of 10000000 cells exceeded; is a list or string growing without bound?", None),
    "M001": ('(require "sexpgpu/nope" :as n)', 1, 1, 'no standard module "sexpgpu/nope"; the standard modules are: "sexpgpu/nn", "sexpgpu/optim"', None),
    "M002": ('(require "./cyc.lisp" :as c)', 1, 1, "require cycle: cyc.lisp -> cyc2.lisp -> cyc.lisp", None),
    "M003": ('(require "../outside.lisp" :as p)', 1, 1, "", None),
    "M004": ("(list zz:foo)", 1, 7, 'no module is bound to the prefix `zz` (prefixes here: none); add (require "sexpgpu/zz" :as zz) before this form', None),
    "M005": ("(require sexpgpu/nn)", 1, 1, 'malformed require: expected (require "sexpgpu/NAME" :as prefix [:import (names...)]) or (require "./file.lisp" :as prefix)', None),
    "W001": ('(warn "lr ~a looks large" 10)', 1, 1, "lr 10 looks large", None),
    "T001": (
        HEAD + "(defmodel bad ()\n  (defparam w (3 4))\n  (forward (x) (matmul x w)))\n" + LOADER + "(defpart net (bad))\n"
        "(defobjective (batch)\n  (mean (net (field batch x))))\n" + GROUPS + "(defrun :steps 1)\n",
        5, 16, "matmul: f32[32,2] @ f32[3,4]: inner dimensions 2 and 3 differ", None,
    ),
    "T002": (
        HEAD + LOADER + MLP + "(defobjective (batch)\n  (let ((logits (net (field batch x))))\n"
        "    (if (> (mean logits) 0) (mean logits) (neg (mean logits)))))\n" + GROUPS + "(defrun :steps 1)\n",
        7, 5, "a staged tensor (bool[]) is used as a truth value; control flow runs at compile time and data flow is staged: use (where c a b)", None,
    ),
    "T003": ("(relu 1.0)\n", 1, 1, "`relu` stages a tensor operation, which only happens inside forward, defobjective, defevaluate or an optimizer update", None),
    "C001": (HEAD + "(defknob lr 0.1)\n(defrun :steps 10)\n", 4, 1, "the file has no defloader: a run file needs at least one defloader, named train", None),
    "C002": (
        HEAD + "(defrun :steps 10)\n" + LOADER, 4, 1,
        "defloader after defrun: defrun must be the last form (order: require, defknob/defvariant/defsweep, definitions, defloader, defpart, defobjective, defevaluate/defeval/deftarget, defgroups, defcurriculum, defrun)",
        None,
    ),
    "C003": (HEAD + LOADER + MLP + CE + CE, 6, 1, "defobjective may appear once; the first is at C003.lisp:5:1", None),
    "C004": ("(defknob lr 2.0 :range (0 1))\n", 1, 1, "knob lr: 2.0 is outside its range [0, 1]", "defknob"),
    "C005": (
        HEAD + LOADER + MLP + CE + '(defgroups (w "**.w" (optim:sgd :lr 0.1)))\n(defrun :steps 1)\n', 6, 1,
        'parameter net.layers.0.b matches no group in defgroups; add a group such as (rest "**" ...)', None,
    ),
    "C006": (
        HEAD + LOADER + MLP + "(defobjective (batch) (net (field batch x)))\n" + GROUPS + "(defrun :steps 1)\n", 5, 1,
        "defobjective must return one f32 scalar loss, got f32[32,3]", None,
    ),
    "C007": (
        HEAD + LOADER + MLP + "(defpart extra (nn:linear 2 2))\n" + CE + GROUPS + "(defrun :steps 1)\n", 7, 1,
        "parameter extra.w is not used by the objective, so it gets no gradient; use it or freeze it in defgroups", None,
    ),
    "W002": (
        HEAD + LOADER + MLP + CE + '(defgroups (all "**" (optim:sgd :lr 0.1)) (never "net.*" :frozen))\n(defrun :steps 1)\n', 6, 1,
        'group never ("net.*") gets no parameter: earlier groups took every match (first match wins)', None,
    ),
    "C009": (
        HEAD + LOADER + "(defpart net (nn:mlp 2 1000000 3 :depth 2))\n" + CE + GROUPS + "(defrun :steps 1)\n", 4, 1,
        "the parameters, gradients and optimizer state need 8.0 TB, more than this machine's 64.0 GB of memory; make the model smaller", None,
    ),
    "C008": (HEAD + "(defloader train :source (synthetic :spirals) :fields ((x :f32 (2))))\n", 3, 1, "defloader train: :batch needs a positive integer, got nil", "defloader"),
}


# codes that need limits other than the defaults to appear quickly
LIMITS = {"L004": Limits(steps=10**12, seconds=0.2)}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / ".git").mkdir()
    (root / "cyc.lisp").write_text('(require "./cyc2.lisp" :as c2)\n')
    (root / "cyc2.lisp").write_text('(require "./cyc.lisp" :as c)\n')
    (tmp_path / "outside.lisp").write_text("(defun x () 1)\n")
    monkeypatch.chdir(root)
    return root


def test_every_code_has_a_case() -> None:
    assert set(CASES) == {c for c in CODES if c != "X001"}


@pytest.mark.parametrize("code", sorted(CASES))
def test_diagnostic(code: str, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "machine_memory", lambda: 64 * 10**9)  # C009's message names it
    text, line, col, message, macro = CASES[code]
    path = project / f"{code}.lisp"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    diagnostics = compile_file(Path(path.name), limits=LIMITS.get(code, Limits())).diagnostics
    assert diagnostics, f"{code}: no diagnostic"
    diag = diagnostics[-1]
    assert diag.code == code
    if code == "M002":
        assert diag.file == "cyc2.lisp"
    elif code == "M003":
        assert diag.message.startswith('require "../outside.lisp" resolves to ') and "outside the project root" in diag.message
    else:
        assert diag.file == path.name
    assert (diag.line, diag.col) == (line, col)
    if code != "M003":
        assert diag.message == message
    assert diag.macro == macro
    assert diag.severity == ("warning" if code.startswith("W") else "error")


def test_rendered_form_has_source_line_and_caret(project: Path) -> None:
    (project / "a.lisp").write_text('(defun f (x)\n  (+ x "one"))\n(f 3)\n')
    program, diagnostics = load_file(Path("a.lisp"))
    assert program is not None
    text = render(diagnostics[0], program.sources)
    assert text.splitlines()[:3] == [
        'a.lisp:2:3: error[E103]: `+`: argument 2 must be a number, got "one" (a string)',
        '   2 |   (+ x "one"))',
        "         ^",
    ]
    assert "note: while evaluating the top-level form at a.lisp:3:1" in text


def test_macro_expansion_points_at_call_site_and_names_macro(project: Path) -> None:
    (project / "m.lisp").write_text("(defmacro twice (x) `(progn ,x (car 5)))\n(defun g ()\n  (twice 1))\n(g)\n")
    program, diagnostics = load_file(Path("m.lisp"))
    diag = diagnostics[0]
    assert (diag.line, diag.col, diag.macro) == (3, 3, "twice")
    assert program is not None
    assert "note: in code expanded from macro `twice`" in render(diag, program.sources)


def test_prelude_macro_errors_point_at_user_code(project: Path) -> None:
    (project / "d.lisp").write_text("(defun h (xs)\n  (dolist (x xs)\n    (car x)))\n(h '(1))\n")
    _, diagnostics = load_file(Path("d.lisp"))
    assert (diagnostics[0].file, diagnostics[0].line, diagnostics[0].col) == ("d.lisp", 3, 5)


def test_an_error_inside_a_standard_module_is_reported_at_the_users_call(project: Path) -> None:
    """A tensor op that fails inside sexpgpu/nn is reported at the user's call into the
    library, with the library's line as a note."""
    (project / "t.lisp").write_text(
        HEAD + "(defloader train :source (synthetic :spirals :n 256 :classes 3) :fields ((x :f32 (2)) (y :i32 ())) :batch 32)\n"
        "(defpart net (nn:embedding 10 3))\n(defobjective (batch)\n  (mean (net (field batch x))))\n" + GROUPS + "(defrun :steps 1)\n"
    )
    result = compile_file(Path("t.lisp"))
    (diag,) = [d for d in result.diagnostics if d.severity == "error"]
    assert (diag.code, diag.message) == ("T001", "take: indices must be an integer tensor, got f32[32,2]")
    assert (diag.file, diag.line, diag.col) == ("t.lisp", 6, 9)
    (note,) = diag.notes
    take = next(i for i, line in enumerate(NN_SOURCE.splitlines(), 1) if "(take table ids)" in line)
    assert (note.message, note.file, note.line) == ("raised here, inside the standard library", "sexpgpu/lib/nn.lisp", take)
    assert result.program is not None
    assert render(diag, result.program.sources).splitlines()[1:] == [
        "   6 |   (mean (net (field batch x))))",
        "               ^",
        f"  note: sexpgpu/lib/nn.lisp:{take}:{note.col}: raised here, inside the standard library",
    ]


def test_a_wrong_layer_size_is_the_layers_error_at_the_users_call(project: Path) -> None:
    (project / "t.lisp").write_text(
        HEAD + "(defloader train :source (synthetic :spirals :n 256 :classes 3) :fields ((x :f32 (2)) (y :i32 ())) :batch 32)\n"
        "(defpart net (nn:mlp 3 8 3))\n(defobjective (batch)\n  (nn:cross-entropy (net (field batch x)) (field batch y)))\n" + GROUPS + "(defrun :steps 1)\n"
    )
    (diag,) = [d for d in compile_file(Path("t.lisp")).diagnostics if d.severity == "error"]
    assert diag.message == "`linear`: the input has shape (32 2), but this layer takes d-in=3 values on its last axis"
    assert (diag.file, diag.line, diag.col) == ("t.lisp", 6, 21)
    assert [n.file for n in diag.notes] == ["sexpgpu/lib/nn.lisp"]

NESTED_MODEL = (
    HEAD + "(defmodel wide (d)\n  (let ((h (* 2 d)))\n    {form})\n  (forward (x) x))\n" + LOADER
    + "(defpart net (wide 2))\n(defobjective (batch) (mean (net (field batch x))))\n" + GROUPS + "(defrun :steps 1)\n"
)


@pytest.mark.parametrize("form, name", [("(defparam w (d h))", "defparam w"), ("(defpart up (nn:linear d h))", "defpart up")])
def test_defparam_or_defpart_nested_in_a_defmodel_body_is_a_located_c008(form: str, name: str, project: Path) -> None:
    """Nested in a `let`, a defparam would be an undefined function and a defpart a second
    top-level part; both are C008 at the nested form, with the fix."""
    (project / "n.lisp").write_text(NESTED_MODEL.format(form=form))
    (diag,) = [d for d in compile_file(Path("n.lisp")).diagnostics if d.severity == "error"]
    assert diag.code == "C008" and (diag.file, diag.line, diag.col) == ("n.lisp", 5, 5)
    assert diag.message.startswith(f"{name} in defmodel wide is inside another form: ")
    assert "(defmodel wide (d &aux (h (* 2 d))) ...)" in diag.message


def test_defparam_outside_any_defmodel_is_c008(project: Path) -> None:
    (project / "p.lisp").write_text("(defparam w (2 3))\n")
    (diag,) = compile_file(Path("p.lisp")).diagnostics
    assert diag.code == "C008" and (diag.line, diag.col) == (1, 1)
    assert diag.message == "defparam w is only allowed as a direct form of a defmodel body"


def test_an_option_inside_a_group_is_c008_not_ignored(project: Path) -> None:
    """`:clip` belongs to the whole defgroups; written inside a group it was dropped silently."""
    groups = '(defgroups (all "**" (optim:sgd :lr 0.1) :clip 1.0))\n'
    (project / "g.lisp").write_text(HEAD + LOADER + MLP + CE + groups + "(defrun :steps 1)\n")
    (diag,) = [d for d in compile_file(Path("g.lisp")).diagnostics if d.severity == "error"]
    assert diag.code == "C008" and (diag.line, diag.col) == (6, 1)
    assert diag.message.startswith("defgroups all: a group is (NAME \"SELECTOR\" OPTIMIZER) and reads nothing after the optimizer, got (:clip 1.0)")
