"""Checks that catch a wrong experiment before it trains (issue 14): each is seen as a user
sees it, `sexpgpu check` in a real process, with the whole headline, the caret's line and
column, and the exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.ir.experiment import Selection

HEAD = '(require "sexpgpu/nn" :as nn)\n(require "sexpgpu/optim" :as optim)\n'
SPIRALS = "(defloader train :source (synthetic :spirals :n 256 :classes 3) :fields ((x :f32 (2)) (y :i32 ())) :batch 32)\n"
GROUPS = '(defgroups (all "**" (optim:sgd :lr 0.1)))\n'
CE = "(defobjective (batch)\n  (nn:cross-entropy (net (field batch x)) (field batch y)))\n"


def check(folder: Path, text: str, *flags: str, name: str = "x.lisp") -> tuple[int, list[str], str]:
    """`sexpgpu check` of TEXT written to FOLDER/NAME: the exit code, stderr's lines, stdout."""
    (folder / name).write_text(text)
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "sexpgpu", "check", *flags, name], cwd=folder, capture_output=True, text=True, timeout=120, env=env)
    return done.returncode, done.stderr.splitlines(), done.stdout


def caret_column(lines: list[str], at: int = 2) -> int:
    """The 1-based column the caret under the source line points at."""
    gutter = lines[at - 1].index("|") + 2
    return lines[at].index("^") - gutter + 1


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()
    return tmp_path


# -- 9: a library's argument error at the user's call ------------------------------------------------

ATTENTION = HEAD + """(defmodel seq-classifier ()
  (defpart inp (nn:linear 2 64))
  (defpart attn (nn:causal-attention 64 3))
  (defpart out (nn:linear 64 3))
  (forward (x)
    (out (reshape (attn (reshape (inp x) (list 32 1 64))) (list 32 64)))))
""" + SPIRALS + "(defpart net (seq-classifier))\n" + CE + GROUPS + "(defrun :steps 1)\n"


def test_heads_that_do_not_divide_d_are_an_error_at_the_users_call(project: Path) -> None:
    code, lines, _ = check(project, ATTENTION)
    assert code == 3
    assert lines[0] == "x.lisp:5:17: error[E104]: `causal-attention`: d=64 is not divisible by heads=3; use a number of heads that divides 64, such as 2 or 4"
    assert lines[1] == "   5 |   (defpart attn (nn:causal-attention 64 3))"
    assert caret_column(lines) == 17
    assert lines[3].startswith("  note: sexpgpu/lib/nn.lisp:") and lines[3].endswith(": raised here, inside the standard library")


def test_heads_through_a_transformer_block_are_blamed_at_the_block(project: Path) -> None:
    text = (REPO / "examples" / "char-transformer.lisp").read_text().replace("(defknob heads 4)", "(defknob heads 5)")
    (project / "data").mkdir()
    (project / "data" / "stdlib-docstrings.txt").write_text("hello world\n")
    code, lines, _ = check(project, text)
    assert code == 3
    where = next(i for i, line in enumerate(text.splitlines(), 1) if "(nn:transformer-block d heads)" in line)
    col = text.splitlines()[where - 1].index("(nn:transformer-block") + 1
    assert lines[0] == f"x.lisp:{where}:{col}: error[E104]: `causal-attention`: d=64 is not divisible by heads=5; use a number of heads that divides 64, such as 4 or 8"
    assert caret_column(lines) == col


# -- 11: deftarget ----------------------------------------------------------------------------------

def target_file(target: str) -> str:
    return (HEAD + SPIRALS + "(defloader val :source (synthetic :spirals :n 256 :classes 3 :seed 1) :fields ((x :f32 (2)) (y :i32 ())) :batch 32)\n"
            "(defpart net (nn:mlp 2 8 3))\n" + CE +
            "(defevaluate (batch)\n  (metric acc (nn:accuracy (net (field batch x)) (field batch y))))\n(defeval val :every 10)\n"
            + target + "\n" + GROUPS + "(defrun :steps 1)\n")


