"""Every contract value of the wrong type gets a located diagnostic, never an internal error
(X001): the repros of issue 13, and a property test that puts generated values of every kind
into every keyword and argument of every contract form."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.lisp.diagnostics import Diagnostic

# A run file using every contract form, each slot a {NAME} with its valid value below. A slot
# is filled with a Lisp value as written; QUOTED slots are evaluated by the form, so the value
# goes in quoted (a wrong-typed value, not code that fails for its own reasons).
TEMPLATE = """(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defknob {knob-name} {knob-default} :type {knob-type} :range {knob-range} :choices {knob-choices} :doc {knob-doc})
(defknob lr 0.1)
(defvariant {variant-name} {variant-settings})
(defsweep {sweep-name} {sweep-settings})
(defloader train
  :source {source}
  :prepare {prepare}
  :fields {fields}
  :batch {batch}
  :shuffle {shuffle}
  :part {part}
  :stages {stages})
(defloader val :source (synthetic :spirals :n 64 :classes 3 :seed 1) :fields ((x :f32 (2)) (y :i32 ())) :batch 32)
(defpart {part-name} (nn:mlp 2 8 3))
(defpart net (nn:mlp 2 8 3))
(defobjective (batch)
  (nn:cross-entropy (net (field batch {field-name})) (field batch y)))
(defevaluate (batch)
  (metric {metric-name} (nn:cross-entropy (net (field batch x)) (field batch y)))
  (nn:cross-entropy (net (field batch x)) (field batch y)))
(defeval {eval-name} :loader {eval-loader} :every {eval-every} :at {eval-at} :overlap {eval-overlap})
(defeval val :loader val :every 10)
(deftarget {target-eval} {target-metric} {target-test} {target-value})
(defgroups (spare "spare.**" :frozen) (all {group-selector} (optim:sgd :lr {group-lr})) :clip {clip})
(defcurriculum (start (stage {curriculum-loader} {curriculum-stage})))
(defrun :steps {steps} :seed {seed} :log-every {log-every} :microbatches {microbatches}
        :precision {precision} :checkpoint {checkpoint} :finite-guard {finite-guard}
        :diagnostics {diagnostics} :meta {meta})
