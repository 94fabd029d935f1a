"""Training steps/s on the CPU: SexpGPU's NumPy backend against PyTorch eager, same model,
same batches, same optimizer, same threads, in one process. For each workload it times our
side at the threads the runtime chooses by itself (no variable set: what a user gets) and at
every thread count from 1 to the cores, and torch at the same counts; sides and settings
alternate, several repeats each, the median kept. Prints the default against the best
setting (goal: within 5%), ours / torch at each thread count (> 1: SexpGPU is faster), and
the peak memory of each side (VmHWM of a child process that trains only that side).

    python bench/cpu_vs_torch.py [--steps N] [--repeats R]
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
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WIDE = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defloader train
  :source (synthetic :blobs :n 4096 :classes 10 :dim 784 :seed 0)
  :fields ((x :f32 (784)) (y :i32 ()))
  :batch 256
  :shuffle t)

(defpart net (nn:mlp 784 1024 10 :depth 2))

(defobjective (batch)
  (nn:cross-entropy (net (field batch x)) (field batch y)))

(defgroups (all "**" (optim:sgd :lr 0.01)))

(defrun :steps 100000 :seed 0)
"""


def workloads(tmp: Path) -> dict[str, tuple[Path, str]]:
    """Name -> (run file, torch builder in tests/torch_reference.py)."""
    wide = tmp / "wide_mlp.lisp"
    wide.write_text(WIDE)
    examples = REPO / "examples"
    return {
        "quickstart MLP (2-64-3, batch 64)": (examples / "quickstart.lisp", "mlp"),
        "wide MLP (784-1024-1024-10, batch 256)": (wide, "mlp"),
        "char transformer (2x64, ctx 32, batch 16)": (examples / "char-transformer.lisp", "char_transformer"),
        "CNN on digits (2 conv, batch 64)": (examples / "cnn.lisp", "cnn"),
    }


def trainer_for(path: Path):  # type: ignore[no-untyped-def]
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.trainer import Trainer

    result = compile_file(path)
    assert result.experiment is not None, [d.headline() for d in result.diagnostics]
    return result.experiment, Trainer(result.experiment)


def ours(path: Path, steps: int, model: str = "") -> float:
    _, trainer = trainer_for(path)
    return timed(trainer.train_step, steps)


def timed(step: Callable[[], object], steps: int) -> float:
    """Steps per second of STEP, after five warm-up steps."""
    for _ in range(5):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps / (time.perf_counter() - start)


def torch_side(path: Path, steps: int, model: str = "mlp") -> float:
    import numpy as np
    import torch

    sys.path.insert(0, str(REPO / "tests"))
    import torch_reference as ref

    experiment, trainer = trainer_for(path)  # the same initial parameters and batches
    P = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in trainer.params.items()}
    forward = ref.mlp(P) if model == "mlp" else ref.cnn(P) if model == "cnn" else ref.char_transformer(P, experiment.knob_values())
    group = experiment.groups[0].optimizer
    knobs = experiment.knob_values()
    lr = float(knobs.get("lr", 0.01 if "wide" in path.name else 0.1))
    opt = {
        "sgd": lambda: torch.optim.SGD(list(P.values()), lr=lr),
        "momentum": lambda: torch.optim.SGD(list(P.values()), lr=lr, momentum=0.9),
        "adamw": lambda: torch.optim.AdamW(list(P.values()), lr=lr, weight_decay=0.0),
    }[group or "sgd"]()
    fields = [f.name for f in experiment.loaders["train"].fields]
    batches = []
    for _ in range(16):
        b = trainer.stream.next()
        x = b[fields[0]]
        batches.append((torch.tensor(x.astype(np.int64) if x.dtype.kind == "i" else x), torch.tensor(b[fields[1]].astype(np.int64))))

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        loss = ref.sequence_loss(forward(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()

    counter = iter(range(1 << 62))
    return timed(lambda: step(next(counter)), steps)


def peak_rss_mib(side: str, path: Path, steps: int, model: str) -> float:
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); sys.argv=['x'];"
        f"from bench.cpu_vs_torch import {side}; from pathlib import Path;"
        f"{side}(Path({str(path)!r}), {steps}, {model!r});"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=os.environ.copy())
    if out.returncode != 0:
        return float("nan")
    return int(out.stdout.strip().splitlines()[-1]) / 1024


def side_by_side(path: Path, model: str, steps: int, repeats: int, cores: int) -> dict[str, object]:
    """One workload: ours at the default plan and at 1..CORES threads, torch at 1..CORES,
    interleaved, REPEATS times; the median of each."""
    import statistics

    import torch
    from threadpoolctl import threadpool_limits

    from sexpgpu.runtime.threads import blas_threads, plan_threads

    experiment, trainer = trainer_for(path)
    default = plan_threads(experiment.module.programs.values(), environ={})
    samples: dict[str, list[float]] = {}
    for _ in range(repeats):
        with blas_threads(default):
            samples.setdefault("default", []).append(timed(trainer.train_step, steps))
        for threads in range(1, cores + 1):
            with threadpool_limits(threads, user_api="blas"):
                samples.setdefault(f"ours {threads}", []).append(timed(trainer.train_step, steps))
            torch.set_num_threads(threads)
            samples.setdefault(f"torch {threads}", []).append(torch_side(path, steps, model))
    median = {k: statistics.median(v) for k, v in samples.items()}
    best = max(range(1, cores + 1), key=lambda t: median[f"ours {t}"])
    return {"default_threads": default.blas, "default_reason": default.reason, "median": median, "best_threads": best,
            "default_vs_best": median["default"] / median[f"ours {best}"],
            "ratios": {t: median[f"ours {t}"] / median[f"torch {t}"] for t in range(1, cores + 1)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from sexpgpu.runtime.threads import process_cores

    cores = process_cores()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, model) in workloads(Path(tmp)).items():
            steps = args.steps if "quickstart" in name else max(20, args.steps // 10)
            row = {"workload": name, **side_by_side(path, model, steps, args.repeats, cores)}
            row["ours_peak_rss_mib"] = peak_rss_mib("ours", path, steps, model)
            row["torch_peak_rss_mib"] = peak_rss_mib("torch_side", path, steps, model)
            rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    threads = " ".join(f"{'ours/torch ' + str(t) + 't':>14}" for t in range(1, cores + 1))
    print(f"{cores} cores; default = the threads the runtime chose by itself (goal: within 5% of the best); ours/torch > 1: SexpGPU is faster")
    print(f"{'workload':<42} {'default':>8} {'steps/s':>9} {'best':>5} {'vs best':>8} {threads} {'ours MiB':>9} {'torch MiB':>10}")
    for r in rows:
        median = r["median"]
        cells = " ".join(f"{r['ratios'][t]:>14.2f}" for t in range(1, cores + 1))
        print(f"{r['workload']:<42} {str(r['default_threads']) + 't':>8} {median['default']:>9.1f} {str(r['best_threads']) + 't':>5} "
              f"{r['default_vs_best']:>8.2f} {cells} {r['ours_peak_rss_mib']:>9.0f} {r['torch_peak_rss_mib']:>10.0f}")


if __name__ == "__main__":
    main()