@pytest.mark.parametrize("target, message", [
    ("(deftarget val acc >= 0.985)", "deftarget val acc: the test must be a keyword such as :>=, not the symbol >=; the tests are :<= :>= :< :>"),
    ("(deftarget val acc :=> 0.985)", "deftarget val acc: the test must be a keyword, one of :<= :>= :< :>; got :=>"),
    ("(deftarget val accuracy :>= 0.985)", "deftarget val accuracy: defevaluate records no metric accuracy (it records: acc)"),
    ("(deftarget vol acc :>= 0.985)", "deftarget vol acc: no defeval named vol (evals: val)"),
    ('(deftarget val acc :>= "high")', 'deftarget val acc: the threshold must be a number, got "high"'),
])
def test_deftarget_problems_point_at_the_deftarget_form(project: Path, target: str, message: str) -> None:
    code, lines, _ = check(project, target_file(target))
    assert code == 3
    assert lines[0] == f"x.lisp:11:1: error[C008]: {message}"
    assert lines[1] == f"  11 | {target}"
    assert caret_column(lines) == 1
    assert len(lines) == 3  # no macro note: the form itself is the place


def test_a_keyword_test_and_a_knob_threshold_check(project: Path) -> None:
    text = target_file("(deftarget val acc :>= goal)").replace(HEAD, HEAD + "(defknob goal 0.9)\n")
    assert check(project, text)[0] == 0
    result = compile_file(project / "x.lisp", Selection(set={"goal": "0.5"}))
    assert result.experiment is not None
    assert [(t.test, t.value) for t in result.experiment.targets] == [(">=", 0.5)]


# -- 15: a list default in defknob is data --------------------------------------------------------

STACK = """(defmodel stack (widths)
  (defpart layers (loop for (a b) on widths while b collect (nn:linear a b)))
  (forward (x)
    (layers x)))
"""


def test_a_list_default_of_defknob_is_literal_data(project: Path) -> None:
    text = HEAD + "(defknob widths (2 16 16 3))\n(defknob tag 'small)\n" + STACK + SPIRALS + "(defpart net (stack widths))\n" + CE + GROUPS + "(defrun :steps 1)\n"
    code, lines, out = check(project, text)
    assert (code, lines, out.strip()) == (0, [], "x.lisp: ok")
    result = compile_file(project / "x.lisp")
    assert result.experiment is not None
    knobs = {k.name: (k.default, k.value) for k in result.experiment.knobs}
    assert knobs == {"widths": ([2, 16, 16, 3], [2, 16, 16, 3]), "tag": ("small", "small")}
    assert [p.shape for p in result.experiment.params if p.path.endswith(".w")] == [(2, 16), (16, 16), (16, 3)]
    wider = compile_file(project / "x.lisp", Selection(set={"widths": "(2 32 3)"}))
    assert wider.experiment is not None
    assert [p.shape for p in wider.experiment.params if p.path.endswith(".w")] == [(2, 32), (32, 3)]


# -- 20: models collected in a defpart are numbered like repeat's copies ---------------------------------

def test_collected_models_get_numbered_paths_and_their_own_values(project: Path) -> None:
    from sexpgpu.runtime.init import initial_value

    text = (HEAD + "(defknob widths (2 8 8 3))\n" + STACK + SPIRALS + "(defpart net (stack widths))\n"
            "(defpart heads (loop repeat 2 collect (nn:linear 3 3)))\n"
            "(defobjective (batch)\n  (nn:cross-entropy (heads (net (field batch x))) (field batch y)))\n" + GROUPS + "(defrun :steps 1)\n")
    assert check(project, text)[0] == 0
    result = compile_file(project / "x.lisp")
    assert result.experiment is not None
    params = {p.path: p for p in result.experiment.params}
    assert list(params) == [
        "net.layers.0.w", "net.layers.0.b", "net.layers.1.w", "net.layers.1.b", "net.layers.2.w", "net.layers.2.b",
        "heads.0.w", "heads.0.b", "heads.1.w", "heads.1.b",
    ]
    copies = [initial_value(params[f"heads.{i}.w"], 0) for i in (0, 1)]
    assert copies[0].shape == copies[1].shape == (3, 3) and not np.array_equal(copies[0], copies[1])
    assert not np.array_equal(initial_value(params["net.layers.1.w"], 0)[:3, :3], initial_value(params["net.layers.2.w"], 0)[:3, :3])
    # the forward applies the copies in order, each to the output of the one before (as repeat)
    names = [n.path for n in result.experiment.module.programs["forward"].nodes if n.op == "matmul"]
    assert names == ["net.layers.0", "net.layers.1", "net.layers.2", "heads.0", "heads.1"]


