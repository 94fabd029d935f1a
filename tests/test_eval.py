"""Evaluation passes: exact example-weighted metrics over the whole loader, cadence,
targets, and the train/eval overlap check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.data.spec import DataError
from sexpgpu.runtime.evaluation import EvalPass
from sexpgpu.runtime.attempt import RunOptions, train
from sexpgpu.runtime.trainer import Trainer
from sexpgpu.runtime.backend import HostBackend
from sexpgpu.runtime.numpy_backend import CompiledProgram
from sexpgpu.runtime.runfolder import RunFolder
from sexpgpu.runtime.store import Store

RUN = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defloader train :source (synthetic :spirals :n 1000 :classes 3 :seed 0) :prepare ((split :train 0.8 :seed 1))
  :fields ((x :f32 (2)) (y :i32 ())) :batch 32 :shuffle t)
(defloader val :source (synthetic :spirals :n 1000 :classes 3 :seed 0) VALPREP
  :fields ((x :f32 (2)) (y :i32 ())) :batch 64)
(defpart net (nn:mlp 2 32 3))
(defobjective (batch) (nn:cross-entropy (net (field batch x)) (field batch y)))
(defevaluate (batch)
  (let ((logits (net (field batch x))))
    (metric loss (nn:cross-entropy logits (field batch y)))
    (metric acc (nn:accuracy logits (field batch y)))))
EVALS
(defgroups (all "**" (optim:sgd :lr 0.3)))
(defrun :steps 300 :seed 0 :log-every 100)
"""
SPLIT = ":prepare ((split :train 0.8 :seed 1))"


def experiment(tmp_path: Path, evals: str, valprep: str = SPLIT):  # type: ignore[no-untyped-def]
    path = tmp_path / "ev.lisp"
    path.write_text(RUN.replace("EVALS", evals).replace("VALPREP", valprep))
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return result.experiment


def test_eval_metrics_are_exact_means_over_every_example(tmp_path: Path) -> None:
    exp = experiment(tmp_path, "(defeval val :loader val :at :end)")
    trainer = Trainer(exp)
    for _ in range(50):
        trainer.train_step()
    evaluator = EvalPass(exp, exp.evals[0], trainer.dataset, HostBackend())
    assert evaluator.dataset.n == 200 and evaluator.dataset.n % 64 != 0
    got = evaluator.run(trainer.params)
    single = CompiledProgram(exp.module.programs["eval:val:1"])
    per_example = []
    for i in range(evaluator.dataset.n):
        feeds = {**trainer.params, **{f"data.{k}": evaluator.dataset.fields[k][i : i + 1] for k in ("x", "y")}}
        out = single.run(feeds)
        per_example.append((float(out["metric:loss"]), float(out["metric:acc"])))
    want = np.mean(np.array(per_example), axis=0)
    assert got["loss"] == pytest.approx(want[0], rel=1e-5)
    assert got["acc"] == pytest.approx(want[1], rel=1e-9)


def test_cadence_target_and_summary(tmp_path: Path) -> None:
    exp = experiment(tmp_path, "(defeval val :loader val :every 100)\n(deftarget val acc :>= 0.99)")
    result = train(exp, RunOptions(store=str(tmp_path / "runs")), say=lambda _: None)
    folder = RunFolder(Store.open(str(tmp_path / "runs")), result.slug)
    evals = [e for e in folder.read_events() if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == [100, 200, 300]
    status = folder.read_status()
    assert status is not None and status.summary is not None
    assert set(status.summary.last_eval) == {"val/loss", "val/acc"}
    assert status.summary.best_eval["val/acc"] == max(e["metrics"]["acc"] for e in evals)


def test_target_stops_the_run_successfully(tmp_path: Path) -> None:
    exp = experiment(tmp_path, "(defeval val :loader val :every 50)\n(deftarget val acc :>= 0.5)")
    result = train(exp, RunOptions(store=str(tmp_path / "runs")), say=lambda _: None)
    assert result.exit_code == 0 and result.reason.startswith("target reached") and result.steps < 300


def test_eval_sharing_examples_with_train_is_refused_unless_declared(tmp_path: Path) -> None:
    exp = experiment(tmp_path, "(defeval val :loader val :at :end)", valprep="")
    with pytest.raises(DataError, match="shares"):
        train(exp, RunOptions(store=str(tmp_path / "runs"), max_steps=5), say=lambda _: None)
    ok = experiment(tmp_path, "(defeval val :loader val :at :end :overlap t)", valprep="")
    assert train(ok, RunOptions(store=str(tmp_path / "runs2"), max_steps=5), say=lambda _: None).exit_code == 0


def test_defeval_without_defevaluate_is_a_diagnostic(tmp_path: Path) -> None:
    path = tmp_path / "bad.lisp"
    text = RUN.replace("EVALS", "(defeval val :loader val :at :end)").replace("VALPREP", SPLIT)
    start = text.index("(defevaluate")
    end = text.index("(defeval val")
    path.write_text(text[:start] + text[end:])
    (diag,) = [d for d in compile_file(path).diagnostics if d.severity == "error"]
    assert diag.code == "C001" and "defevaluate" in diag.message


def test_sxhash_is_the_same_in_every_process() -> None:
    """Python's string hash changes with PYTHONHASHSEED; a file's result must not."""
    import os
    import subprocess
    import sys

    form = '(list (sxhash "abc") (sxhash (list 1 "a" #\\b (quote x) 1.5 2/3)))'
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-m", "sexpgpu", "eval", form], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        outs.add(done.stdout.strip())
    assert len(outs) == 1, outs
