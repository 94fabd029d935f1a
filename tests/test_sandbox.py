"""The compile-time language cannot touch files, the network, the environment or Python."""

from __future__ import annotations

import pytest

from sexpgpu.lisp.program import new_program

ESCAPES = [
    '(open "/etc/passwd")',
    '(with-open-file (s "/etc/passwd") (read-line s))',
    '(load "/etc/passwd")',
    '(probe-file "/etc/passwd")',
    '(directory "/*")',
    '(posix-getenv "HOME")',
    '(getenv "HOME")',
    '(run-program "/bin/sh" (list "-c" "true"))',
    '(sb-ext:run-program "/bin/sh" nil)',
    '(python-eval "1")',
    '(read-from-string "#.(car 1)")',
    '(require "/etc/passwd" :as p)',
    '(require "../../../../../../etc/passwd" :as p)',
    '(funcall (intern "OPEN") "/etc/passwd")',
    "(symbol-function 'open)",
]


@pytest.mark.parametrize("source", ESCAPES)
def test_no_way_out(source: str) -> None:
    program = new_program(None)
    results = program.eval_text(source)
    assert results[-1].error is not None, f"{source} returned {results[-1].values}"
    assert results[-1].error.code != "X001"


def test_no_python_objects_reachable() -> None:
    program = new_program(None)
    # *features* is CL's (#+ and #- read it): a list of keywords, nothing of the host
    (result,) = program.eval_text("(list (fboundp 'eval) (every #'keywordp *features*) (fboundp '__import__))")
    assert result.values == ["(t t nil)"]
