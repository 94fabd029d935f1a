"""defcurriculum moves train between its stages and back to the loader as declared,
`(stage train :declared)` (docs/curriculum-and-ctx.md)."""

from __future__ import annotations

from pathlib import Path

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.attempt import RunOptions, train
from sexpgpu.runtime.runfolder import RunFolder
from sexpgpu.runtime.store import Store

THERE_AND_BACK = """\
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defloader train
  :source (synthetic :spirals :n 2048 :classes 3 :seed 0)
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 64
  :stages ((small :batch 16) (big :batch 128)))

(defpart net (nn:mlp 2 16 3))

(defobjective (batch)
  (nn:cross-entropy (net (field batch x)) (field batch y)))

(defgroups (all "**" (optim:sgd :lr 0.1)))

(defcurriculum
  (start (stage train small))
  (when (>= (ctx :step) 10) (stage train big))
  (when (>= (ctx :step) 20) (stage train TARGET)))

(defrun :steps 30 :log-every 10)
"""


def test_a_curriculum_returns_to_the_loader_as_declared(tmp_path: Path) -> None:
    path = tmp_path / "c.lisp"
    path.write_text(THERE_AND_BACK.replace("TARGET", ":declared"))
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    store = tmp_path / "runs"
    outcome = train(result.experiment, RunOptions(store=str(store), signals=False), say=lambda _: None)
    assert outcome.exit_code == 0 and outcome.steps == 30
    folder = RunFolder(Store.open(str(store)), outcome.slug)
    stages = [(e["step"], e["name"], e["index"]) for e in folder.read_events() if e["kind"] == "stage"]
    assert stages == [(10, "big", 2), (20, ":declared", 0)]
    status = folder.read_status()
    assert status is not None and status.summary is not None
    assert status.summary.examples_seen == 10 * 16 + 10 * 128 + 10 * 64  # each stage's batch, then the declared one


def test_a_stage_named_like_the_keyword_is_not_the_declared_loader(tmp_path: Path) -> None:
    path = tmp_path / "c.lisp"
    path.write_text(THERE_AND_BACK.replace("TARGET", "declared"))
    errors = [d for d in compile_file(path).diagnostics if d.severity == "error"]
    assert [d.code for d in errors] == ["C008"]
    assert "has no stage declared (small, big, :declared)" in errors[0].message
