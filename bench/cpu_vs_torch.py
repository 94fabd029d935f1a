"""Training steps/s on the CPU: SexpGPU's compiled CPU device (`cpu`, the default) and its
NumPy backend (`numpy`) against PyTorch eager, in one process: the same model, initial
parameters, batches (16, taken before the timing: no side loads data while timed) and
optimizer, at 1 and 2 threads (or --threads). The sides alternate, several rounds (the median
kept), so a busy machine slows all of them alike. Prints steps/s, cpu / torch and numpy /
torch (> 1: SexpGPU is faster), the first steps' loss gap, our compile-and-warm-up time and
the peak memory of a child process that trains only that side (VmHWM). It also times the
cpu device with the threads the runtime chooses itself (no --threads, no variable: what a
user gets), sampled afresh before each timing as a run samples at its start, and prints
that against the best of the fixed thread counts (issue 14's goal: within 5%).

    python bench/cpu_vs_torch.py [--steps 200] [--repeats 3] [--threads 1,2] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from sexpgpu.runtime.threads import blas_threads, plan_threads

from cpu_workloads import CHECKED_STEPS, OurSide, Workload, alternate, limited, loss_gap, peak_rss_mib, timed, workloads


class TorchSide:
    """PyTorch eager on one workload: tests/torch_reference.py's model on our parameters."""

    def __init__(self, workload: Workload, ours: OurSide) -> None:
        import torch

        import torch_reference as ref

        experiment = ours.experiment
        self.P = {k: torch.tensor(v.copy(), requires_grad=True) for k, v in ours.initial().items()}
        knobs = experiment.knob_values()
        models = {"mlp": ref.mlp, "cnn": ref.cnn, "vgg": ref.vgg}
        self.forward = models[workload.model](self.P) if workload.model in models else ref.char_transformer(self.P, knobs)
        self.loss = ref.sequence_loss
        lr = float(knobs.get("lr", 0.01 if "wide" in workload.path.name else 0.1))
        params = list(self.P.values())
        self.optimizer = {
            "sgd": lambda: torch.optim.SGD(params, lr=lr),
            "momentum": lambda: torch.optim.SGD(params, lr=lr, momentum=0.9),
            "adamw": lambda: torch.optim.AdamW(params, lr=lr, weight_decay=0.0),
        }[experiment.groups[0].optimizer or "sgd"]()
        fields = [f.name for f in experiment.loaders["train"].fields]
        self.batches = [(torch.tensor(b[fields[0]].astype(np.int64) if b[fields[0]].dtype.kind == "i" else b[fields[0]]),
                         torch.tensor(b[fields[1]].astype(np.int64))) for b in ours.batches]
        self.turn = 0
        self.first_losses = [self.step() for _ in range(CHECKED_STEPS)]

    def step(self) -> float:
        x, y = self.batches[self.turn % len(self.batches)]
        self.turn += 1
        loss = self.loss(self.forward(x), y)
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())


def train_torch(workload: Workload) -> None:
    """Torch's side alone (for its peak memory). Our NumPy backend gives it the initial
    parameters and batches; its memory is in the figure, as torch's is in ours."""
    side = TorchSide(workload, OurSide(workload, "numpy"))
    timed(side.step, workload.steps)


def side_by_side(workload: Workload, threads: list[int], repeats: int) -> dict[str, Any]:
    import torch

    cpu, numpy_side = OurSide(workload, "cpu"), OurSide(workload, "numpy")
    peer = TorchSide(workload, numpy_side)

    def ours(side: OurSide) -> Callable[[int], float]:
        def run(count: int) -> float:
            side.threads(count)
            with limited(count):
                return timed(side.step, workload.steps)
        return run

    def theirs(count: int) -> float:
        torch.set_num_threads(count)
        return timed(peer.step, workload.steps)

    chosen: list[str] = []

    def default(_count: int) -> float:
        plan = plan_threads(cpu.experiment.module.programs.values())
        chosen.append(f"{plan.blas}")
        with blas_threads(plan, cpu.backend):
            return timed(cpu.step, workload.steps)

    median = alternate({"cpu": ours(cpu), "numpy": ours(numpy_side), "torch": theirs, "default": default}, threads, repeats)
    best = max(median[("cpu", t)] for t in threads)
    default_rate = statistics.median(median[("default", t)] for t in threads)
    return {
        "workload": workload.name, "steps": workload.steps, "threads": threads,
        "steps_per_s": {f"{side} {t}": median[(side, t)] for side, t in median},
        "cpu_vs_torch": {t: median[("cpu", t)] / median[("torch", t)] for t in threads},
        "numpy_vs_torch": {t: median[("numpy", t)] / median[("torch", t)] for t in threads},
        "loss_gap": {"cpu": loss_gap(cpu.first_losses, peer.first_losses), "numpy": loss_gap(numpy_side.first_losses, peer.first_losses)},
        "cpu_setup_s": cpu.setup_s,
        "default_vs_best": default_rate / best,
        "default_threads": sorted(set(chosen)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps of the quickstart per sample (the others: a tenth, at least 10)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--only", default="", help="run the workloads whose name contains this")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory child processes")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workload in workloads(Path(tmp), args.steps):
            if args.only and args.only not in workload.name:
                continue
            row = side_by_side(workload, threads, args.repeats)
            if not args.no_memory:
                row["peak_mib"] = {"cpu": peak_rss_mib("cpu_workloads", "train_ours", workload, "cpu"),
                                   "torch": peak_rss_mib("cpu_vs_torch", "train_torch", workload)}
            rows.append(row)
            print(f"done: {workload.name}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print_table(rows, threads)


def print_table(rows: list[dict[str, Any]], threads: list[int]) -> None:
    import torch

    print(f"torch {torch.__version__}; steps/s, the median of the rounds; cpu/torch and numpy/torch > 1: SexpGPU is faster")
    head = " ".join(f"{'cpu ' + str(t) + 't':>8} {'torch':>7} {'cpu/t':>6} {'np/t':>5}" for t in threads)
    print(f"{'workload':<48} {head} {'loss gap':>9} {'setup s':>8} {'cpu MiB':>8} {'torch MiB':>9} {'default/best':>12} {'chose':>5}")
    for r in rows:
        s = r["steps_per_s"]
        cells = " ".join(f"{s[f'cpu {t}']:>8.1f} {s[f'torch {t}']:>7.1f} {r['cpu_vs_torch'][t]:>6.2f} {r['numpy_vs_torch'][t]:>5.2f}" for t in threads)
        peak = r.get("peak_mib", {})
        print(f"{r['workload']:<48} {cells} {r['loss_gap']['cpu']:>9.1e} {r['cpu_setup_s']:>8.1f} {peak.get('cpu', float('nan')):>8.0f} "
              f"{peak.get('torch', float('nan')):>9.0f} {r['default_vs_best']:>12.2f} {','.join(r['default_threads']):>5}")


if __name__ == "__main__":
    main()
