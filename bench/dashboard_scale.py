"""The dashboard and `plot` at scale, against stores written directly in the formats real
runs write (tests/scale_store.py, from a real run's files):

- a run of --steps logged steps (default 1,000,000), its series in columns as a run writes
  them (a chunk every --chunk events: runtime/serieslog.py), opened in a real `sexpgpu ui`
  that never read it: the seconds (wall, and the server's CPU) of the first
  /api/run/SLUG/curves (read from the columns; no disk cache is written for what came from
  them), of the next one (read from where it stopped: nothing new), and the server's peak
  resident memory (VmHWM);
- `sexpgpu plot` of that run, its first read too (the columns): seconds and peak memory of
  the process;
- with --lines, the same run without its columns (an older version's run: every line
  parsed, which takes minutes on a loaded machine, and the parsed series written to the
  disk cache), then in a fresh server that finds them in the disk cache, and `plot` with it;
- a sweep of --runs points (default 5,000): the seconds of its first /api/sweep/NAME (every
  run.json and status.json read) and of the next (only each file's time looked at).

    python bench/dashboard_scale.py [--steps 1000000] [--chunk 2000] [--runs 5000] [--lines]
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

ENV = {**os.environ, "PYTHONPATH": str(REPO), "SEXPGPU_CACHE": os.path.join(tempfile.mkdtemp(prefix="dashboard-scale-caches-"), "run")}


def fresh_cache() -> str:
    return tempfile.mkdtemp(prefix="dashboard-scale-cache-", dir=os.path.dirname(ENV["SEXPGPU_CACHE"]))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], capture_output=True, text=True, env=ENV, check=True)


def timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=3600) as response:
        return json.loads(response.read())


def cpu_s(pid: int) -> float:
    """The CPU seconds (user and system) the process PID has used: on a loaded machine, a
    steadier measure than the wall time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(pid: int, action: Callable[[], Any]) -> str:
    before = cpu_s(pid)
    wall = timed(action)
    return f"{wall:.2f} s ({cpu_s(pid) - before:.2f} s CPU)"


def peak_mb(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def serve(store: Path, cache: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, "-m", "sexpgpu", "ui", str(store)], stdout=subprocess.PIPE, text=True,
                               env={**ENV, "SEXPGPU_CACHE": cache})
    assert process.stdout is not None
    found = re.search(r"(http://127\.0\.0\.1:\d+/)", process.stdout.readline())
    assert found, "sexpgpu ui did not say where it listens"
    return process, found.group(1)


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)


def plot(run: Path, out: Path, cache: str) -> tuple[float, resource.struct_rusage]:
    """The seconds `sexpgpu plot RUN -o OUT` took, and its own resource use (wait4: that
    child's alone, not the servers' before it)."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "sexpgpu", "plot", str(run), "-o", str(out)], env={**ENV, "SEXPGPU_CACHE": cache},
                               stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode == 0, f"plot exited {process.returncode}"
    return time.perf_counter() - start, usage


def twice(store: Path, path: str, first: str, again: str, cache: str) -> list[tuple[str, str]]:
    """Rows: PATH asked of a fresh server of STORE (its disk cache CACHE), then again, and the
    server's peak memory."""
    process, url = serve(store, cache)
    try:
        return [(first, measured(process.pid, lambda: get(url + path))), (again, measured(process.pid, lambda: get(url + path))),
                ("server peak memory", f"{peak_mb(process.pid):.0f} MiB")]
    finally:
        stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=2000, help="events a chunk of the columns (a flush of the run's log)")
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--lines", action="store_true", help="also open the run without its columns (every line parsed)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dashboard-scale-"))
    try:
        cli("run", str(write_file(base / "project", text=TINY)), "--store", str(base / "real"), "--quiet")
        (template,) = [p for p in (base / "real").iterdir() if p.is_dir()]
        rows: list[tuple[str, str]] = []

        written = timed(lambda: write_long_run(base / "long", template, args.steps, chunk=args.chunk))
        slug = next(p.name for p in (base / "long").iterdir())
        curves = f"api/run/{slug}/curves"
        plotted, usage = plot(base / "long" / slug, base / "long.png", fresh_cache())
        rows += [(f"plot the {args.steps:,}-step run, first read (its columns)", f"{plotted:.2f} s ({usage.ru_utime + usage.ru_stime:.2f} s CPU)"),
                 ("that plot's peak memory", f"{usage.ru_maxrss / 1024:.0f} MiB")]
        rows += twice(base / "long", curves, f"open a {args.steps:,}-step run, first read (its columns)", "open it again (nothing new)",
                      fresh_cache())
        if args.lines:  # what the columns save: an older version's run, and then its disk cache
            (base / "long" / slug / "series.jsonl").unlink()
            cache = fresh_cache()
            rows += twice(base / "long", curves, "open it without its columns, first read (every line parsed)", "open it again (nothing new)",
                          cache)
            rows += twice(base / "long", curves, "open it in a fresh server (from the disk cache)", "open it again (nothing new)", cache)
            plotted, usage = plot(base / "long" / slug, base / "long.png", cache)
            rows += [(f"plot the {args.steps:,}-step run (the disk cache)", f"{plotted:.2f} s ({usage.ru_utime + usage.ru_stime:.2f} s CPU)"),
                     ("that plot's peak memory", f"{usage.ru_maxrss / 1024:.0f} MiB")]

        write_sweep(base / "wide", template, args.runs)
        rows += twice(base / "wide", "api/sweep/grid", f"sweep page of {args.runs:,} runs (first)", "sweep page again (files unchanged)",
                      fresh_cache())
        width = max(len(name) for name, _ in rows)
        print(f"(the {args.steps:,}-step run's events and columns were written in {written:.1f} s, a chunk every {args.chunk:,} events; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
        print(f"| {'measure'.ljust(width)} | value |")
        print(f"| {'-' * width} | --- |")
        for name, value in rows:
            print(f"| {name.ljust(width)} | {value} |")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(os.path.dirname(ENV["SEXPGPU_CACHE"]), ignore_errors=True)


if __name__ == "__main__":
    main()
