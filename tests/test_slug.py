"""The slug follows one rule (docs/run.md, "The slug"): whatever changes the numbers a run
computes changes it; what says only how long to train or how often to record keeps it, so
that raising :steps or adding a diagnostic continues the same run folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.ir.experiment import Selection
from sexpgpu.runtime.attempt import RunOptions, train
from sexpgpu.runtime.checkpoint import ResumeError, list_checkpoints, load_checkpoint
from sexpgpu.runtime.runfolder import run_slug
from sexpgpu.runtime.store import Store

BASE = """\
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defknob lr 0.1)

(defloader train
  :source (synthetic :spirals :n 2000 :classes 3 :seed 0)
  :prepare ((split :train 0.8 :seed 0))
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 64
  :shuffle t)

(defloader val
  :source (synthetic :spirals :n 2000 :classes 3 :seed 0)
  :prepare ((split :train 0.8 :seed 0))
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 100)

(defpart net (nn:mlp 2 16 3))

(defobjective (batch)
  (nn:cross-entropy (net (field batch x)) (field batch y)))

(defevaluate (batch)
  (metric acc (nn:accuracy (net (field batch x)) (field batch y))))

(defeval val :every 20)

(deftarget val acc :>= 0.999)

(defgroups (all "**" (optim:sgd :lr lr)))