def test_two_models_made_in_one_defpart_and_both_used_are_an_error(project: Path) -> None:
    text = (HEAD + "(defvar *kept* nil)\n(defmodel two ()\n  (defpart a (progn (setq *kept* (nn:linear 2 3)) (nn:linear 2 3)))\n"
            "  (defpart b *kept*)\n  (forward (x) (+ (a x) (b x))))\n" + SPIRALS + "(defpart net (two))\n" + CE + GROUPS + "(defrun :steps 1)\n")
    code, lines, _ = check(project, text)
    assert code == 3
    assert lines[0] == (
        "x.lisp:9:1: error[C008]: two parameters have the path net.a.w: two models made inside one defpart are both parts of the run; "
        "make numbered copies with (repeat n (constructor ...)), or return the models as one list from that defpart's form, which numbers them")
    assert lines[1] == "   9 | (defpart net (two))" and caret_column(lines) == 1


# -- 13: prepare steps' and sources' options, from one table, at check ------------------------------

def loader_file(prepare: str, source: str = "(synthetic :spirals :n 256 :classes 3)") -> str:
    return (HEAD + f"(defloader train\n  :source {source}\n  :prepare ({prepare})\n  :fields ((x :f32 (2)) (y :i32 ()))\n  :batch 32)\n"
            "(defpart net (nn:mlp 2 8 3))\n" + CE + GROUPS + "(defrun :steps 1)\n")


@pytest.mark.parametrize("prepare, target, message", [
    ("(split :val 0.9)", ":val", "(split): unknown option :val; its options are: :train, a fraction F with 0 < F < 1 (required); :seed, an integer (default: 0)"),
    ("(split :train 1.5)", "1.5", "(split): :train must be a fraction F with 0 < F < 1, got 1.5"),
    ("(split :train 0.8 :seed 0.5)", "0.5", "(split): :seed must be an integer, got 0.5"),
    ("(split)", "(split)", "(split) needs :train, a fraction F with 0 < F < 1; write (split :train F [:seed S])"),
    ("(windows :length 0)", "0", "(windows): :length must be a positive integer, got 0"),
    ("(windows :length 8 :step 2)", ":step", "(windows): unknown option :step; its options are: :length, a positive integer (required); :stride, a positive integer (default: the length)"),
    ("(char-vocab :lower t)", ":lower", "(char-vocab): unknown option :lower; its options are: none"),
    ("(normalize z)", "z)", "(normalize): :field must be the name of a declared field (x, y), got z"),
    ("(normalize y)", "y)", "(normalize): field y is i32; normalize standardizes a float field"),
    ("(shuffle)", "(shuffle)", "unknown prepare step (shuffle); the steps are (char-vocab), (windows :length L [:stride S]), (split :train F [:seed S]), (normalize FIELD)"),
])
def test_prepare_options_are_checked_at_the_option(project: Path, prepare: str, target: str, message: str) -> None:
    code, lines, _ = check(project, loader_file(prepare))
    source_line = f"  :prepare ({prepare})"
    col = source_line.index(target) + 1
    assert code == 3
    assert lines[0] == f"x.lisp:5:{col}: error[C008]: defloader train: {message}"
    assert lines[1] == f"   5 | {source_line}"
    assert caret_column(lines) == col


