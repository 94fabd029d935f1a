"""What one Ray worker costs per attempt: one TrainWorker actor on a local Ray runs the
points of one shape group (the quickstart MLP, a grid of learning rates) one after the
other at --max-steps 1, as the sweep driver hands a finished worker its next point.

Prints, per attempt, the worker process's CPU seconds (its own and its compilers', read
from /proc: Linux only) and the wall seconds from handing it the point to its outcome, and
for the first the process start too (from creating the actor to its first answer). With
--max-steps 1 an attempt is its start: unpacking the bundle, compiling it, opening the
device, lowering the programs, the run folder and the one step.

    python bench/worker_attempts.py [--points 6] [--store s3]

--store s3 puts the bundles and the runs on moto's S3 server on loopback (tests/s3_server.py,
in this process); the default is a local folder.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """PID's CPU seconds, its waited-for children's (the C compiler) included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICKS  # utime stime cutime cstime


def run_file(points: int) -> str:
    lrs = " ".join(f"{0.01 + 0.0001 * i:.4f}" for i in range(points))
    text = (REPO / "examples" / "quickstart.lisp").read_text()
    return text.replace("(defknob lr 0.1)", f"(defknob lr 0.1)\n(defsweep grid :lr ({lrs}))")


@contextlib.contextmanager
def stores(kind: str, folder: Path) -> Iterator[str]:
    """The URL bundles and runs go under."""
    if kind == "local":
        yield str(folder)
        return
    from s3_server import MotoS3, make_bucket, s3_env

    with MotoS3() as moto:
        os.environ.update(s3_env(moto.endpoint))
        make_bucket("bench", moto.endpoint)
        yield "s3://bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=6)
    parser.add_argument("--store", choices=("local", "s3"), default="local")
    args = parser.parse_args()
    import ray

    from orchestration.attempts import worker_env
    from sexpgpu.bundle import write_bundle
    from sexpgpu.session import Compiled, Session, Settings
    from workers.train_worker import TRAIN_WORKER_OPTIONS, AttemptRequest, TrainWorker

    folder = Path(tempfile.mkdtemp(prefix="worker-attempts-"))
    (folder / "project" / ".git").mkdir(parents=True)
    path = folder / "project" / "grid.lisp"
    path.write_text(run_file(args.points))
    os.environ["SEXPGPU_CACHE"] = str(folder / "cache")  # the kernels' disk cache: this bench's own
    with stores(args.store, folder) as base:
        bundles = []
        for i, prepared in Session(Settings()).stream_sweep(path, "grid", args.points):
            assert isinstance(prepared, Compiled), prepared
            bundles.append((i, f"{base}/bundles/p{i}"))
            write_bundle(path, prepared.result, bundles[-1][1])
        bundles.sort()
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
        try:
            started = time.perf_counter()
            actor: Any = TrainWorker.options(num_cpus=1, max_restarts=0, **TRAIN_WORKER_OPTIONS).remote(worker_env())
            pid = ray.get(actor.where.remote())["pid"]
            print(f"process start: {time.perf_counter() - started:.2f} s wall, {process_cpu(pid):.2f} s CPU (load {os.getloadavg()[0]:.1f})")
            for i, bundle in bundles:
                cpu, wall = process_cpu(pid), time.perf_counter()
                outcome = ray.get(actor.run.remote(AttemptRequest(bundle=bundle, store=f"{base}/runs", max_steps=1), None))
                assert outcome.steps == 1, outcome
                print(f"point {i}: {process_cpu(pid) - cpu:.2f} s CPU, {time.perf_counter() - wall:.2f} s wall (load {os.getloadavg()[0]:.1f})")
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
