"""Every evaluation is bounded in steps, bytes and seconds (issue 13): builtins charge the
step budget for the elements they visit, strings and bignums count their bytes, and each
limit ends with its own located diagnostic, quickly."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.lisp.evaluator import Limits

SMALL = Limits(steps=2000)
DEFAULT = Limits()


def check(tmp_path: Path, text: str, limits: Limits = DEFAULT) -> tuple[str, int, int, float]:
    """The code, line and column of the last diagnostic, and the seconds the check took."""
    path = tmp_path / "x.lisp"
    path.write_text(text)
    start = time.monotonic()
    diagnostics = compile_file(path, limits=limits).diagnostics
    elapsed = time.monotonic() - start
    assert diagnostics, "no diagnostic"
    d = diagnostics[-1]
    return d.code, d.line or 0, d.col or 0, elapsed


CIRCULAR = "(defvar *l* (list 1 2 3))\n(setf (cdr (cddr *l*)) *l*)\n"


@pytest.mark.parametrize("limits", [DEFAULT, SMALL], ids=["default", "2000-steps"])
def test_length_of_a_circular_list_is_a_type_error(tmp_path: Path, limits: Limits) -> None:
    code, line, col, elapsed = check(tmp_path, CIRCULAR + "(length *l*)\n", limits)
    assert (code, line, col) == ("E103", 3, 1) and elapsed < 10


def test_equal_of_circular_lists_ends_at_the_step_budget(tmp_path: Path) -> None:
    text = CIRCULAR + "(defvar *m* (list 1 2 3))\n(setf (cdr (cddr *m*)) *m*)\n(equal *l* *m*)\n"
    code, line, col, elapsed = check(tmp_path, text, SMALL)
    assert (code, line, col) == ("L001", 5, 1) and elapsed < 10


@pytest.mark.parametrize("lookup", ["(getf *p* :missing)", "(assoc :missing *p*)", "(rassoc :missing *p*)", "(member :missing *p*)"])
def test_a_lookup_in_a_circular_plist_or_alist_ends_at_the_step_budget(tmp_path: Path, lookup: str) -> None:
    """Property and association lists are walked lazily (as far as the match), so a circular
    one must still be charged as it is walked."""
    text = "(defvar *p* (list (cons :a 1) (cons :b 2)))\n(setf (cddr *p*) *p*)\n" + lookup + "\n"
    code, line, col, elapsed = check(tmp_path, text, SMALL)
    assert (code, line, col) == ("L001", 3, 1) and elapsed < 10


def test_format_iterating_a_billion_times_ends(tmp_path: Path) -> None:
    code, line, _, elapsed = check(tmp_path, '(format nil "~v@{~a~:*~}" 1000000000 "x")\n')
    assert code in ("L001", "L003") and line == 1 and elapsed < 30


def test_length_of_a_long_list_in_a_loop_is_charged(tmp_path: Path) -> None:
    code, line, _, elapsed = check(tmp_path, "(let ((l (make-list 1000000))) (dotimes (i 1000000) (length l)))\n")
    assert code == "L001" and line == 1 and elapsed < 30


def test_string_doubling_ends_quickly(tmp_path: Path) -> None:
    text = "(let ((s \"x\")) (dotimes (i 26) (setq s (concatenate 'string s s))) (length s))\n"
    code, line, _, elapsed = check(tmp_path, text)
    assert code in ("L001", "L003") and line == 1 and elapsed < 30


def test_a_huge_string_is_an_allocation_error(tmp_path: Path) -> None:
    assert check(tmp_path, "(length (make-string 100000000))\n")[:3] == ("L003", 1, 9)


def test_integers_of_thousands_of_digits_read_and_print(tmp_path: Path) -> None:
    path = tmp_path / "big.lisp"
    path.write_text(f"(defparameter *x* {'7' * 5000})\n(assert (= (length (format nil \"~a\" *x*)) 5000))\n"
                    "(assert (= (length (prin1-to-string (expt 10 9000))) 9001))\n")
    assert compile_file(path).diagnostics == []


def test_printing_an_integer_past_the_limit_is_a_located_error(tmp_path: Path) -> None:
    code, line, col, _ = check(tmp_path, "(defparameter *x* (expt 10 200000))\n(prin1-to-string *x*)\n")
    assert (code, line, col) == ("L003", 2, 1)
    code, line, col, _ = check(tmp_path, '(format nil "~d" (expt 10 200000))\n')
    assert (code, line, col) == ("E103", 1, 1)


def test_each_limit_has_its_own_diagnostic(tmp_path: Path) -> None:
    assert check(tmp_path, "(loop)\n", Limits(steps=5000))[0] == "L001"
    assert check(tmp_path, "(defun f (n) (f (1+ n)))\n(f 0)\n", Limits(depth=200))[0] == "L002"
    assert check(tmp_path, "(make-list 100000)\n", Limits(alloc=50_000, steps=10**9))[0] == "L003"
    code, _, _, elapsed = check(tmp_path, "(loop)\n", Limits(steps=10**12, seconds=0.3))
    assert code == "L004" and elapsed < 10


def test_the_time_limit_flag(tmp_path: Path) -> None:
    path = tmp_path / "spin.lisp"
    path.write_text("(loop)\n")
    proc = subprocess.run([sys.executable, "-m", "sexpgpu", "check", "--max-eval-steps", "1000000000000", "--max-eval-seconds", "0.3", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "error[L004]: evaluation time limit of 0.3 s exceeded" in proc.stdout + proc.stderr
