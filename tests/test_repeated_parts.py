"""A repeated part is a Lisp list of its parts: forward code can dolist over it, take nth,
length, elt, mapcar and reverse of it, and funcall each part; such a file compiles to the
same computation as calling the repeated part directly, and trains."""

from __future__ import annotations

from pathlib import Path

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.attempt import RunOptions, train

RUN = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defmodel stack (d n)
  (defpart blocks (repeat n (nn:linear d d)))
  (defpart head (nn:linear d 3))
  (forward (x)
    FORWARD
    (head x)))
(defloader train :source (synthetic :spirals :n 256 :classes 3) :fields ((x :f32 (2)) (y :i32 ())) :batch 32)
(defpart net (stack 2 3))
(defobjective (batch) (nn:cross-entropy (net (field batch x)) (field batch y)))
(defgroups (all "**" (optim:adamw :lr 0.01)))
(defrun :steps 4 :seed 0)
"""


def compiled(tmp_path: Path, forward: str, name: str = "r.lisp"):  # type: ignore[no-untyped-def]
    path = tmp_path / name
    path.write_text(RUN.replace("FORWARD", forward))
    return compile_file(path)


def test_dolist_over_a_repeated_part_compiles_like_calling_it(tmp_path: Path) -> None:
    direct = compiled(tmp_path, "(setq x (blocks x))", "direct.lisp")
    looped = compiled(tmp_path, "(dolist (b blocks) (setq x (funcall b x)))", "looped.lisp")
    assert direct.experiment is not None and looped.experiment is not None, [d.headline() for d in looped.diagnostics]
    assert not [d for d in looped.diagnostics if d.severity == "warning"], [d.headline() for d in looped.diagnostics]
    assert looped.experiment.ir_hash == direct.experiment.ir_hash


def test_sequence_functions_see_the_parts_in_order(tmp_path: Path) -> None:
    forward = """(assert (= (length blocks) 3))
    (assert (eq (nth 1 blocks) (elt blocks 1)))
    (assert (equal (reverse (reverse blocks)) blocks))
    (assert (listp blocks))
    (mapc (lambda (b) (setq x (funcall b x))) (list (first blocks) (second blocks) (third blocks)))
    (assert (= (length (mapcar #'identity blocks)) 3))"""
    looped = compiled(tmp_path, forward)
    direct = compiled(tmp_path, "(setq x (blocks x))", "direct.lisp")
    assert looped.experiment is not None, [d.headline() for d in looped.diagnostics]
    assert direct.experiment is not None
    assert looped.experiment.ir_hash == direct.experiment.ir_hash


def test_a_file_that_dolists_over_a_repeated_part_trains(tmp_path: Path) -> None:
    result = compiled(tmp_path, "(dolist (b blocks) (setq x (funcall b x)))")
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    outcome = train(result.experiment, RunOptions(store=str(tmp_path / "runs")), say=lambda _: None)
    assert outcome.steps == 4
