"""Whole models against PyTorch (CPU, f32): the same initial parameters (taken from our
trainer), the same batches, the same optimizer; per-step losses equal within 1e-4 relative."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.loop import Trainer

torch = pytest.importorskip("torch")


def compiled(path: Path):  # type: ignore[no-untyped-def]
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return result.experiment


def test_quickstart_matches_pytorch_for_50_steps() -> None:
    experiment = compiled(REPO / "examples" / "quickstart.lisp")
    trainer = Trainer(experiment)
    torch.manual_seed(0)
    w0 = torch.tensor(trainer.params["net.layers.0.w"].copy(), requires_grad=True)
    b0 = torch.tensor(trainer.params["net.layers.0.b"].copy(), requires_grad=True)
    w1 = torch.tensor(trainer.params["net.layers.1.w"].copy(), requires_grad=True)
    b1 = torch.tensor(trainer.params["net.layers.1.b"].copy(), requires_grad=True)
    opt = torch.optim.SGD([w0, b0, w1, b1], lr=0.1)
    replay = Trainer(experiment)  # the same batches, drawn by an identical stream
    for step in range(50):
        batch = replay.stream.next()
        ours = trainer.train_step()["loss"]
        x = torch.tensor(batch["x"])
        y = torch.tensor(batch["y"].astype(np.int64))
        logits = torch.relu(x @ w0 + b0) @ w1 + b1
        loss = torch.nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert abs(ours - loss.item()) <= 1e-4 * max(1.0, abs(loss.item())), f"step {step}: ours {ours}, torch {loss.item()}"
    assert np.allclose(trainer.params["net.layers.1.w"], w1.detach().numpy(), rtol=1e-4, atol=1e-6)
