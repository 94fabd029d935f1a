"""Gradient accumulation: M microbatches of B equal one batch of M*B (up to reduction order)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.trainer import Trainer

RUN = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defloader train :source (synthetic :spirals :n 512 :classes 3 :seed 0)
  :fields ((x :f32 (2)) (y :i32 ())) :batch BATCH)
(defpart net (nn:mlp 2 32 3))
(defobjective (batch)
  (let ((logits (net (field batch x))))
    (metric acc (nn:accuracy logits (field batch y)))
    (nn:cross-entropy logits (field batch y))))
(defgroups (all "**" (optim:adamw :lr 0.01)))
(defrun :steps 20 :seed 3 MICRO)
"""


def trainer(tmp_path: Path, batch: int, micro: int) -> Trainer:
    path = tmp_path / f"m{micro}.lisp"
    path.write_text(RUN.replace("BATCH", str(batch)).replace("MICRO", f":microbatches {micro}"))
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return Trainer(result.experiment)


def test_microbatches_equal_the_large_batch(tmp_path: Path) -> None:
    small, large = trainer(tmp_path, 16, 4), trainer(tmp_path, 64, 1)
    for step in range(20):
        a, b = small.train_step(), large.train_step()
        assert abs(a.loss - b.loss) <= 1e-5 * max(1.0, abs(b.loss)), step
        assert abs(a.metrics["acc"] - b.metrics["acc"]) <= 1e-6
    for path in small.params:
        np.testing.assert_allclose(small.params[path], large.params[path], rtol=1e-4, atol=1e-6)