@pytest.mark.parametrize("source, target, message", [
    ("(synthetic :swirls :n 256)", ":swirls", "(synthetic): unknown data set :swirls; the data sets are :spirals, :moons, :blobs, :linear"),
    ("(synthetic :spirals :count 256)", ":count", "a synthetic source: unknown option :count; its options are: :n, a positive integer (required); "
     ":classes, a positive integer (default: 3 (2 for moons)); :seed, an integer (default: 0); :noise, a number (default: the generator's); "
     ":dim, a positive integer (default: the inputs field's size)"),
    ("(synthetic :spirals)", "(synthetic", "a synthetic source needs :n, a positive integer; write (synthetic :NAME :n N ...)"),
    ("(synthetic :spirals :n 0)", "0", "a synthetic source: :n must be a positive integer, got 0"),
    ('(csv "d.csv" :sep ";")', ":sep", "a csv source: unknown option :sep; its options are: :columns, a quoted plist such as '(:field \"name\") (optional); "
     ":delimiter, a string (default: \",\")"),
])
def test_source_options_are_checked_at_the_option(project: Path, source: str, target: str, message: str) -> None:
    code, lines, _ = check(project, loader_file("", source))
    col = f"  :source {source}".index(target) + 1
    assert code == 3
    assert lines[0] == f"x.lisp:4:{col}: error[C008]: defloader train: {message}"
    assert caret_column(lines) == col


def test_the_data_layer_reads_the_same_table(project: Path) -> None:
    """The runtime refuses a record that did not come through check with check's message
    (exit 5 at run), and its steps, sources and data sets are exactly the table's."""
    from sexpgpu.ir.data_options import PREPARE_STEPS, SOURCES, SYNTHETIC_NAMES
    from sexpgpu.runtime.data.load import load_dataset
    from sexpgpu.runtime.data.prepare import STEPS
    from sexpgpu.runtime.data.sources import PARSERS
    from sexpgpu.runtime.data.spec import DataError, LoaderSpec
    from sexpgpu.runtime.data.synthetic import GENERATORS

    assert set(STEPS) == set(PREPARE_STEPS) and set(PARSERS) == set(SOURCES) and set(GENERATORS) == set(SYNTHETIC_NAMES)
    spec = LoaderSpec.model_validate({
        "name": "train", "source": {"kind": "synthetic", "options": {"name": "spirals", "n": 64}},
        "prepare": [{"kind": "split", "options": {"val": 0.9}}], "fields": [{"name": "x", "dtype": "f32", "shape": [2]}], "batch": 8})
    with pytest.raises(DataError) as info:
        load_dataset(spec, use_cache=False)
    assert str(info.value) == ("loader 'train': synthetic:spirals: (split): unknown option :val; its options are: "
                               ":train, a fraction F with 0 < F < 1 (required); :seed, an integer (default: 0)")


# -- 12: a diagnostic selection that matches nothing ---------------------------------------------------

TAPPED = HEAD + """(defdiagnostic dead (h) (mean (cast (= h 0.0) :f32)))
(defmodel tapped ()
  (defpart hidden (nn:linear 2 4))
  (defpart out (nn:linear 4 3))
  (forward (x) (out (diagnostic dead (relu (hidden x))))))
""" + SPIRALS + "(defpart net (tapped))\n" + CE + '(defgroups (all "**" (optim:adamw :lr 0.01)))\n'


def test_a_glob_that_selects_nothing_is_an_error_listing_the_diagnostics(project: Path) -> None:
    text = TAPPED + '(defrun :steps 10\n  :diagnostics (:every 5 :select ("grad-norm/**" "act/**/rsm")))\n'
    code, lines, _ = check(project, text)
    assert code == 3
    paths = "net.hidden.w, net.hidden.b, net.out.w, net.out.b"
    assert lines[0] == (
        'x.lisp:14:50: error[C008]: defrun :diagnostics :select "act/**/rsm" matches no diagnostic of this run; it has '
        f"grad-norm/PATH, param-norm/PATH, update-ratio/PATH, optim/m/PATH, optim/v/PATH for PATH in {paths}; "
        "act/PART/mean, act/PART/rms, act/PART/max-abs, act/PART/frac-zero for PART in net.hidden, net.out, net; dead/PART for PART in net")
    assert lines[1] == '  14 |   :diagnostics (:every 5 :select ("grad-norm/**" "act/**/rsm")))'
    assert caret_column(lines) == 50


