"""What the docs say is missing is missing: each case quotes a page's claim that a feature
does not exist, is refused or has no effect, and checks it (issue 14, item 22). A feature
that arrives makes its case fail, so the page's claim goes with it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.lisp.program import new_program

# (page, what it claims, source, the error code of the last form or None, its printed value)
CLAIMS: list[tuple[str, str, str, Optional[str], Optional[str]]] = [
    ("it-is-common-lisp.md", "no defpackage", '(defpackage :mine (:use :cl))', "E101", None),
    ("it-is-common-lisp.md", "no in-package", "(in-package :mine)", "E101", None),
    ("it-is-common-lisp.md", "#p is R005", '#p"/tmp"', "R005", None),
    ("it-is-common-lisp.md", "#c is R005", "#c(1 2)", "R005", None),
    ("it-is-common-lisp.md", "#n= is R005", "#1=(a . #1#)", "R005", None),
    ("it-is-common-lisp.md", "(the (values ...) form) is not checked", '(the (values integer) "a")', None, '"a"'),
    ("it-is-common-lisp.md", "no tail-call elimination: 20,000 tail calls are L002",
     "(defun count-down (n) (if (= n 0) :done (count-down (- n 1))))\n(count-down 20000)", "L002", None),
    ("it-is-common-lisp.md", "nested splicing ,@,@ is E105", "(defmacro m (x) ``(list ,@,@x))\n(m ((list 1 2)))", "E105", None),
    ("it-is-common-lisp.md", "&environment is bound to nil", "(defmacro env-of (&environment e) `',e)\n(env-of)", None, "nil"),
    ("it-is-common-lisp.md", "a condition type of your own is caught by an error clause",
     "(handler-case (error 'my-error) (error () :caught))", None, ":caught"),
    ("macros-and-symbols.md", ",,@x is not supported either", "(defmacro m (x) ``(list ,,@x))\n(m (1 2))", "E105", None),
    ("functions-and-bindings.md", "setq of an undeclared variable makes a global, silently",
     "(defun set-it () (setq fresh-global 5))\n(set-it)\nfresh-global", None, "5"),
]


@pytest.mark.parametrize("page, claim, source, code, value", CLAIMS, ids=[f"{c[0]}: {c[1]}" for c in CLAIMS])
def test_what_a_page_says_is_missing_is_missing(page: str, claim: str, source: str, code: Optional[str], value: Optional[str]) -> None:
    results = new_program(None).eval_text(source)
    last = results[-1]
    if code is not None:
        assert last.error is not None, f"{page}: '{claim}', but {source!r} returned {last.values}"
        assert last.error.code == code, f"{page}: '{claim}': {last.error.code} {last.error.message}"
    else:
        assert last.error is None, f"{page}: '{claim}': {last.error.code} {last.error.message}"
        assert last.values == [value], f"{page}: '{claim}': {last.values}"


RUN_FILE = """(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defloader train :source (synthetic :spirals :n 64 :seed 0) :fields ((x :f32 (2)) (y :i32 ())) :batch 8)
(defpart net (nn:mlp 2 4 3))
(defobjective (batch)
  {objective})
(defgroups (all "**" (optim:sgd :lr 0.1)))
(defrun :steps 1)
"""
CE = "(nn:cross-entropy (net (field batch x)) (field batch y))"


@pytest.mark.parametrize("subscripts", ["...i,ij->...j", "ii,ij->ij"], ids=["ellipsis", "diagonal"])
def test_einsum_has_no_ellipsis_and_no_diagonal(subscripts: str, tmp_path: Path) -> None:
    """tensor-operations.md: "`...` and an index repeated within one operand (a diagonal)
    are not supported"."""
    (tmp_path / ".git").mkdir()
    path = tmp_path / "e.lisp"
    square = "(let ((x (field batch x))) (einsum \"%s\" (matmul (transpose x) x) (matmul (transpose x) x)))" % subscripts
    path.write_text(RUN_FILE.format(objective=f"(+ {CE} (mean {square}))"))
    (error,) = [d for d in compile_file(path).diagnostics if d.severity == "error"]
    assert error.code == "T001" and "is not supported" in error.message, error.headline()


def test_a_tap_in_an_optimizer_update_records_nothing_and_warns_nothing(tmp_path: Path) -> None:
    """writing-diagnostics.md: "A `diagnostic` form in an optimizer update or in
    `defevaluate` is accepted, but it records nothing in this release"."""
    (tmp_path / ".git").mkdir()
    path = tmp_path / "t.lisp"
    text = RUN_FILE.format(objective=CE).replace(
        "(defloader", "(defdiagnostic peak (x) (max (abs x)))\n"
        "(defoptimizer tapped (&key lr)\n  (optimizer-update (param grad ctx)\n    (- param (* lr (diagnostic peak grad)))))\n(defloader", 1
    ).replace("(optim:sgd :lr 0.1)", "(tapped :lr 0.1)").replace("(defrun :steps 1)", "(defrun :steps 1 :diagnostics (:every 1 :select (\"**\")))")
    path.write_text(text)
    result = compile_file(path)
    assert result.experiment is not None and not result.diagnostics, [d.headline() for d in result.diagnostics]
    assert result.experiment.run.diagnostics is not None
    assert not [n for n in result.experiment.run.diagnostics.ir_names if n.startswith("peak/")]
    # so selecting it selects nothing, which is an error at the glob (diagnostics.md)
    path.write_text(text.replace('(:every 1 :select ("**"))', '(:every 1 :select ("peak/**"))'))
    (error,) = compile_file(path).diagnostics
    assert error.code == "C008" and error.message.startswith('defrun :diagnostics :select "peak/**" matches'), error.headline()


def test_the_compile_event_has_no_seconds_and_no_cached_yet(tmp_path: Path) -> None:
    """jsonl-events.md: the compile event's `seconds` and `cached` are "allowed but not
    written yet"; run.start does write host, worker and device."""
    import json

    from sexpgpu.runtime.attempt import RunOptions, train

    (tmp_path / ".git").mkdir()
    path = tmp_path / "r.lisp"
    path.write_text(RUN_FILE.format(objective=CE))
    result = compile_file(path)
    assert result.experiment is not None
    done = train(result.experiment, RunOptions(store=str(tmp_path / "runs"), signals=False), say=lambda _: None)
    events = [json.loads(line) for line in (tmp_path / "runs" / done.slug / "events.jsonl").read_text().splitlines()]
    (start,) = [e for e in events if e["kind"] == "run.start"]
    (compiled,) = [e for e in events if e["kind"] == "compile"]
    # train() with the default options runs the NumPy reference backend, and says so
    assert {"host", "worker", "device"} <= set(start) and start["device"] == "numpy"
    assert "seconds" not in compiled and "cached" not in compiled
