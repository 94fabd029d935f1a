"""Curves of several runs, overlaid: a PNG or SVG file through matplotlib, or text for a
terminal through plotext. Both are the optional `plot` extra (pip install 'sexpgpu[plot]');
without it, `MissingExtra` says so.

The curves come downsampled to `BUCKETS` spans of steps (each span's first, last, lowest and
highest point: sexpgpu/results/curves.py), more than the pixels of a figure's width, so a
run of a million steps is drawn from a few thousand points and looks the same."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from .curves import Curves
from .listing import RunRecord

EXTRA = "pip install 'sexpgpu[plot]'"
IMAGE_FORMATS = ("png", "svg")
TEXT_MARKERS = "x+o*#%@&"
BUCKETS = 2000  # a figure is 1,040 pixels wide (8 in at 130 dpi), a terminal far fewer


class MissingExtra(Exception):
    """matplotlib or plotext is not installed: exit 4, with the pip command."""


@dataclass(frozen=True)
class Line:
    label: str
    steps: list[int]
    values: list[Optional[float]]  # None: a gap (a non-finite value)
    markers: bool = False  # sparse points (an eval series): drawn with a marker each


@dataclass(frozen=True)
class Panel:
    metric: str
    lines: list[Line]


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def run_labels(records: Sequence[RunRecord]) -> list[str]:
    """A legend label per run: its slug, or for points of one sweep `SWEEP-POINT` and the
    knobs whose values differ between the runs shown (`lr-2 lr=0.1`)."""
    if not records:
        return []
    names = list(dict.fromkeys(k for r in records for k in r.knobs))
    differ = [k for k in names if len({_shown(r.knobs.get(k)) for r in records}) > 1]
    one_sweep = len({(r.file, r.variant, r.sweep) for r in records}) == 1 and all(r.sweep is not None for r in records)
    if not one_sweep:
        return [r.slug for r in records]
    labels = [" ".join([f"{r.sweep}-{r.point}", *(f"{k}={_shown(r.knobs.get(k))}" for k in differ)]) for r in records]
    return labels if len(set(labels)) == len(labels) else [r.slug for r in records]


def panels_for(runs: Sequence[tuple[str, Curves]], metrics: Sequence[str]) -> tuple[list[Panel], list[str]]:
    """One panel per metric, a line per run that has it; and a note for each run without it."""
    panels, notes = [], []
    for metric in metrics:
        lines = []
        for label, curves in runs:
            series = curves.named(metric)
            if series is None or not series.steps:
                notes.append(f"{label} has no series {metric}")
                continue
            lines.append(Line(label, list(series.steps), list(series.values), markers=series.group == "eval"))
        panels.append(Panel(metric, lines))
    return panels, notes


def _log_ok(panel: Panel) -> bool:
    return all(v is None or v > 0 for line in panel.lines for v in line.values)


# ---------------------------------------------------------------------------------------------
# An image


def write_image(panels: Sequence[Panel], path: Path, log_y: bool = False, title: Optional[str] = None) -> None:
    """PANELS stacked in one figure, saved as PATH's format (png or svg). Each run's line has
    the SVG id `series-P-I` (panel P, line I), so a reader can find it."""
    try:
        from matplotlib import rc_context
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtra(f"plot -o needs matplotlib, the plot extra: {EXTRA} ({exc})") from exc
    fmt = path.suffix.lstrip(".").lower()
    # a fixed salt and no date: the same curves give the same file
    with rc_context({"svg.hashsalt": "sexpgpu", "svg.fonttype": "none"}):
        figure = Figure(figsize=(8.0, 3.4 * len(panels) + 0.4), layout="constrained")
        axes_list = figure.subplots(len(panels), 1, squeeze=False)[:, 0]
        for p, (panel, axes) in enumerate(zip(panels, axes_list)):
            for i, line in enumerate(panel.lines):
                values = [math.nan if v is None else v for v in line.values]
                (drawn,) = axes.plot(line.steps, values, label=line.label, linewidth=1.4, marker="o" if line.markers else None, markersize=3.5)
                drawn.set_gid(f"series-{p}-{i}")
            axes.set_title(panel.metric, loc="left", fontsize=11)
            axes.set_xlabel("step")
            axes.set_ylabel(panel.metric)
            axes.grid(True, alpha=0.3)
            if log_y and _log_ok(panel):
                axes.set_yscale("log")
            if panel.lines:
                axes.legend(fontsize=8, loc="best", ncols=1 if len(panel.lines) <= 8 else 2)
        if title:
            figure.suptitle(title, fontsize=11)
        metadata = {"Date": None} if fmt == "svg" else {"Software": "sexpgpu"}
        figure.savefig(path, format=fmt, dpi=130, metadata=metadata)


# ---------------------------------------------------------------------------------------------
# A terminal


def terminal_text(panels: Sequence[Panel], width: int, height: int, color: bool, log_y: bool = False) -> str:
    """PANELS one above the other, each WIDTH x HEIGHT characters, as text (ANSI colours only
    with COLOR)."""
    try:
        import plotext
    except ImportError as exc:
        raise MissingExtra(f"plot --terminal needs plotext, the plot extra: {EXTRA} ({exc})") from exc
    blocks = []
    for panel in panels:
        # plotext draws on one module-level figure: cleared before each panel, and the
        # verb is single-threaded
        figure = plotext.figure
        figure.clear()
        figure.plot_size(width, height)
        figure.title(panel.metric)
        figure.label("step", "x")
        if log_y and _log_ok(panel):
            figure.ruler("y").scale("log")
        for i, line in enumerate(panel.lines):
            points = [(s, v) for s, v in zip(line.steps, line.values) if v is not None]
            if not points:
                continue
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            # colours tell the lines apart on a terminal that has them; a letter each, where not
            marker = None if color else TEXT_MARKERS[i % len(TEXT_MARKERS)]
            signal = figure.signal(xs, ys, marker=marker).label(line.label)
            if len(points) > 1:
                signal.lines()
            figure.draw(signal)
        blocks.append(figure.build().string(colorless=not color))
    return "\n".join(blocks)
