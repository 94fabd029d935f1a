"""Where a training step's time goes on `--device cpu`, and the step against PyTorch eager,
in CPU time (time.process_time) at one thread: fair on a shared machine, where wall time
measures the other jobs.

Each op of the program's tape (a generated kernel or a gemm) is run alone, over the buffers
the last step left, the fastest of five runs kept; the ops are summed by kernel (the name
without its hash, and its items) or gemm shape (cuBLAS's m x n x k and batch). The whole
step is timed as a run trains it (the Trainer on replayed batches), our side and torch's in
turn, ROUNDS rounds of STEPS steps each, the best and the median of the rounds printed.

    python bench/tape_profile.py [--only "28x28"] [--rounds 4] [--steps 4] [--threads 1] [--no-torch]

With `--threads N` (N > 1) both sides get N threads, and each op is also timed by the wall
clock (the fastest of five): an op whose wall time does not fall below its CPU time at one
thread does not use the threads. Wall times mean something only on a quiet machine.

For OpenBLAS's AVX-512 kernels on this machine unset its Haswell override in the command:
`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/tape_profile.py`.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from cpu_workloads import OurSide, Workload, workloads


def programs_of(side: OurSide) -> list[Any]:
    """The CpuPrograms the side's trainer runs (each once)."""
    from sexpgpu.runtime.cpu.device import CpuProgram

    out: dict[int, Any] = {}
    for value in vars(side.trainer).values():
        for item in (value.values() if isinstance(value, dict) else [value]):
            if isinstance(item, CpuProgram):
                out[id(item)] = item
    return list(out.values())


def op_times(program: Any, clock: Callable[[], float] = time.process_time) -> collections.Counter[str]:
    """Seconds (by CLOCK) of each op of PROGRAM's later tape, run alone, summed by kernel or gemm."""
    from sexpgpu.runtime.cpu.device import Tape

    names = {int(ctypes.cast(fn, ctypes.c_void_p).value or 0): name.rsplit("_", 1)[0] for name, (fn, _) in program.cpu_runner.functions.items()}
    totals: collections.Counter[str] = collections.Counter()

    def label(op: Any) -> str:
        return f"gemm {op.m}x{op.n}x{op.k} batch {op.batch}" if op.kind == 1 else f"{names.get(op.fn, '?')} ({op.size} items)"

    for part in program.later_tape:
        if not isinstance(part, Tape):
            continue
        index = 0
        while index < len(part.ops):
            op = part.ops[index]
            span = 1 + (op.batch if op.kind == 2 else 0)  # a repeat and its body
            alone = Tape(program.runtime)
            alone.ops, alone.refs, alone.most_args = part.ops[index : index + span], part.refs, part.most_args
            alone.workspace_floats, alone.private_bytes = part.workspace_floats, part.private_bytes
            alone.run(program.base_array)
            best = float("inf")
            for _ in range(5):
                began = clock()
                alone.run(program.base_array)
                best = min(best, clock() - began)
            body = " + ".join(label(o) for o in part.ops[index + 1 : index + span])
            totals[f"{op.size} x [{body}]" if op.kind == 2 else label(op)] += best
            index += span
    return totals


def step_seconds(step: Callable[[], object], steps: int) -> tuple[float, float]:
    """CPU seconds (every thread's) and wall seconds of one step, the mean of STEPS."""
    step()
    began, wall = time.process_time(), time.perf_counter()
    for _ in range(steps):
        step()
    return (time.process_time() - began) / steps, (time.perf_counter() - wall) / steps


def profile(workload: Workload, rounds: int, steps: int, torch_side: bool, threads: int = 1) -> None:
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    from cpu_vs_torch import TorchSide

    torch.set_num_threads(threads)
    with threadpool_limits(threads, user_api="blas"):
        ours = OurSide(workload, "cpu")
        ours.threads(threads)
        sides: dict[str, Callable[[], object]] = {"cpu": ours.step}
        if torch_side:
            sides["torch"] = TorchSide(workload, ours).step
        samples: dict[str, list[float]] = {name: [] for name in sides}
        walls_of: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(rounds):
            for name, step in sides.items():
                cpu, wall = step_seconds(step, steps)
                samples[name].append(cpu)
                walls_of[name].append(wall)
        blas = [i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"]
        print(f"{workload.name}: {threads} thread(s), the device's BLAS {ours.backend.runtime.blas.name}, NumPy's OpenBLAS kernels {blas}, load average {os.getloadavg()[0]:.1f} at the end")
        for name, seconds in samples.items():
            print(f"  {name:5s} step {1e3 * min(seconds):7.1f} ms best, {1e3 * statistics.median(seconds):7.1f} ms median (CPU time); "
                  f"{1e3 * min(walls_of[name]):7.1f} ms best, {1e3 * statistics.median(walls_of[name]):7.1f} ms median (wall)")
        if torch_side:
            print(f"  cpu / torch: {min(samples['torch']) / min(samples['cpu']):.2f} best, {statistics.median(samples['torch']) / statistics.median(samples['cpu']):.2f} median"
                  f" (CPU time); {min(walls_of['torch']) / min(walls_of['cpu']):.2f} best, {statistics.median(walls_of['torch']) / statistics.median(walls_of['cpu']):.2f} median (wall)")
        totals: collections.Counter[str] = collections.Counter()
        walls: collections.Counter[str] = collections.Counter()
        for program in programs_of(ours):
            totals.update(op_times(program))
            if threads > 1:
                walls.update(op_times(program, time.perf_counter))
        whole = sum(totals.values())
        print(f"  the tape's ops alone: {1e3 * whole:.1f} ms CPU" + (f", {1e3 * sum(walls.values()):.1f} ms wall" if threads > 1 else ""))
        for label, seconds in totals.most_common(20):
            wall = f" {1e3 * walls[label]:8.2f} ms wall" if threads > 1 else ""
            print(f"  {1e3 * seconds:8.2f} ms {100 * seconds / whole:5.1f}%{wall}  {label}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="28x28", help="the workloads whose name holds this")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="threads on each side (the ops then timed by the wall clock too)")
    parser.add_argument("--no-torch", action="store_true", help="profile our side alone")
    args = parser.parse_args()
    for workload in workloads(Path(tempfile.mkdtemp()), 200):
        if args.only in workload.name:
            profile(workload, args.rounds, args.steps, not args.no_torch, args.threads)


if __name__ == "__main__":
    main()
