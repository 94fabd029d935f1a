"""What docs/models-and-parameters.md says of parts and parameters: a repeated part's copies,
one by one (`part-models` lists them and `funcall` calls a model, so a forward can index
them or combine them other than in a chain), and the dtypes a parameter can train in."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.trainer import Trainer

HEAD = '(require "sexpgpu/nn" :as nn)\n(require "sexpgpu/optim" :as optim)\n'
TAIL = """
(defloader train :source (synthetic :spirals :n 64 :seed 0) :fields ((x :f32 (2)) (y :i32 ())) :batch 8)
(defpart net (m 2))
(defobjective (batch) (mean (net (ones (list 8 2)))))
(defgroups (all "**" (optim:sgd :lr 0.1)))
(defrun :steps 3 :seed 0)
"""


def first_loss_and_params(tmp_path: Path, model: str) -> tuple[float, dict[str, np.ndarray]]:
    (tmp_path / ".git").mkdir(exist_ok=True)
    path = tmp_path / "m.lisp"
    path.write_text(HEAD + model + TAIL)
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    trainer = Trainer(result.experiment)
    params = {k: np.array(v, dtype=np.float64) for k, v in trainer.host_params().items()}
    return float(trainer.train_step().loss), params


def linear(params: dict[str, np.ndarray], prefix: str, x: np.ndarray) -> np.ndarray:
    return x @ params[f"{prefix}.w"] + params[f"{prefix}.b"]


def test_the_copies_can_be_combined_other_than_in_a_chain(tmp_path: Path) -> None:
    loss, p = first_loss_and_params(tmp_path, """
(defmodel m (d)
  (defpart branches (repeat 3 (nn:linear d d)))
  (forward (x)
    (reduce #'+ (mapcar (lambda (b) (funcall b x)) (part-models branches)))))
""")
    x = np.ones((8, 2))
    want = sum(linear(p, f"net.branches.{i}", x) for i in range(3)).mean()
    assert loss == pytest.approx(want, rel=1e-5)


def test_nth_picks_a_copy_in_the_order_repeat_made_them(tmp_path: Path) -> None:
    loss, p = first_loss_and_params(tmp_path, """
(defmodel m (d)
  (defpart blocks (repeat 2 (nn:linear d d)))
  (forward (x)
    (let ((copies (part-models blocks)))
      (assert (= (length copies) 2))
      (funcall (nth 0 copies) (funcall (nth 1 copies) x)))))
""")
    x = np.ones((8, 2))
    backwards = linear(p, "net.blocks.0", linear(p, "net.blocks.1", x)).mean()
    forwards = linear(p, "net.blocks.1", linear(p, "net.blocks.0", x)).mean()
    assert loss == pytest.approx(backwards, rel=1e-5) and backwards != pytest.approx(forwards, rel=1e-5)


def test_part_models_of_a_part_that_is_not_repeated_says_what_it_takes(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    path = tmp_path / "m.lisp"
    path.write_text(HEAD + "(defmodel m (d)\n  (defpart one (nn:linear d d))\n  (forward (x) (length (part-models one))))\n" + TAIL)
    (diag,) = [d for d in compile_file(path).diagnostics if d.severity == "error"]
    assert diag.code == "E103" and diag.line == 5
    assert "`part-models`: argument 1 must be a repeated part (a defpart of (repeat N ...))" in diag.message


DTYPED = """
(defmodel m (d)
  (defparam w (2 2) :dtype {dtype})
  (forward (x) (cast (matmul (cast x {dtype}) w) :f32)))
"""


def test_an_f64_parameter_trains_in_f64(tmp_path: Path) -> None:
    """docs/models-and-parameters.md, defparam's :dtype."""
    (tmp_path / ".git").mkdir()
    path = tmp_path / "m.lisp"
    path.write_text(HEAD + DTYPED.format(dtype=":f64") + TAIL)
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    trainer = Trainer(result.experiment)
    before = trainer.host_params()["net.w"].copy()
    trainer.train_step()
    after = trainer.host_params()["net.w"]
    assert after.dtype == np.float64 and not np.array_equal(before, after)


def test_a_trainable_bf16_parameter_is_t001_at_defrun(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    path = tmp_path / "m.lisp"
    path.write_text(HEAD + DTYPED.format(dtype=":bf16") + TAIL)
    (diag,) = [d for d in compile_file(path).diagnostics if d.severity == "error"]
    assert diag.code == "T001" and "updates must keep the parameter's shape and dtype" in diag.message
    assert path.read_text().splitlines()[diag.line - 1].startswith("(defrun")