(defrun :steps 40 :seed 0 :log-every 10)
"""

RUN = "(defrun :steps 40 :seed 0 :log-every 10)"


def slug_of(tmp_path: Path, text: str, selection: Selection | None = None) -> str:
    path = tmp_path / "exp.lisp"
    path.write_text(text)
    result = compile_file(path, selection)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return run_slug(result.experiment)


CHANGES = {
    "a knob's value": (BASE, Selection(set={"lr": "0.05"})),
    ":seed": (BASE.replace(RUN, "(defrun :steps 40 :seed 1 :log-every 10)"), None),
    "the model (the IR)": (BASE.replace("(nn:mlp 2 16 3)", "(nn:mlp 2 32 3)"), None),
    "the source": (BASE.replace(":n 2000 :classes 3 :seed 0)\n  :prepare ((split :train 0.8 :seed 0))\n  :fields ((x :f32 (2)) (y :i32 ()))\n  :batch 64",
                                ":n 1000 :classes 3 :seed 0)\n  :prepare ((split :train 0.8 :seed 0))\n  :fields ((x :f32 (2)) (y :i32 ()))\n  :batch 64"), None),
    ":shuffle": (BASE.replace("  :batch 64\n  :shuffle t)", "  :batch 64)"), None),
    ":prepare": (BASE.replace(":prepare ((split :train 0.8 :seed 0))\n  :fields ((x :f32 (2)) (y :i32 ()))\n  :batch 64",
                              ":prepare ((split :train 0.7 :seed 0))\n  :fields ((x :f32 (2)) (y :i32 ()))\n  :batch 64"), None),
    ":batch": (BASE.replace("  :batch 64\n", "  :batch 32\n"), None),
    ":microbatches": (BASE.replace(RUN, "(defrun :steps 40 :seed 0 :log-every 10 :microbatches 2)"), None),
    ":precision": (BASE.replace(RUN, "(defrun :steps 40 :seed 0 :log-every 10 :precision :bf16)"), None),
    ":finite-guard": (BASE.replace(RUN, "(defrun :steps 40 :seed 0 :log-every 10 :finite-guard (:skip 3))"), None),
    "an evaluation's loader": (BASE.replace("(defeval val :every 20)", "(defeval val :loader train :every 20)"), None),
    "a target": (BASE.replace(":>= 0.999", ":>= 0.99"), None),
    "the optimizer": (BASE.replace("(optim:sgd :lr lr)", "(optim:momentum :lr lr)"), None),
}

KEEPS = {
    ":steps": BASE.replace(RUN, "(defrun :steps 400 :seed 0 :log-every 10)"),
    ":log-every": BASE.replace(RUN, "(defrun :steps 40 :seed 0 :log-every 5)"),
    ":checkpoint": BASE.replace(RUN, "(defrun :steps 40 :seed 0 :log-every 10 :checkpoint (:every 10 :keep 2))"),
    "loop diagnostics": BASE.replace(RUN, '(defrun :steps 40 :seed 0 :log-every 10 :diagnostics (:every 10 :select ("grad-norm/**")))'),
    "IR diagnostics (activation taps)": BASE.replace(RUN, '(defrun :steps 40 :seed 0 :log-every 10 :diagnostics (:every 10 :select ("act/**")))'),
    ":meta": BASE.replace(RUN, '(defrun :steps 40 :seed 0 :log-every 10 :meta (:question "why"))'),
    "an evaluation's :every": BASE.replace("(defeval val :every 20)", "(defeval val :every 10)"),
    "a comment": ";; a note\n" + BASE,
}


@pytest.mark.parametrize("what", list(CHANGES))
def test_what_changes_the_numbers_changes_the_slug(what: str, tmp_path: Path) -> None:
    text, selection = CHANGES[what]
    assert slug_of(tmp_path, text, selection) != slug_of(tmp_path, BASE)


@pytest.mark.parametrize("what", list(KEEPS))
def test_what_says_how_long_or_how_often_keeps_the_slug(what: str, tmp_path: Path) -> None:
    assert slug_of(tmp_path, KEEPS[what]) == slug_of(tmp_path, BASE)


def experiment_of(path: Path, text: str):  # type: ignore[no-untyped-def]
    path.write_text(text)
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return result.experiment


def last_checkpoint_params(store: str, slug: str) -> dict[str, np.ndarray]:
    s = Store.open(store)
    name = [c.name for c in list_checkpoints(s, slug) if c.valid][-1]
    return load_checkpoint(s, slug, name)[0]


NO_TARGET = BASE.replace("(deftarget val acc :>= 0.999)\n", "")


def test_raising_steps_and_adding_a_diagnostic_continue_the_run_bit_identically(tmp_path: Path) -> None:
    """A run that finished at 40 steps, its file given :steps 80, a diagnostic and a
    comment, resumes in the same folder and ends with the parameters of a run of 80 steps
    that never stopped."""
    path = tmp_path / "exp.lisp"
    longer = ";; longer now\n" + NO_TARGET.replace(RUN, '(defrun :steps 80 :seed 0 :log-every 10 :diagnostics (:every 20 :select ("act/**" "grad-norm/**")))')
    straight = train(experiment_of(path, longer), RunOptions(store=str(tmp_path / "a"), signals=False), say=lambda _: None)
    first = train(experiment_of(path, NO_TARGET), RunOptions(store=str(tmp_path / "b"), signals=False), say=lambda _: None)
    assert first.exit_code == 0 and first.steps == 40 and first.reason == "finished"
    said: list[str] = []
    again = train(experiment_of(path, longer), RunOptions(store=str(tmp_path / "b"), signals=False), say=said.append)
    assert again.slug == first.slug == straight.slug
    assert "resumed from step-000040 (step 40)" in said
    assert again.exit_code == 0 and again.steps == 80
    reference, resumed = last_checkpoint_params(str(tmp_path / "a"), straight.slug), last_checkpoint_params(str(tmp_path / "b"), again.slug)
    for name, value in reference.items():
        assert value.tobytes() == resumed[name].tobytes(), name


def test_a_checkpoint_of_another_run_is_refused(tmp_path: Path) -> None:
    """A run folder copied under another run's slug: the checkpoint computes other numbers
    (another :seed), so the resume is refused, exit 6's ResumeError."""
    path = tmp_path / "exp.lisp"
    store = tmp_path / "runs"
    done = train(experiment_of(path, NO_TARGET), RunOptions(store=str(store), signals=False), say=lambda _: None)
    other = experiment_of(path, NO_TARGET.replace(RUN, "(defrun :steps 80 :seed 1 :log-every 10)"))
    other_slug = run_slug(other)
    assert other_slug != done.slug
    (store / done.slug).rename(store / other_slug)
    with pytest.raises(ResumeError, match="belongs to another run"):
        train(other, RunOptions(store=str(store), resume="latest", signals=False), say=lambda _: None)
