"""defrun :diagnostics: the built-in set, defdiagnostic taps, sampling, and the promise
that unselected diagnostics cost nothing (the IR and its hash are unchanged)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.attempt import RunOptions, train
from sexpgpu.runtime.trainer import Trainer
from sexpgpu.runtime.runfolder import RunFolder
from sexpgpu.runtime.store import Store

RUN = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defdiagnostic frac-positive (x) (mean (cast (> x 0) :f32)))
(defmodel tapped (d-in d-out)
  (defpart inner (nn:mlp d-in 16 d-out))
  (forward (x) (diagnostic frac-positive (inner x))))
(defloader train :source (synthetic :spirals :n 512 :classes 3) :fields ((x :f32 (2)) (y :i32 ())) :batch 32)
(defpart net (tapped 2 3))
(defobjective (batch) (nn:cross-entropy (net (field batch x)) (field batch y)))
(defgroups (all "**" (optim:adamw :lr 0.01)))
(defrun :steps 20 :seed 0 DIAG)
"""


def compiled(tmp_path: Path, diag: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "d.lisp"
    path.write_text(RUN.replace("DIAG", diag))
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return result.experiment


def test_unselected_diagnostics_leave_the_ir_hash_unchanged(tmp_path: Path) -> None:
    plain = compiled(tmp_path, "")
    loop_only = compiled(tmp_path, ':diagnostics (:every 5 :select ("grad-norm/**" "param-norm/**"))')
    optimizer_only = compiled(tmp_path, ':diagnostics (:every 5 :select ("optim/**" "update-ratio/net.inner.layers.0.w"))')
    assert plain.ir_hash == loop_only.ir_hash == optimizer_only.ir_hash
    with_act = compiled(tmp_path, ':diagnostics (:every 5 :select ("act/**"))')
    assert "train:diagnostics" in with_act.module.programs
    assert with_act.module.programs["train"] == plain.module.programs["train"]


def test_selected_diagnostics_on_sampled_steps(tmp_path: Path) -> None:
    exp = compiled(tmp_path, ':diagnostics (:every 10 :select ("grad-norm/**" "act/net.inner/rms" "frac-positive/**" "optim/v/**" "update-ratio/net.inner.layers.1.w"))')
    result = train(exp, RunOptions(store=str(tmp_path / "runs")), say=lambda _: None)
    events = [e for e in RunFolder(Store.open(str(tmp_path / "runs")), result.slug).read_events() if e["kind"] == "diagnostic"]
    assert [e["step"] for e in events] == [10, 20]
    names = set(events[0]["values"])
    assert {"act/net.inner/rms", "frac-positive/net", "update-ratio/net.inner.layers.1.w"} <= names
    assert sum(n.startswith("grad-norm/") for n in names) == 4 and sum(n.startswith("optim/v/") for n in names) == 4
    assert not any(n.startswith("param-norm/") for n in names)
    assert 0.0 <= events[0]["values"]["frac-positive/net"] <= 1.0


def test_grad_norm_diagnostic_is_the_gradient_norm(tmp_path: Path) -> None:
    exp = compiled(tmp_path, ':diagnostics (:every 1 :select ("grad-norm/net.inner.layers.0.w"))')
    trainer = Trainer(exp)
    replay = Trainer(exp)
    record = trainer.train_step()
    out = replay.forward_backward(0)
    assert np.isclose(record.diagnostics["grad-norm/net.inner.layers.0.w"], np.linalg.norm(out["grad:net.inner.layers.0.w"]))


def test_ir_diagnostics_are_computed_in_every_loader_stage(tmp_path: Path) -> None:
    """act/ and defdiagnostic values on sampled steps after the curriculum switched the
    loader to another stage (each stage has its own diagnostics program)."""
    text = RUN.replace(":batch 32)", ":batch 32 :stages ((big :batch 64)))").replace(
        "(defrun", "(defcurriculum (when (>= (ctx :step) 5) (stage train big)))\n(defrun")
    path = tmp_path / "staged.lisp"
    path.write_text(text.replace("DIAG", ':diagnostics (:every 10 :select ("act/net.inner/rms" "frac-positive/**"))'))
    result = compile_file(path)
    exp = result.experiment
    assert exp is not None, [d.headline() for d in result.diagnostics]
    assert {"train:diagnostics", "train:diagnostics@big"} <= set(exp.module.programs)
    run = train(exp, RunOptions(store=str(tmp_path / "runs")), say=lambda _: None)
    events = RunFolder(Store.open(str(tmp_path / "runs")), run.slug).read_events()
    assert [e["step"] for e in events if e["kind"] == "stage"] == [5]  # the switch to big, before both samples
    sampled = [e for e in events if e["kind"] == "diagnostic"]
    assert [e["step"] for e in sampled] == [10, 20]
    for e in sampled:
        assert {"act/net.inner/rms", "frac-positive/net"} <= set(e["values"]), e
