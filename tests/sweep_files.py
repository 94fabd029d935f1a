"""Generated sweep files over the quickstart model, for tests/test_sweep_groups.py and
bench/check_latency.py: a grid of learning rates and seeds (scalars only), and a grid that
also changes the hidden width (a shape)."""

from __future__ import annotations

from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart.lisp"


def learning_rates(count: int) -> list[float]:
    return [round(0.002 * 1.2**i, 6) for i in range(count)]


def lr_seed_grid(lrs: int = 32, seeds: int = 32) -> str:
    """LRS learning rates x SEEDS seeds: LRS*SEEDS points, none of which changes a shape."""
    text = QUICKSTART.read_text()
    axes = f"(defsweep grid :lr ({' '.join(map(str, learning_rates(lrs)))}) :run-seed ({' '.join(map(str, range(seeds)))}))"
    text = text.replace("(defknob lr 0.1)", f"(defknob lr 0.1)\n(defknob run-seed 0)\n\n{axes}")
    return text.replace("(defrun :steps 300 :seed 0)", "(defrun :steps 300 :seed run-seed)")


def width_grid(widths: int = 8, lrs: int = 8) -> str:
    """WIDTHS hidden widths x LRS learning rates: each width is a shape of its own."""
    text = QUICKSTART.read_text()
    axes = f"(defsweep widths :width ({' '.join(str(16 + 8 * i) for i in range(widths))}) :lr ({' '.join(map(str, learning_rates(lrs)))}))"
    text = text.replace("(defknob lr 0.1)", f"(defknob lr 0.1)\n(defknob width 64)\n\n{axes}")
    return text.replace("(nn:mlp 2 64 3)", "(nn:mlp 2 width 3)")
