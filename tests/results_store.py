"""A store made by real runs, for the tests of `runs`, `ui` and `plot`: a tiny MLP file with
an eval pass, two knobs and a 4-point grid sweep, trained through the real CLI (`run`, then
`sweep`), in this process.

    runs = make_store(tmp_path / "runs")   # 1 base run, 1 run with --set, 4 sweep points
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sexpgpu.cli.main import main
from sexpgpu.runtime.runfolder import RunFolder
from sexpgpu.runtime.store import Store

TINY = """\
;;;; tiny.lisp -- a small MLP on spirals with an eval pass, two knobs and a grid sweep.

(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defknob lr 0.1)
(defknob width 16)
(defknob steps 40)

(defsweep grid :lr (0.05 0.2) :width (8 16))

(defloader train
  :source (synthetic :spirals :n 600 :classes 3 :seed 0)
  :prepare ((split :train 0.8 :seed 0))
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 32)

(defloader val
  :source (synthetic :spirals :n 600 :classes 3 :seed 0)
  :prepare ((split :train 0.8 :seed 0))
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 60)

(defpart net (nn:mlp 2 width 3))

(defobjective (batch)
  (let ((logits (net (field batch x))))
    (metric acc (nn:accuracy logits (field batch y)))
    (nn:cross-entropy logits (field batch y))))

(defevaluate (batch)
  (let ((logits (net (field batch x))))
    (metric loss (nn:cross-entropy logits (field batch y)))
    (metric acc (nn:accuracy logits (field batch y)))))

(defeval val :every 20)

(defgroups (all "**" (optim:sgd :lr lr)))

(defrun :steps steps :seed 0 :log-every 5)
"""

SWEEP_POINTS = 4
STEPS = 40  # each run's steps: 8 step events (every 5), 2 eval passes (20 and 40)


@dataclass(frozen=True)
class MadeStore:
    root: Path
    file: Path
    slugs: list[str]  # every run, the base run first, then the --set run, then the points
    points: list[str]  # the sweep's points, by point


def write_file(folder: Path, name: str = "tiny.lisp", text: str = TINY) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def quietly(*args: str) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(list(args))


def make_store(root: Path, file: Path | None = None) -> MadeStore:
    """Train the base run, one with lr=0.3, and the grid sweep into ROOT."""
    path = file or write_file(root.parent / "project")
    assert quietly("run", str(path), "--store", str(root), "--quiet") == 0
    assert quietly("run", "--set", "lr=0.3", str(path), "--store", str(root), "--quiet") == 0
    assert quietly("sweep", str(path), "--sweep", "grid", "--store", str(root)) == 0
    folders = sorted(p.name for p in root.iterdir() if p.is_dir())
    points = sorted((f for f in folders if ".grid-" in f), key=lambda f: int(f.split(".grid-")[1].split(".")[0]))
    others = [f for f in folders if f not in points]
    assert len(points) == SWEEP_POINTS and len(others) == 2, folders
    base = [f for f in others if RunFolder(Store.open(str(root)), f).read_run_info().selection.set == {}]
    return MadeStore(root=root, file=path, slugs=base + [f for f in others if f not in base] + points, points=points)


def events_of(store: Store, slug: str) -> list[dict[str, Any]]:
    return RunFolder(store, slug).read_events()


def counts(store: Store, slug: str) -> dict[str, int]:
    """How many points the run's train loss and each eval pass's loss have, from its events."""
    events = events_of(store, slug)
    found = {"loss": sum(1 for e in events if e["kind"] == "step" and "loss" in e)}
    for event in events:
        if event["kind"] == "eval":
            key = f"{event['name']}/loss"
            found[key] = found.get(key, 0) + 1
    return found


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ROOT, by relative path, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
