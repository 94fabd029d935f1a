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


def gelu_tanh(x):  # type: ignore[no-untyped-def]
    return torch.nn.functional.gelu(x, approximate="tanh")


def test_char_transformer_matches_pytorch_for_50_steps() -> None:
    """Embeddings, layer norm, causal multi-head attention, GELU MLP, AdamW: the whole
    char transformer in PyTorch with our initial parameters and batches."""
    experiment = compiled(REPO / "examples" / "char-transformer.lisp")
    ours, replay = Trainer(experiment), Trainer(experiment)
    P = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in ours.params.items()}
    opt = torch.optim.AdamW(list(P.values()), lr=0.003, weight_decay=0.0)
    knobs = experiment.knob_values()
    d, heads, depth, context = knobs["width"], knobs["heads"], knobs["depth"], knobs["context"]

    def linear(x, prefix, bias=True):  # type: ignore[no-untyped-def]
        y = x @ P[prefix + ".w"]
        return y + P[prefix + ".b"] if bias else y

    def norm(x, prefix):  # type: ignore[no-untyped-def]
        return torch.nn.functional.layer_norm(x, (d,), P[prefix + ".weight"], P[prefix + ".bias"], eps=1e-5)

    def forward(tokens):  # type: ignore[no-untyped-def]
        b, s = tokens.shape
        x = P["model.embed.table"][tokens] + P["model.pos.table"][torch.arange(context)]
        mask = torch.tril(torch.ones(s, s, dtype=torch.bool))
        for i in range(depth):
            p = f"model.blocks.{i}"
            h = norm(x, p + ".norm1")
            q, k, v = (linear(h, f"{p}.attn.{w}").reshape(b, s, heads, d // heads).permute(0, 2, 1, 3) for w in ("wq", "wk", "wv"))
            scores = (q @ k.transpose(-1, -2)) / (d // heads) ** 0.5
            att = torch.softmax(torch.where(mask, scores, torch.tensor(-1e9)), dim=-1)
            x = x + linear((att @ v).permute(0, 2, 1, 3).reshape(b, s, d), f"{p}.attn.wo")
            h = norm(x, p + ".norm2")
            x = x + linear(gelu_tanh(linear(h, f"{p}.mlp.layers.0")), f"{p}.mlp.layers.1")
        return linear(norm(x, "model.norm"), "model.head", bias=False)

    for step in range(50):
        batch = replay.stream.next()
        ours_loss = ours.train_step()["loss"]
        logits = forward(torch.tensor(batch["tokens"].astype(np.int64)))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(batch["targets"].astype(np.int64)).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert abs(ours_loss - loss.item()) <= 1e-4 * max(1.0, abs(loss.item())), f"step {step}: ours {ours_loss}, torch {loss.item()}"
