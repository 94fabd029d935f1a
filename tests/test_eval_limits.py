"""Every evaluation is bounded in steps, bytes and seconds (issue 13): builtins charge the
step budget for the elements they visit, strings and bignums count their bytes, and each
limit ends with its own located diagnostic, quickly."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import peak_memory
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


# Every builtin that walks a list to its end, on a circular list (a cons whose cdr comes round
# again). Each walk is charged as it goes and checks for the cycle, so each ends with the step
# budget's L001 at once, never with memory growing until the host kills the process.
CIRCULAR_WALKS = [
    "(mapcar #'1+ x)", "(mapc #'1+ x)", "(mapcan #'list x)", "(maplist #'car x)", "(mapl #'car x)",
    "(mapcon #'list x)", "(mapcar #'+ x x)", "(mapc #'+ x x x)",
    "(reverse x)", "(nreverse x)", "(sort x #'<)", "(stable-sort x #'<)",
    "(append x nil)", "(copy-list x)", "(last x)", "(butlast x)", "(nbutlast x)", "(elt x 100000000000)",
    "(remove 9 x)", "(remove-if #'null x)", "(remove-if-not #'numberp x)", "(delete 9 x)", "(delete-if #'null x)",
    "(delete-if-not #'numberp x)", "(remove-duplicates x)", "(delete-duplicates x)", "(substitute 0 9 x)",
    "(nsubstitute 0 9 x)", "(remove 9 x :from-end t)",
    "(find 9 x)", "(find-if #'null x)", "(find-if-not #'numberp x)", "(position 9 x)", "(position-if #'null x)",
    "(count 9 x)", "(count-if #'null x)", "(reduce #'+ x)", "(every #'numberp x)", "(some #'null x)",
    "(notany #'null x)", "(notevery #'numberp x)",
    "(subseq x 0)", "(copy-seq x)", "(coerce x 'vector)", "(concatenate 'list x)", "(map 'list #'1+ x)",
    "(map-into (make-list 3) #'1+ x)", "(fill x 0)", "(replace (make-list 3) x)", "(search '(9) x)",
    "(mismatch x x)", "(merge 'list x (list 1) #'<)", "(make-array 3 :initial-contents x)",
    "(nconc x (list 1))", "(revappend x nil)", "(nreconc x nil)", "(ldiff x nil)", "(tailp nil x)",
    "(copy-alist x)", "(union x (list 1))", "(intersection x (list 9))", "(set-difference x (list 9))",
    "(subsetp x (list 1 2 3))", "(adjoin 9 x)", "(pairlis x x)", "(member 9 x)", "(tree-equal x x)",
    "(get-properties x '(9))", "(loop for e in x collect e)", "(dolist (e x) e)",
    "(progn (setf (symbol-plist 'p) x) (get 'p :missing))",
]


def _eval_rusage(args: list[str]) -> tuple[str, int, int, float]:
    """`sexpgpu eval ARGS` as a child process under a 3 GiB address-space cap and two minutes of
    CPU: its stdout, its exit code, its peak resident memory in KiB, and its wall time."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        resource.setrlimit(resource.RLIMIT_CPU, (120, 120))

    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", peak_memory.MEASURED_CLI, "eval", "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=cap)
    out, err = proc.communicate()
    return out, proc.returncode, peak_memory.peak_kb(err), time.monotonic() - start


@pytest.mark.parametrize("seconds", ["30", "5"])
def test_every_list_walk_of_a_circular_list_ends_at_the_step_budget(seconds: str) -> None:
    import json

    forms = [f"(let ((x (list 1 2 3))) (setf (cdr (last x)) x) {walk} nil)" for walk in CIRCULAR_WALKS]
    out, code, max_rss_kib, elapsed = _eval_rusage(["--max-eval-seconds", seconds, *forms])
    assert code == 3
    codes = {walk: (r["error"] or {}).get("code") for walk, r in zip(CIRCULAR_WALKS, json.loads(out))}
    assert codes == {walk: "L001" for walk in CIRCULAR_WALKS}
    assert max_rss_kib < 400 * 1024, f"peak memory {max_rss_kib // 1024} MiB"
    assert elapsed < 120


def test_format_iterating_over_a_circular_list_ends(tmp_path: Path) -> None:
    """~{ formats each element as it goes (a step each), so it ends at the budget or the clock."""
    code, line, _, elapsed = check(tmp_path, '(let ((x (list 1 2 3))) (setf (cdr (last x)) x) (format nil "~{~a~}" x))\n')
    assert code in ("L001", "L004") and line == 1 and elapsed < 60


def test_a_proper_list_still_walks_past_a_shared_tail_and_a_circular_one_stops_the_walk(tmp_path: Path) -> None:
    """The cycle test must not mistake a list for a circular one: a long list, a list whose
    elements are one cons (eq elements, distinct cells), and mapcar over a circular list with a
    proper one (the proper one ends the walk, as in SBCL)."""
    path = tmp_path / "ok.lisp"
    path.write_text("(defvar *c* (list 1 2 3))\n(setf (cdr (last *c*)) *c*)\n"
                    "(assert (equal (mapcar #'+ '(10 20 30 40 50 60 70) *c*) '(11 22 33 41 52 63 71)))\n"
                    "(assert (equal (mapcar #'list *c* '(a b)) '((1 a) (2 b))))\n"
                    "(assert (= (length (reverse (make-list 5000 :initial-element *c*))) 5000))\n"
                    "(assert (= (reduce #'+ (loop for i below 4097 collect i)) 8390656))\n"
                    "(assert (eq (tailp (cddr *c*) *c*) t))\n"
                    "(assert (equal (ldiff *c* (cddr *c*)) '(1 2)))\n"
                    "(assert (= (elt *c* 100) 2))\n")
    assert compile_file(path).diagnostics == []


def test_eval_of_a_form_whose_value_is_circular_is_a_located_error() -> None:
    import json

    out, _, _, _ = _eval_rusage(["(let ((x (list 1 2 3))) (setf (cdr (last x)) x) x)"])
    (result,) = json.loads(out)
    assert result["error"]["code"] == "L003" and "cannot be printed" in result["error"]["message"]


def test_expanding_a_loop_costs_the_budget_what_a_builtin_does(tmp_path: Path) -> None:
    """loop's parser is Python (builtins_iteration.py): five expansions of a loop of every
    kind of clause fit a budget of 2,000 steps, where the parser written in Lisp spent about
    1,800 steps on each."""
    loops = [
        "(loop for x in xs for y from 0 when (evenp x) collect x into evens and sum y into total finally (return (list evens total)))",
        "(loop for (a . b) on xs by #'cddr with n = 2 and m = 3 unless a maximize b into top else count b end finally (return top))",
        "(loop named outer for k being the hash-keys of h using (hash-value v) for i downfrom 10 above 0 thereis (and v k))",
        "(loop for v across #(1 2 3) for w = 1 then (* w 2) repeat 3 nconcing (list v w) while v)",
        "(loop for i from 1 to n by 2 always (oddp i) do (when (> i 100) (loop-finish)))",
    ]
    path = tmp_path / "x.lisp"
    path.write_text("(defparameter *expansions* (list " + " ".join(f"(macroexpand-1 '{form})" for form in loops) + "))\n")
    assert compile_file(path, limits=Limits(steps=2000)).diagnostics == []
