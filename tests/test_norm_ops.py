"""softmax, log-softmax, layer-norm and rms-norm as ops of their own: how they are staged, what
they accept, and the `mean` they must agree with. (Their gradients are checked against
finite differences in test_ops.py and against torch in test_ops_torch.py.)"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.ir.builder import Builder
from sexpgpu.ir.dtypes import DType
from sexpgpu.ir.graph import TensorType
from sexpgpu.ir.ops import OpError
from sexpgpu.runtime.numpy_backend import CompiledProgram

RUN = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defmodel net ()
  (defpart inner (nn:linear 2 8))
  (defpart norm (nn:layer-norm 8 :eps EPS))
  (defpart out (nn:linear 8 3))
  (forward (x) (out (rms-norm (norm (inner x)) :eps 1/1000000))))
(defloader train :source (synthetic :spirals :n 256 :classes 3) :fields ((x :f32 (2)) (y :i32 ())) :batch 32)
(defpart model (net))
(defobjective (batch) (nn:cross-entropy (model (field batch x)) (field batch y)))
(defgroups (all "**" (optim:sgd :lr 0.1)))
(defrun :steps 2)
"""


def test_the_norms_and_softmax_are_single_ops_and_eps_may_be_a_ratio(tmp_path: Path) -> None:
    path = tmp_path / "norms.lisp"
    path.write_text(RUN.replace("EPS", "1/100000"))
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    ops = [n.op for n in result.experiment.module.programs["forward"].nodes]
    assert {"layer_norm", "rms_norm", "log_softmax"} <= set(ops)
    attrs = {n.op: n.attrs for n in result.experiment.module.programs["forward"].nodes}
    assert attrs["layer_norm"]["eps"] == 1e-5 and attrs["rms_norm"]["eps"] == 1e-6
    bad = tmp_path / "bad.lisp"
    bad.write_text(RUN.replace("EPS", '"small"'))
    problems = [d.headline() for d in compile_file(bad).diagnostics]
    assert any("must be a number" in p for p in problems), problems


def test_softmax_takes_exactly_one_axis() -> None:
    b = Builder("s")
    x = b.input("x", "data", TensorType(dtype=DType.f32, shape=(2, 3)))
    for axis in (None, [0, 1], True):
        with pytest.raises(OpError, match="one :axis"):
            b.op("softmax", x, axis=axis)


def test_a_bf16_mean_divides_by_the_exact_count() -> None:
    """257 is not a bf16 number; the mean (summed in f32) divides by 257, not by 256, as the
    CUDA kernel and the norms' kernels do."""
    b = Builder("m")
    x = b.input("x", "data", TensorType(dtype=DType.bf16, shape=(2, 257)))
    program = b.program({"m": b.op("mean", x, axis=[-1], keepdims=True)})
    data = np.full((2, 257), 1.0, dtype=ml_dtypes.bfloat16)
    got = CompiledProgram(program).run({"x": data})["m"]
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float32), np.ones((2, 1), dtype=np.float32))
