"""The examples' models written directly in PyTorch, reading parameters by our paths: the
oracle for tests/test_model_oracle.py and the reference side of bench/cpu_vs_torch.py."""

from __future__ import annotations

from typing import Any, Callable

import torch

F = torch.nn.functional
Params = dict[str, torch.Tensor]


def mlp(P: Params, prefix: str = "net.layers") -> Callable[[torch.Tensor], torch.Tensor]:
    count = len([k for k in P if k.startswith(prefix) and k.endswith(".w")])

    def forward(x: torch.Tensor) -> torch.Tensor:
        for i in range(count):
            x = x @ P[f"{prefix}.{i}.w"] + P[f"{prefix}.{i}.b"]
            if i < count - 1:
                x = torch.relu(x)
        return x

    return forward


def char_transformer(P: Params, knobs: dict[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    d, heads, depth, context = knobs["width"], knobs["heads"], knobs["depth"], knobs["context"]

    def linear(x: torch.Tensor, prefix: str, bias: bool = True) -> torch.Tensor:
        y = x @ P[prefix + ".w"]
        return y + P[prefix + ".b"] if bias else y

    def norm(x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.layer_norm(x, (d,), P[prefix + ".weight"], P[prefix + ".bias"], eps=1e-5)

    def forward(tokens: torch.Tensor) -> torch.Tensor:
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
            x = x + linear(F.gelu(linear(h, f"{p}.mlp.layers.0"), approximate="tanh"), f"{p}.mlp.layers.1")
        return linear(norm(x, "model.norm"), "model.head", bias=False)

    return forward


def cnn(P: Params) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        for layer in ("net.conv1", "net.conv2"):
            x = F.max_pool2d(F.relu(F.conv2d(x, P[layer + ".w"], P[layer + ".b"], padding=1)), 2)
        return x.reshape(x.shape[0], -1) @ P["net.head.w"] + P["net.head.b"]

    return forward


def vgg(P: Params) -> Callable[[torch.Tensor], torch.Tensor]:
    """bench/cpu_workloads.py's VGG block: two 3x3 convs with ReLUs, a 2x2 max-pool, a linear head."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        for layer in ("net.conv1", "net.conv2"):
            x = F.relu(F.conv2d(x, P[layer + ".w"], P[layer + ".b"], padding=1))
        x = F.max_pool2d(x, 2)
        return x.reshape(x.shape[0], -1) @ P["net.head.w"] + P["net.head.b"]

    return forward


def sequence_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
