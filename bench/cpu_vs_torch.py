"""Training steps/s on the CPU: SexpGPU's compiled CPU device (`cpu`, the default) and its
NumPy backend (`numpy`) against PyTorch eager, in one process: the same model, initial
parameters, batches (16, taken before the timing: no side loads data while timed) and
optimizer, at 1 and 2 threads (or --threads). The sides alternate, several rounds (the median
kept), so a busy machine slows all of them alike. Prints the machine (CPU model, SIMD flags,
the OpenBLAS kernels NumPy's BLAS ran, which our device calls too, and torch's BLAS and CPU
capability) and its cores' f32 FMA peak (bench/cpu_peak.py), then per workload steps/s,
cpu / torch and numpy / torch (> 1: SexpGPU is faster) by wall time and by CPU time, each
side's GFLOP/s per CPU-second and its share of one core's peak, the first steps' loss gap,
our build time (lowering and kernels), the C compiler's time in the build and the first steps
(0 when the kernel cache was warm; with --cold also from an empty scratch cache) and the peak
memory of a child process that trains only that side (VmHWM). It also times the cpu device
with the threads the runtime chooses itself (no --threads, no variable: what a user gets),
sampled afresh before each timing as a run samples at its start, and prints that against the
best of the fixed thread counts (issue 14's goal: within 5%).

This machine's environment pins OpenBLAS's kernels (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE); to
benchmark the ones OpenBLAS picks for the CPU, unset both for this command alone (the
peak-memory children inherit it):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/cpu_vs_torch.py [--steps 200] [--repeats 3] [--threads 1,2] [--issue] [--cold] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from sexpgpu.runtime.threads import blas_threads, pieces_in_use, plan_threads

from cpu_peak import describe, f32_peak, machine, peak, peak_lines
from cpu_workloads import (CHECKED_STEPS, OurSide, Rate, Workload, alternate, blas_warning, chosen, cold_compile_s, gflops, limited, loss_gap,
                           peak_rss_mib, timed, workloads)


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

    def ours(side: OurSide) -> Callable[[int], Rate]:
        def run(count: int) -> Rate:
            side.threads(count)
            with limited(count):
                return timed(side.step, workload.steps)
        return run

    def theirs(count: int) -> Rate:
        torch.set_num_threads(count)
        return timed(peer.step, workload.steps)

    chosen: list[str] = []

    def default(_count: int) -> Rate:
        plan = plan_threads(cpu.experiment.module.programs.values(), pieces=pieces_in_use(cpu.backend))
        chosen.append(f"{plan.blas}")
        with blas_threads(plan, cpu.backend):
            return timed(cpu.step, workload.steps)

    median = alternate({"cpu": ours(cpu), "numpy": ours(numpy_side), "torch": theirs, "default": default}, threads, repeats)
    best = max(median[("cpu", t)].wall for t in threads)
    default_rate = statistics.median(median[("default", t)].wall for t in threads)
    return {
        "workload": workload.name, "steps": workload.steps, "threads": threads, "step_gflop": cpu.flops / 1e9,
        "steps_per_s": {f"{side} {t}": median[(side, t)].wall for side, t in median},
        "steps_per_cpu_s": {f"{side} {t}": median[(side, t)].cpu for side, t in median},
        "gflops": {f"{side} {t}": gflops(cpu.flops, median[(side, t)].wall) for side, t in median},
        "gflops_per_cpu_s": {f"{side} {t}": gflops(cpu.flops, median[(side, t)].cpu) for side, t in median},
        "cpu_vs_torch": {t: median[("cpu", t)].wall / median[("torch", t)].wall for t in threads},
        "numpy_vs_torch": {t: median[("numpy", t)].wall / median[("torch", t)].wall for t in threads},
        "cpu_vs_torch_cpu_time": {t: median[("cpu", t)].cpu / median[("torch", t)].cpu for t in threads},
        "numpy_vs_torch_cpu_time": {t: median[("numpy", t)].cpu / median[("torch", t)].cpu for t in threads},
        "loss_gap": {"cpu": loss_gap(cpu.first_losses, peer.first_losses), "numpy": loss_gap(numpy_side.first_losses, peer.first_losses)},
        "cpu_build_s": cpu.build_s, "cpu_compile_s": cpu.compile_s, "cpu_cache_warm": cpu.cache_warm, "cpu_setup_s": cpu.setup_s,
        "default_vs_best": default_rate / best,
        "default_threads": sorted(set(chosen)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps of the quickstart per sample (the others: a tenth, at least 10)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--only", default="", help="run the workloads whose name contains this")
    parser.add_argument("--issue", action="store_true", help="only issue 25's four realistic workloads")
    parser.add_argument("--cold", action="store_true", help="also compile each workload's kernels into an empty kernel cache and report the time")
    parser.add_argument("--peak", type=float, default=0.0, help="one core's f32 peak in GFLOP/s (default: measure it, bench/cpu_peak.py)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory child processes")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    peaks = [] if args.peak else peak(tuple(sorted({1, *threads})))
    per_core = args.peak or f32_peak(peaks)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workload in workloads(Path(tmp), args.steps):
            if not chosen(workload, args.only, args.issue):
                continue
            row = side_by_side(workload, threads, args.repeats)
            if args.cold:
                row["cpu_cold_compile_s"] = cold_compile_s(workload)
            if not args.no_memory:
                row["peak_mib"] = {"cpu": peak_rss_mib("cpu_workloads", "train_ours", workload, "cpu"),
                                   "torch": peak_rss_mib("cpu_vs_torch", "train_torch", workload)}
            rows.append(row)
            ratios = ", ".join(f"{t}t cpu/torch {row['cpu_vs_torch'][t]:.2f} (by CPU s {row['cpu_vs_torch_cpu_time'][t]:.2f})" for t in threads)
            cold = f", cold compile {row['cpu_cold_compile_s']:.1f} s" if args.cold else ""
            print(f"done: {workload.name}: {ratios}{cold}", file=sys.stderr, flush=True)
    import torch

    described = machine(torch)  # after the sides ran: every BLAS they loaded, with the kernels it chose
    if args.json:
        print(json.dumps({"machine": described, "peaks": [asdict(p) for p in peaks], "f32_peak_per_core": per_core,
                          "load_average": os.getloadavg(), "rows": rows}, indent=2))
        return
    print("\n".join(describe(described) + peak_lines(peaks)))
    warning = blas_warning()
    if warning:
        print(warning)
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} (1, 5, 15 min) at the end")
    print_table(rows, threads, per_core)


def print_table(rows: list[dict[str, Any]], threads: list[int], per_core: float) -> None:
    import torch

    print(f"torch {torch.__version__}; steps/s (wall), the median of the rounds; cpu/torch and numpy/torch > 1: SexpGPU is faster; "
          f"'by CPU s': the same ratio of steps per CPU-second; GF/s: the step's FLOPs x steps per CPU-second (a core's rate while it ran "
          f"this side; the wall rate is in --json); % peak: that over one core's f32 peak ({per_core:.0f} GFLOP/s)")
    head = " ".join(f"{'cpu ' + str(t) + 't':>8} {'torch':>7} {'cpu/t':>6} {'np/t':>5} {'by CPU s':>8} {'cpu GF/s':>8} {'%peak':>5} "
                    f"{'torch GF/s':>10} {'%peak':>5}" for t in threads)
    print(f"{'workload':<48} {'GFLOP':>6} {head} {'loss gap':>9} {'build s':>7} {'compile s':>9} {'cold compile s':>14} {'cpu MiB':>8} {'torch MiB':>9} "
          f"{'default/best':>12} {'chose':>5}")
    for r in rows:
        s, c = r["steps_per_s"], r["gflops_per_cpu_s"]
        cells = " ".join(f"{s[f'cpu {t}']:>8.1f} {s[f'torch {t}']:>7.1f} {r['cpu_vs_torch'][t]:>6.2f} {r['numpy_vs_torch'][t]:>5.2f} "
                         f"{r['cpu_vs_torch_cpu_time'][t]:>8.2f} {c[f'cpu {t}']:>8.1f} {100 * c[f'cpu {t}'] / per_core:>5.0f} "
                         f"{c[f'torch {t}']:>10.1f} {100 * c[f'torch {t}'] / per_core:>5.0f}" for t in threads)
        peak_mib = r.get("peak_mib", {})
        print(f"{r['workload']:<48} {r['step_gflop']:>6.2f} {cells} {r['loss_gap']['cpu']:>9.1e} {r['cpu_build_s']:>7.1f} {r['cpu_compile_s']:>9.1f} {r.get('cpu_cold_compile_s', float('nan')):>14.1f} "
              f"{peak_mib.get('cpu', float('nan')):>8.0f} {peak_mib.get('torch', float('nan')):>9.0f} {r['default_vs_best']:>12.2f} "
              f"{','.join(r['default_threads']):>5}")


if __name__ == "__main__":
    main()
