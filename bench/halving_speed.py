"""What an asynchronous halving sweep saves: the same sampled sweep on this machine, run to
the end (no :halving), with ASHA (`:scheduler :asha`), and optionally with today's synchronous
halving, each `sweep --jobs J` into a store and a cache of its own.

Prints one row per sweep: its wall time, the steps its points trained, and its wall time as a
fraction of the full sweep's (the goal for ASHA: at most 0.40 at 64 points, --jobs 2).

    python bench/halving_speed.py [--points 64] [--jobs 2] [--steps 3000] [--width 256] [--sync]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]


def run_file(points: int, steps: int, width: int, halving: Optional[str]) -> str:
    """A spirals MLP sweep of POINTS sampled learning rates; HALVING: the :halving option's
    scheduler (rungs at 1/24 and 1/6 of the steps, keep 1/4), None: every point to its end."""
    rungs = f"({steps // 24} {steps // 6})"
    search = f"\n  :halving (:metric val/loss :mode :min :rungs {rungs} :keep 1/4 :scheduler :{halving})" if halving else ""
    return f"""(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defknob lr 0.1)
(defsweep search :sample {points} :seed 0 :lr (log-uniform 0.003 0.3){search})
(defloader train :source (synthetic :spirals :n 4096 :classes 3 :seed 0) :prepare ((split :train 0.8 :seed 0))
  :fields ((x :f32 (2)) (y :i32 ())) :batch 256)
(defloader val :source (synthetic :spirals :n 4096 :classes 3 :seed 0) :prepare ((split :train 0.8 :seed 0)) :part val
  :fields ((x :f32 (2)) (y :i32 ())) :batch 256)
(defpart net (nn:mlp 2 {width} 3))
(defobjective (batch) (nn:cross-entropy (net (field batch x)) (field batch y)))
(defevaluate (batch)
  (let ((logits (net (field batch x))))
    (metric loss (nn:cross-entropy logits (field batch y)))))
(defeval val :loader val :every {steps // 24})
(defgroups (all "**" (optim:sgd :lr lr)))
(defrun :steps {steps} :seed 0 :log-every 100 :checkpoint (:every {steps // 6} :keep 1))
"""


def sweep(root: Path, name: str, text: str, jobs: int) -> tuple[float, dict[str, Any]]:
    """The sweep, in a folder and with a kernel and data cache of its own: every sweep builds
    its points' kernels (each learning rate is its own update kernel), none reuses another's."""
    folder = root / name
    folder.mkdir()
    path = folder / "search.lisp"
    path.write_text(text)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "SEXPGPU_CACHE": str(root / f"cache-{name}")}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sexpgpu", "sweep", str(path), "--sweep", "search", "--store", str(folder / "runs"),
                           "--jobs", str(jobs), "--json"], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{name}: sweep exited {done.returncode}\n{done.stderr[-2000:]}")
    ledger: dict[str, Any] = json.loads(done.stdout)
    return wall, ledger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--sync", action="store_true", help="also the synchronous halving (:scheduler :sync)")
    args = parser.parse_args()
    kinds: list[Optional[str]] = [None, "asha", *(["sync"] if args.sync else [])]
    with tempfile.TemporaryDirectory(prefix="sexpgpu-halving-") as folder:
        root = Path(folder)
        rows = []
        for kind in kinds:
            wall, ledger = sweep(root, kind or "full", run_file(args.points, args.steps, args.width, kind), args.jobs)
            trained = sum(p["steps"] for p in ledger["points"])
            rows.append((kind or "full (no halving)", wall, trained, sum(p["state"] == "pruned" for p in ledger["points"])))
    full = rows[0][1]
    print(f"{args.points} points x {args.steps} steps (mlp width {args.width}), sweep --jobs {args.jobs}, {os.cpu_count()} cores")
    print(f"{'sweep':<20} {'wall s':>8} {'steps trained':>14} {'pruned':>7} {'of full':>8}")
    for kind, wall, trained, pruned in rows:
        print(f"{kind:<20} {wall:>8.1f} {trained:>14} {pruned:>7} {wall / full:>8.2f}")


if __name__ == "__main__":
    main()
