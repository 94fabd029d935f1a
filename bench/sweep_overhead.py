"""What the Ray driver costs: 16 points of a tiny run on a local Ray cluster against the same
sweep run locally, and how long a killed worker takes to be training again.

Prints, in one process run:
- local sweep: wall time, and the points' own training time (status.json wall_time_s)
- Ray sweep: wall time, and the driver's overhead per point: (wall x slots - own time) / points,
  where slots is the number of points the cluster runs at once (goal: < 1 s)
- kill to resumed: a point's worker is SIGKILLed; the seconds from the kill to its `resume`
  event and to its first `step` event after the resume

    python bench/sweep_overhead.py [--points 16] [--steps 60] [--cpus 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def run_file(points: int, steps: int) -> str:
    lrs = " ".join(f"{0.02 + 0.01 * i:g}" for i in range(points))
    text = (REPO / "examples" / "quickstart.lisp").read_text()
    text = text.replace("(defknob lr 0.1)", f"(defknob lr 0.1)\n(defsweep lrs :lr ({lrs}))")
    return text.replace("(defrun :steps 300 :seed 0)", f"(defrun :steps {steps} :seed 0 :log-every 10 :checkpoint (:every 10 :keep 2))")


def own_time(store: Path, slug: str) -> float:
    status = json.loads((store / slug / "status.json").read_text())
    return float(status["summary"]["wall_time_s"])


def compiled_points(path: Path, points: int) -> list[Any]:
    """Every point compiled once, as `sexpgpu sweep` does before anything runs."""
    from orchestration.driver import sweep_points
    from sexpgpu.session import Session, Settings

    compiled, refusal = Session(Settings()).compile_sweep(path, "lrs", points)
    assert refusal is None, refusal
    return sweep_points(compiled, [{"lr": 0.02 + 0.01 * i} for i in range(points)])


def local_sweep(path: Path, points: int, store: Path) -> tuple[float, float]:
    """The local sweep's path: one session, every point compiled first, then trained."""
    from sexpgpu.session import Session, Settings

    started = time.time()
    session = Session(Settings(store=str(store), signals=False))
    own = 0.0
    for point in compiled_points(path, points):
        outcome = session.train(point.compiled)
        assert outcome.exit_code == 0 and outcome.slug is not None, outcome
        own += own_time(store, outcome.slug)
    return time.time() - started, own


def ray_sweep(path: Path, points: int, store: Path, on_launch: Any = None) -> tuple[float, float, Any]:
    """`sweep --ray`'s path, its compile included (as in the local sweep's time)."""
    from orchestration.driver import Driver

    started = time.time()
    ledger = Driver(path, "lrs", str(store), None, None, None, say=lambda _: None, on_launch=on_launch).run(compiled_points(path, points))
    wall = time.time() - started
    assert all(p.state == "finished" for p in ledger.points), [(p.point, p.state, p.reason) for p in ledger.points]
    return wall, sum(own_time(store, p.slug) for p in ledger.points), ledger


def stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["t"].replace("Z", "+00:00")).timestamp()


def kill_to_resumed(path: Path, store: Path) -> tuple[float, float]:
    """SIGKILL a point's worker after its first checkpoint; seconds to its resume event and
    to its first step event after that."""
    import ray

    killed: dict[str, float] = {}

    def kill_once(record: Any, gang: Any) -> None:
        if record.attempts != 1:
            return

        def kill() -> None:
            pid = ray.get(gang.workers[0].where.remote())["pid"]
            folder = store / record.slug
            while not (folder / "checkpoints" / "LATEST").exists():
                time.sleep(0.05)
            killed["at"] = time.time()
            os.kill(pid, signal.SIGKILL)

        threading.Thread(target=kill, daemon=True).start()

    _, _, ledger = ray_sweep(path, 1, store, on_launch=kill_once)
    slug = ledger.points[0].slug
    events = [json.loads(line) for line in (store / slug / "events.jsonl").read_text().splitlines()]
    resume = next(e for e in events if e["kind"] == "resume")
    first_step = next(e for e in events if e["kind"] == "step" and stamp(e) >= stamp(resume))
    return stamp(resume) - killed["at"], stamp(first_step) - killed["at"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=16)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    import ray

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / ".git").mkdir()
        path = root / "tiny.lisp"
        path.write_text(run_file(args.points, args.steps))
        local_wall, local_own = local_sweep(path, args.points, root / "local")
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        try:
            slots = min(args.cpus, args.points)
            ray_wall, ray_own, _ = ray_sweep(path, args.points, root / "ray")
            long_path = root / "long.lisp"
            long_path.write_text(run_file(1, 2000).replace(":checkpoint (:every 10 :keep 2)", ":checkpoint (:every 200 :keep 2)"))
            to_resume, to_step = kill_to_resumed(long_path, root / "kill")
        finally:
            ray.shutdown()
    overhead = (ray_wall * slots - ray_own) / args.points
    print(f"sweep of {args.points} points x {args.steps} steps (quickstart MLP), {args.cpus} CPUs")
    print(f"{'':<28}{'wall s':>10}{'own s':>10}{'per point s':>14}")
    print(f"{'local, in order':<28}{local_wall:>10.2f}{local_own:>10.2f}{(local_wall - local_own) / args.points:>14.3f}")
    print(f"{'ray, ' + str(slots) + ' at once':<28}{ray_wall:>10.2f}{ray_own:>10.2f}{overhead:>14.3f}")
    print(f"driver overhead per point: {overhead:.2f} s (goal < 1 s); ray wall / local wall: {ray_wall / local_wall:.2f}")
    print(f"kill -> resume event: {to_resume:.2f} s; kill -> first step after resume: {to_step:.2f} s")


if __name__ == "__main__":
    main()
