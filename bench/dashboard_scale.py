"""The dashboard and `plot` at scale, against stores written directly in the formats real
runs write (tests/scale_store.py, from a real run's files):

- a run of --steps logged steps (default 1,000,000) opened in a real `sexpgpu ui`: the
  seconds of the first /api/run/SLUG/curves (every event read and parsed), of the next one
  (read from where it stopped: nothing new), and the server's peak resident memory (VmHWM);
- `sexpgpu plot` of that run: seconds and peak memory of the process;
- a sweep of --runs points (default 5,000): the seconds of its first /api/sweep/NAME (every
  run.json and status.json read) and of the next (only each file's time looked at).

    python bench/dashboard_scale.py [--steps 1000000] [--runs 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from results_store import TINY, write_file  # noqa: E402
from scale_store import write_long_run, write_sweep  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], capture_output=True, text=True, env=ENV, check=True)


def timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=3600) as response:
        return json.loads(response.read())


def peak_mb(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def serve(store: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, "-m", "sexpgpu", "ui", str(store)], stdout=subprocess.PIPE, text=True, env=ENV)
    assert process.stdout is not None
    found = re.search(r"(http://127\.0\.0\.1:\d+/)", process.stdout.readline())
    assert found, "sexpgpu ui did not say where it listens"
    return process, found.group(1)


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dashboard-scale-"))
    try:
        cli("run", str(write_file(base / "project", text=TINY)), "--store", str(base / "real"), "--quiet")
        (template,) = [p for p in (base / "real").iterdir() if p.is_dir()]
        rows: list[tuple[str, str]] = []

        written = timed(lambda: write_long_run(base / "long", template, args.steps))
        slug = next(p.name for p in (base / "long").iterdir())
        process, url = serve(base / "long")
        try:
            first = timed(lambda: get(f"{url}api/run/{slug}/curves"))
            again = timed(lambda: get(f"{url}api/run/{slug}/curves"))
            rows += [(f"open a {args.steps:,}-step run (first read)", f"{first:.2f} s"), ("open it again (nothing new)", f"{again:.2f} s"),
                     ("server peak memory", f"{peak_mb(process.pid):.0f} MiB")]
        finally:
            stop(process)
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        plotted = timed(lambda: cli("plot", str(base / "long" / slug), "-o", str(base / "long.png")))
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        rows += [(f"plot the {args.steps:,}-step run", f"{plotted:.2f} s"),
                 ("plot peak memory", f"{after / 1024:.0f} MiB" if after > before else "below an earlier child's")]

        write_sweep(base / "wide", template, args.runs)
        process, url = serve(base / "wide")
        try:
            first = timed(lambda: get(f"{url}api/sweep/grid"))
            again = timed(lambda: get(f"{url}api/sweep/grid"))
            rows += [(f"sweep page of {args.runs:,} runs (first)", f"{first:.2f} s"), ("sweep page again (files unchanged)", f"{again:.2f} s"),
                     ("server peak memory", f"{peak_mb(process.pid):.0f} MiB")]
        finally:
            stop(process)
        width = max(len(name) for name, _ in rows)
        print(f"(the {args.steps:,}-step events.jsonl was written in {written:.1f} s)")
        print(f"| {'measure'.ljust(width)} | value |")
        print(f"| {'-' * width} | --- |")
        for name, value in rows:
            print(f"| {name.ljust(width)} | {value} |")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
