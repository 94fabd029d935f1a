"""The forms of runfile.md, written exactly as the spec shows them, compile and train."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.attempt import RunOptions, train

# runfile.md's examples, joined into one file in contract order (the corpus is generated)
SPEC_FILE = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defknob lr 0.001)
(defknob seq 16)
(defknob d 32)
(defknob heads 4)

(defmodel linear (d-in d-out &key (bias t))
  (defparam w (d-in d-out) :init (normal :std (/ 1.0 (sqrt d-in))))
  (defparam b (d-out) :init :zeros :when bias)     ; b is nil when bias is false
  (forward (x) (if b (+ (matmul x w) b) (matmul x w))))

(defmodel block (d heads)
  (defpart norm1 (nn:layer-norm d))
  (defpart attn (nn:causal-attention d heads))
  (defpart norm2 (nn:layer-norm d))
  (defpart mlp (nn:mlp d (* 4 d) d :activation #'gelu))
  (forward (x)
    (let ((x (+ x (attn (norm1 x)))))
      (+ x (mlp (norm2 x))))))

(defmodel lm (vocab d heads)
  (defpart embed (nn:embedding vocab d))
  (defpart blocks (repeat 2 (block d heads)))
  (defpart out (linear d vocab))
  (forward (tokens) (out (blocks (embed tokens)))))

(defloader train
  :source (text "data/corpus.txt")               ; or npz npy csv jsonl synthetic; any fsspec URL
  :prepare ((char-vocab) (windows :length (+ seq 1)) (split :train 0.9 :seed 0))
  :fields ((tokens :i32 (seq)) (targets :i32 (seq)))
  :batch 64
  :shuffle t
  :stages ((short :batch 128 :length 9) (long :batch 32 :length 17)))

(defloader val
  :source (text "data/corpus.txt")
  :prepare ((char-vocab) (windows :length (+ seq 1)) (split :train 0.9 :seed 0))
  :fields ((tokens :i32 (seq)) (targets :i32 (seq)))
  :batch 64)

(defpart model (lm 40 d heads))

(defobjective (batch)
  (let ((logits (model (field batch tokens))))
    (metric acc (nn:accuracy logits (field batch targets)))
    (nn:cross-entropy logits (field batch targets))))   ; the scalar loss

(defevaluate (batch)
  (let ((logits (model (field batch tokens))))
    (metric loss (nn:cross-entropy logits (field batch targets)))
    (metric acc (nn:accuracy logits (field batch targets)))))

(defeval val :loader val :every 250)
(defeval test :loader val :at :end)
(deftarget val loss :<= 1.6)        ; the run stops, successful, the first time this holds

(defgroups
  (decay    "**.w"  (optim:adamw :lr (optim:warmup-cosine lr :warmup 100) :weight-decay 0.1))
  (no-decay "**"    (optim:adamw :lr (optim:warmup-cosine lr :warmup 100) :weight-decay 0.0))
  (frozen   "model.embed.*" :frozen))

(defcurriculum
  (start (stage train short))
  (when (>= (ctx :step) 20) (stage train long)))

(defrun
  :steps 40
  :microbatches 2                 ; gradient accumulation; the file's batch is per microbatch
  :precision :bf16                ; :f32 (default) or :bf16 with f32 master weights
  :seed 1337
  :log-every 10
  :checkpoint (:every 500 :keep 3)
  :finite-guard (:skip 3)         ; skip up to 3 non-finite steps in a row, then stop (failed)
  :diagnostics (:every 100 :select ("grad-norm/**"))
  :meta (:question "does warmup matter at this width?"))
"""


def test_the_spec_forms_compile_and_train(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    rng = np.random.default_rng(0)  # varied text, so no train window repeats in val
    letters = list("abcdefghijklmnopqrstuvwxyz .,")
    (tmp_path / "data" / "corpus.txt").write_text("".join(rng.choice(letters, size=20000)))
    path = tmp_path / "exp.lisp"
    path.write_text(SPEC_FILE)
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    experiment = result.experiment
    groups = {g.name: g for g in experiment.groups}
    # first match wins: "**" takes everything "**.w" left, so the frozen group is empty
    assert groups["frozen"].optimizer is None and groups["frozen"].params == []
    assert [d.code for d in result.diagnostics] == ["W002"]
    assert all(p.endswith(".w") for p in groups["decay"].params)
    assert experiment.run.precision == "bf16" and experiment.run.microbatches == 2
    assert {"train@short", "train@long", "curriculum", "eval:val", "eval:test"} <= set(experiment.module.programs)
    outcome = train(experiment, RunOptions(store=str(tmp_path / "runs")), say=lambda _: None)
    assert outcome.exit_code == 0 and outcome.steps == 40
