"""Every optimizer in sexpgpu/optim against its torch.optim equivalent, step by step, on the
same parameters and the same gradients (a linear regression, f32)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.trainer import Trainer

torch = pytest.importorskip("torch")

RUN_FILE = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defloader train
  :source (synthetic :linear :n 256 :dim 4 :seed 3)
  :fields ((x :f32 (4)) (y :f32 (2)))
  :batch 32)
(defpart net (nn:linear 4 2))
(defobjective (batch) (nn:mse (net (field batch x)) (field batch y)))
(defgroups (all "**" OPTIMIZER))
(defrun :steps 20 :seed 1)
"""

CASES = {
    "sgd": ("(optim:sgd :lr 0.05)", lambda ps: torch.optim.SGD(ps, lr=0.05)),
    "sgd-decay": ("(optim:sgd :lr 0.05 :weight-decay 0.1)", lambda ps: torch.optim.SGD(ps, lr=0.05, weight_decay=0.1)),
    "momentum": ("(optim:momentum :lr 0.05 :beta 0.9)", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
    "nesterov": ("(optim:momentum :lr 0.05 :beta 0.9 :nesterov t)", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True)),
    "adam": ("(optim:adam :lr 0.01)", lambda ps: torch.optim.Adam(ps, lr=0.01)),
    "adam-decay": ("(optim:adam :lr 0.01 :beta2 0.99 :weight-decay 0.1)", lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)),
    "adamw": ("(optim:adamw :lr 0.01 :weight-decay 0.1)", lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1)),
    "lion": ("(optim:lion :lr 0.05)", lambda ps: Lion(ps, lr=0.05)),
    "lion-decay": ("(optim:lion :lr 0.03 :beta1 0.5 :beta2 0.98 :weight-decay 0.5)", lambda ps: Lion(ps, lr=0.03, betas=(0.5, 0.98), weight_decay=0.5)),
    "rmsprop": ("(optim:rmsprop)", lambda ps: torch.optim.RMSprop(ps)),
    "rmsprop-decay": ("(optim:rmsprop :lr 0.005 :alpha 0.9 :weight-decay 0.1)", lambda ps: torch.optim.RMSprop(ps, lr=0.005, alpha=0.9, weight_decay=0.1)),
}


class Lion(torch.optim.Optimizer):
    """The reference Lion (Chen et al. 2023, Algorithm 2), as torch has none: decoupled
    weight decay, then the sign of the interpolated momentum, then the momentum update."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["m"] = torch.zeros_like(p)
                m = state["m"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(m * beta1 + p.grad * (1 - beta1)), alpha=-group["lr"])
                m.mul_(beta2).add_(p.grad, alpha=1 - beta2)


@pytest.mark.parametrize("name", sorted(CASES))
def test_optimizer_matches_torch(name: str, tmp_path: Path) -> None:
    form, make = CASES[name]
    path = tmp_path / f"{name}.lisp"
    path.write_text(RUN_FILE.replace("OPTIMIZER", form))
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    ours = Trainer(result.experiment)
    replay = Trainer(result.experiment)
    w = torch.tensor(ours.params["net.w"].copy(), requires_grad=True)
    b = torch.tensor(ours.params["net.b"].copy(), requires_grad=True)
    opt = make([w, b])
    for step in range(20):
        batch = replay.stream.next()
        loss = ((torch.tensor(batch["x"]) @ w + b - torch.tensor(batch["y"])) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ours_loss = ours.train_step().loss
        assert abs(ours_loss - loss.item()) <= 1e-5 * max(1.0, abs(loss.item())), f"step {step}"
        np.testing.assert_allclose(ours.params["net.w"], w.detach().numpy(), rtol=2e-5, atol=1e-6, err_msg=f"step {step}")
        np.testing.assert_allclose(ours.params["net.b"], b.detach().numpy(), rtol=2e-5, atol=1e-6, err_msg=f"step {step}")