@pytest.mark.parametrize("select", ['"dead/**"', '"**/net.out.w"', '"optim/v/**" "act/net/rms"'])
def test_globs_that_select_something_check(project: Path, select: str) -> None:
    assert check(project, TAPPED + f"(defrun :steps 10 :diagnostics (:every 5 :select ({select})))\n")[0] == 0


# -- 10: check compiles every variant and every sweep point -------------------------------------------

SWEEP = HEAD + """(defknob lr 0.1)
(defknob heads 2)
SETTINGS
(defmodel seq-classifier (heads)
  (defpart inp (nn:linear 2 8))
  (defpart attn (nn:causal-attention 8 heads))
  (defpart out (nn:linear 8 3))
  (forward (x)
    (out (reshape (attn (reshape (inp x) (list 32 1 8))) (list 32 8)))))
""" + SPIRALS + """(defpart net (seq-classifier heads))
""" + CE + '(defgroups (all "**" (optim:sgd :lr lr)))\n(defrun :steps 1)\n'


def test_a_call_where_sweep_values_belong_is_blamed_at_the_value(project: Path) -> None:
    code, lines, _ = check(project, SWEEP.replace("SETTINGS", "(defsweep lrs :lr (log-grid 0.01 0.1 4))"))
    assert code == 3
    assert lines[:2] == [
        "x.lisp:5:20: error[C004]: knob lr: log-grid is not a number like its default 0.1",
        "   5 | (defsweep lrs :lr (log-grid 0.01 0.1 4))",
    ]
    assert caret_column(lines) == 20
    assert lines[3:] == [
        "  note: this value comes from point 0 of defsweep lrs; defvariant and defsweep values are literal data, read and never evaluated: "
        "(log-grid 0.01 0.1 4) is a list of values, not a call; write the values themselves",
        "  note: while evaluating the top-level form at x.lisp:3:1",
        "  note: found when checking the selection --sweep lrs --point 0",
    ]


def test_a_variant_value_is_blamed_at_the_value(project: Path) -> None:
    code, lines, _ = check(project, SWEEP.replace("SETTINGS", "(defvariant fast :lr (* 2 0.1))"))
    assert code == 3
    assert lines[0] == "x.lisp:5:22: error[C004]: knob lr: (* 2 0.1) is not a number like its default 0.1"
    assert caret_column(lines) == 22
    assert lines[-1] == "  note: found when checking the selection --variant fast"


def test_a_point_that_does_not_compile_fails_check_and_is_named(project: Path) -> None:
    text = SWEEP.replace("SETTINGS", "(defsweep h :heads (1 2 3 4 5))")
    code, lines, _ = check(project, text)
    assert code == 3
    headlines = [line for line in lines if ": error[" in line]
    assert headlines == [
        "x.lisp:8:17: error[E104]: `causal-attention`: d=8 is not divisible by heads=3; use a number of heads that divides 8, such as 2 or 4",
        "x.lisp:8:17: error[E104]: `causal-attention`: d=8 is not divisible by heads=5; use a number of heads that divides 8, such as 4 or 8",
    ]
    assert "  note: found when checking the selection --sweep h --point 2" in lines
    assert "  note: found when checking the selection --sweep h --point 4" in lines
    # one chosen selection is checked alone
    assert check(project, text, "--sweep", "h", "--point", "3")[0] == 0
    assert check(project, text, "--sweep", "h", "--point", "2")[0] == 3


def test_selections_with_the_values_of_one_already_compiled_are_not_compiled_again(project: Path) -> None:
    from sexpgpu.compile.pipeline import check_every_selection

    text = SWEEP.replace("SETTINGS", "(defvariant same :lr 0.1)\n(defsweep lrs :lr (0.1 0.2 0.2))\n(defsweep both :zip t :lr (0.2 0.3) :heads (2 4))")
    (project / "x.lisp").write_text(text)
    checked = check_every_selection(project / "x.lisp")
    assert checked.diagnostics == []
    # the base, lr=0.2, lr=0.3 with heads=4: the variant, point 0 of lrs (the base's values)
    # and the repeated 0.2 are the same compiles
    assert checked.compiled == 3
