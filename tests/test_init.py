"""(kaiming) and (xavier) draw with the fans PyTorch's torch.nn.init computes for the same
layer: a matrix applied as x @ w is (in, out) here and (out, in) in PyTorch, a convolution
weight is (c-out, c-in, k...) in both. The oracle is torch's own initializer on the layer's
weight in PyTorch's layout; the bounds are compared through the largest value drawn."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.init import initial_value

torch = pytest.importorskip("torch")

# (our parameter's shape, the same layer's weight shape in PyTorch)
LAYERS = {
    "linear": ((96, 48), (48, 96)),  # nn:linear's w is (d-in d-out); torch.nn.Linear's (out, in)
    "conv1d": ((40, 12, 5), (40, 12, 5)),
    "conv2d": ((64, 8, 3, 3), (64, 8, 3, 3)),
    "conv2d-wide": ((8, 64, 3, 3), (8, 64, 3, 3)),
}

RUN = """(require "sexpgpu/optim" :as optim)
(defmodel net ()
  {params}
  (forward (x) (+ (mean x) {uses})))
(defloader train :source (synthetic :spirals :n 64 :classes 3 :seed 0) :fields ((x :f32 (2)) (y :i32 ())) :batch 8)
(defpart m (net))
(defobjective (batch) (m (field batch x)))
(defgroups (all "**" (optim:sgd :lr 0.1)))
(defrun :steps 1 :seed 0)
"""


def drawn(tmp_path: Path, kind: str) -> dict[str, np.ndarray]:
    params = "\n  ".join(
        f"(defparam {name.replace('-', '_')} ({' '.join(map(str, ours))}) :init ({kind}))" for name, (ours, _) in LAYERS.items()
    )
    (tmp_path / ".git").mkdir(exist_ok=True)
    path = tmp_path / f"{kind}.lisp"
    uses = " ".join(f"(mean {name.replace('-', '_')})" for name in LAYERS)
    path.write_text(RUN.format(params=params, uses=uses))
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return {p.path.split(".")[-1]: initial_value(p, seed=0) for p in result.experiment.params}


def torch_bound(kind: str, shape: tuple[int, ...]) -> float:
    """The bound of torch's uniform initializer for a weight of SHAPE, read off the largest
    of many draws (a draw comes within 0.1% of the bound with overwhelming probability)."""
    w = torch.empty(shape, dtype=torch.float64)
    big = torch.empty((64, *shape), dtype=torch.float64)
    for target in (w, *big):
        if kind == "kaiming":
            torch.nn.init.kaiming_uniform_(target, a=0.0, mode="fan_in", nonlinearity="relu")
        else:
            torch.nn.init.xavier_uniform_(target)
    return float(max(w.abs().max(), big.abs().max()))


@pytest.mark.parametrize("kind", ["kaiming", "xavier"])
def test_fans_are_pytorchs_for_each_layer(tmp_path: Path, kind: str) -> None:
    values = drawn(tmp_path, kind)
    for name, (ours, theirs) in LAYERS.items():
        value = values[name.replace("-", "_")]
        assert value.shape == ours
        expected = torch_bound(kind, theirs)
        # ours is one draw of the layer: its largest value is within 1% of the bound, never past it
        largest = float(np.abs(value).max())
        assert expected * 0.99 <= largest <= expected * 1.001, (name, largest, expected)