"""

VALID = {
    "knob-name": "width", "knob-default": "0.5", "knob-type": "float", "knob-range": "(0 1)",
    "knob-choices": "(0.5 0.25)", "knob-doc": '"a width"',
    "variant-name": "wide", "variant-settings": ":width 0.25",
    "sweep-name": "widths", "sweep-settings": ":width (0.5 0.25)",
    "source": "(synthetic :spirals :n 256 :classes 3 :seed 0)", "prepare": "()",
    "fields": "((x :f32 (2)) (y :i32 ()))", "batch": "32", "shuffle": "t", "part": "train",
    "stages": "((short :batch 32) (long :batch 16))",
    "part-name": "spare", "field-name": "x", "metric-name": "loss2",
    "eval-name": "again", "eval-loader": "val", "eval-every": "20", "eval-at": "nil", "eval-overlap": "nil",
    "target-eval": "val", "target-metric": "loss2", "target-test": ":<=", "target-value": "0.01",
    "group-selector": '"**"', "group-lr": "0.1", "clip": "1.0",
    "curriculum-loader": "train", "curriculum-stage": "short",
    "steps": "3", "seed": "0", "log-every": "1", "microbatches": "1", "precision": ":f32",
    "checkpoint": "(:every 10 :keep 2)", "finite-guard": "(:skip 1)",
    "diagnostics": '(:every 10 :select ("grad-norm/**"))', "meta": '(:question "does it check?")',
}
# slots the form evaluates: a generated value goes in quoted
EVALUATED = {"knob-default", "knob-doc", "source", "batch", "shuffle", "eval-every", "eval-at", "eval-overlap",
             "target-test", "target-value", "group-selector", "group-lr", "clip", "steps", "seed", "log-every",
             "microbatches", "precision", "checkpoint", "finite-guard", "diagnostics", "meta"}

# wrong-typed values of every kind; the strings include a NUL, a long one and a path
VALUES = st.one_of(
    st.sampled_from([
        "5", "-1", "0", "(expt 10 400)", "1.5", "-0.0", "1d300", "1/3", '"text"', '"a\\0b"', "foo", ":foo", "t", "nil",
        "()", "(1 2)", "(quote)", "(a . b)", "((1))", "(:a)", "#(1 2)", "#\\a", '"/etc/passwd"', "(1 2 3 4 5)",
    ]),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.text(alphabet="ab\x00/ .", max_size=300).map(lambda s: '"' + s + '"'),
    st.lists(st.sampled_from(["1", "a", ":k", '"s"', "()", "1.5"]), max_size=4).map(lambda xs: "(" + " ".join(xs) + ")"),
)


def run_file(tmp: Path, slot: str, value: str) -> list[Diagnostic]:
    filled = dict(VALID)
    huge = value == "(expt 10 400)"
    if slot in EVALUATED:
        filled[slot] = value if huge else f"'{value}"
    else:
        filled[slot] = "1" + "0" * 400 if huge else value
    path = tmp / "run.lisp"
    path.write_text(TEMPLATE.format(**filled).replace("\\0", "\0"), encoding="utf-8")
    return compile_file(path).diagnostics


def assert_located_contract_error(diagnostics: list[Diagnostic], slot: str, value: str) -> None:
    errors = [d for d in diagnostics if d.severity == "error"]
    for d in errors:
        assert d.code != "X001", f"{slot}={value}: {d.message}"
        assert d.line is not None and d.file is not None, f"{slot}={value}: {d.code} {d.message} has no position"
        assert d.code[0] in "CMT", f"{slot}={value}: {d.code} {d.message}"


def test_the_template_checks(tmp_path: Path) -> None:
    diagnostics = run_file(tmp_path, "batch", "32")
    assert [d for d in diagnostics if d.severity == "error"] == []


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(slot=st.sampled_from(sorted(VALID)), value=VALUES)
def test_wrong_typed_contract_values_get_located_diagnostics(tmp_path: Path, slot: str, value: str) -> None:
    assert_located_contract_error(run_file(tmp_path, slot, value), slot, value)


@pytest.mark.parametrize("slot", sorted(VALID))
def test_every_slot_refuses_a_list_a_string_and_a_huge_number(tmp_path: Path, slot: str) -> None:
    for value in ("(1 2)", '"a\\0b"', "(expt 10 400)"):
        assert_located_contract_error(run_file(tmp_path, slot, value), slot, value)


# the issue's repros: (slot, value, code, the message's start)
REPROS = [
    ("knob-name", "5", "C008", "defknob: the name must be a symbol, got 5"),
    ("part", "(1 2)", "C008", "defloader train :part: the part"),
    ("part", "1.5", "C008", "defloader train :part: the part"),
    ("meta", "5", "C008", "defrun :meta needs a plist"),
    ("batch", "(expt 10 400)", "C008", "defloader train: :batch 100000"),
    ("field-name", "(quote)", "C008", "field: the field name must be a symbol, got (quote)"),
]


@pytest.mark.parametrize("slot, value, code, start", REPROS)
def test_issue_repros(tmp_path: Path, slot: str, value: str, code: str, start: str) -> None:
    errors = [d for d in run_file(tmp_path, slot, value) if d.severity == "error"]
    assert errors and errors[0].code == code and errors[0].message.startswith(start), errors
    assert errors[0].line is not None


@pytest.mark.parametrize("spec", ["a\0b.lisp", "a" * 300 + ".lisp", "d/" * 2100 + "x.lisp"])
def test_require_of_an_unusable_path_is_m005(tmp_path: Path, spec: str) -> None:
    path = tmp_path / "x.lisp"
    path.write_text(f'(require "{spec}" :as p)\n', encoding="utf-8")
    (d,) = compile_file(path).diagnostics
    assert d.code == "M005" and "not a usable path" in d.message and (d.line, d.col) == (1, 1)


def test_require_of_an_over_long_prefix_is_fine_or_located(tmp_path: Path) -> None:
    (tmp_path / "m.lisp").write_text("(defun f () 1)\n", encoding="utf-8")
    path = tmp_path / "x.lisp"
    path.write_text(f'(require "./m.lisp" :as {"p" * 5000})\n(+ 1 2)\n', encoding="utf-8")
    assert [d for d in compile_file(path).diagnostics if d.severity == "error"] == []
