"""Whole models against PyTorch (CPU, f32): the same initial parameters (taken from our
trainer), the same batches, the same optimizer; per-step losses equal within 1e-4 relative
for 50 steps (quality.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from conftest import REPO
from sexpgpu.compile.pipeline import compile_file
from sexpgpu.runtime.trainer import Trainer

torch = pytest.importorskip("torch")
import torch_reference as ref  # noqa: E402


def compiled(path: Path):  # type: ignore[no-untyped-def]
    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return result.experiment


def compare(
    example: str, make_forward: Callable[[Any, Any], Any], make_opt: Callable[[list[Any]], Any], inputs: str, labels: str, check_params: bool = True
) -> Trainer:
    experiment = compiled(REPO / "examples" / example)
    ours, replay = Trainer(experiment), Trainer(experiment)
    P = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in ours.params.items()}
    forward = make_forward(P, experiment.knob_values())
    opt = make_opt(list(P.values()))
    for step in range(50):
        batch = replay.stream.next()
        ours_loss = ours.train_step().loss
        x = torch.tensor(batch[inputs].astype(np.int64) if batch[inputs].dtype.kind == "i" else batch[inputs])
        loss = ref.sequence_loss(forward(x), torch.tensor(batch[labels].astype(np.int64)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert abs(ours_loss - loss.item()) <= 1e-4 * max(1.0, abs(loss.item())), f"step {step}: ours {ours_loss}, torch {loss.item()}"
    for path, value in P.items() if check_params else ():
        theirs = value.detach().numpy()
        assert np.linalg.norm(ours.params[path] - theirs) <= 1e-3 * max(np.linalg.norm(theirs), 1e-6), path
    return ours


def test_quickstart_matches_pytorch_for_50_steps() -> None:
    compare("quickstart.lisp", lambda P, k: ref.mlp(P), lambda ps: torch.optim.SGD(ps, lr=0.1), "x", "y")


def test_char_transformer_matches_pytorch_for_50_steps() -> None:
    """Embeddings, layer norm, causal multi-head attention, GELU MLP, AdamW. Parameters are
    not compared: the attention key bias gets a gradient that is zero in exact arithmetic
    (softmax ignores a per-query constant), so Adam walks it on rounding noise in both."""
    compare("char-transformer.lisp", ref.char_transformer, lambda ps: torch.optim.AdamW(ps, lr=0.003, weight_decay=0.0), "tokens", "targets", check_params=False)


def test_cnn_matches_pytorch_for_50_steps() -> None:
    """conv2d, max-pool2d, ReLU, linear, momentum SGD on the digits."""
    compare("cnn.lisp", lambda P, k: ref.cnn(P), lambda ps: torch.optim.SGD(ps, lr=0.03, momentum=0.9), "image", "label")
