"""The thread plan's inputs against what it should choose: on every workload of
bench/cpu_workloads.py and every example that trains, the compiled CPU device's steps/s at 1
and 2 threads (alternating, several rounds, the median kept) and with the threads the plan
chooses, beside the features the plan looks at (runtime/threads.py: the step's multiply-adds in
products, the largest product, whether this
BLAS gives pieces the whole product's bits).

Run it twice, as a user may have either environment (this machine's pins OpenBLAS's Haswell
kernels, under which the pieces are off):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/cpu_threads.py [--only NAME] [--repeats 3] [--steps 200]
    python bench/cpu_threads.py

Two threads are only worth measuring on a quiet machine (`uptime` under about 1 per core).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from cpu_workloads import REPO, OurSide, Rate, Workload, alternate, blas_warning, limited, timed, workloads

EXAMPLES = ("quickstart.lisp", "char-transformer.lisp", "charlm.lisp", "cnn.lisp", "sweep.lisp", "search.lisp")


def every_workload(tmp: Path, steps: int) -> list[Workload]:
    """cpu_workloads' workloads and the examples that train that are not among them."""
    listed = workloads(tmp, steps)
    taken = {w.path.name for w in listed}
    few = max(10, steps // 10)
    return listed + [Workload(f"example {name}", REPO / "examples" / name, "", few) for name in EXAMPLES if name not in taken]


def measure(workload: Workload, repeats: int) -> dict[str, Any]:
    from threadpoolctl import threadpool_info

    from sexpgpu.runtime.threads import blas_threads, pieces_in_use, plan_threads, step_features

    side = OurSide(workload, "cpu")
    programs = list(side.experiment.module.programs.values())

    def fixed(count: int) -> Rate:
        side.threads(count)
        with limited(count):
            return timed(side.step, workload.steps)

    chose: list[int] = []

    def default(_count: int) -> Rate:
        plan = plan_threads(programs, pieces=pieces_in_use(side.backend))
        chose.append(plan.blas)
        with blas_threads(plan, side.backend):
            return timed(side.step, workload.steps)

    median = alternate({"fixed": fixed, "default": default}, [1, 2], repeats)
    one, two = median[("fixed", 1)].wall, median[("fixed", 2)].wall
    chosen_rate = statistics.median(median[("default", t)].wall for t in (1, 2))
    features = step_features(programs)
    return {"workload": workload.name, "architecture": threadpool_info()[0].get("architecture"),
            "pieces": pieces_in_use(side.backend), **features.model_dump(),
            "steps_per_s_1t": one, "steps_per_s_2t": two, "two_over_one": two / one,
            "default_threads": sorted(set(chose)), "default_over_best": chosen_rate / max(one, two),
            "cpu_steps_per_s_1t": median[("fixed", 1)].cpu, "cpu_steps_per_s_2t": median[("fixed", 2)].cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps of the quickstart per sample (the others: a tenth, at least 10)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="run the workloads whose name contains this")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warning = blas_warning()
    if warning:
        print(warning)
    print(f"load average {os.getloadavg()[0]:.2f} at the start")
    with tempfile.TemporaryDirectory(prefix="sexpgpu-threads-") as tmp:
        rows = [measure(w, args.repeats) for w in every_workload(Path(tmp), args.steps) if args.only in w.name]
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'workload':<48} {'kernels':>9} {'pieces':>6} {'product MACs':>13} {'largest':>13} "
          f"{'1t':>8} {'2t':>8} {'2t/1t':>6} {'chose':>5} {'def/best':>8}")
    for r in rows:
        print(f"{r['workload']:<48} {r['architecture']:>9} {str(r['pieces']):>6} {r['product_macs']:>13,} "
              f"{r['largest_product']:>13,} {r['steps_per_s_1t']:>8.1f} {r['steps_per_s_2t']:>8.1f} {r['two_over_one']:>6.2f} "
              f"{','.join(map(str, r['default_threads'])):>5} {r['default_over_best']:>8.2f}")


if __name__ == "__main__":
    main()
