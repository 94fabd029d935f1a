"""What the Ray driver costs as a sweep grows: the real driver (orchestration/driver.py) on a
simulated multi-node Ray cluster (several raylets on this host, ray.cluster_utils.Cluster)
against the S3 store on loopback (moto's server, in a process of its own so that its CPU is
not the driver's), a tiny experiment (the quickstart's MLP, 4 hidden units, 64 samples) at --max-steps 1, so that what is
measured is the driver, not the training.

The driver is handed the points as `sexpgpu sweep --ray` hands them (Session.stream_sweep:
each point as soon as it is compiled), so what it costs includes compiling and bundling.
Prints, for each N:
- 1st launch s: from the sweep's start (before anything is compiled) to the driver's first
  launch of a worker (what the driver itself takes);
- first step s: from the sweep's start to the first `step` event of any point (the worker's
  process start, its compile of the bundle and the step added);
- wall s: the whole sweep;
- CPU ms/point: the driver process's CPU time over the sweep (compiling, bundling and
  supervising), per point;
- peak MB: the driver process's peak RSS during the sweep;
- driver req/point: store requests the driver itself sent (a botocore hook on its client),
  by kind (PUT, GET, LIST, HEAD, DELETE);
- all req/point: every request the S3 server answered over the sweep (the workers' too);
- ledger B/point: bytes of the ledger (sweep.json, journal/) the driver wrote;
and below the table the driver's RSS before the sweep, its CPU per point by thread (the
threads still running at the end) and, with --requests, its requests per point by what they
are for (the path with slugs and numbers as N).

    python bench/sweep_scale.py [--n 100 1000] [--nodes 4] [--cpus-per-node 1] [--profile OUT] [--requests] [--verbose]
    python bench/sweep_scale.py --n 10000          # long: 10,000 one-step points to train
    python bench/sweep_scale.py --n 1000 --first   # only the way to the first step (one N a run)
    python bench/sweep_scale.py --n 10000 --first --nodes 1   # the first step where its worker has a node to itself

Before each sweep the first point is trained once (at --max-steps 1, into a store of its
own), so the workers find its kernels built, as a user's kernel cache has them (--cold
leaves the cache empty: the workers build them), and the bench waits until this host is
quiet: Cluster.add_node returns when a raylet is registered, while each node's agents and
the workers Ray starts ahead go on starting for seconds. The sweep then starts on a cluster
that is up, as a user's is. --nodes 1 gives the first point's worker a node to itself, as
on a real cluster, where the other nodes' workers are not on its cores (here 4 simulated
nodes share this host's 2).

--profile OUT writes the driver's cProfile statistics (pstats) per N to OUT.N (with
--first too, up to the first step). Each run also
prints the first launched point's way to its first step: the driver's launch, its worker's
first answer (the actor ready), the run's run.start and first step events; --first stops the
sweep there (its actors are left to Ray's shutdown, so give one N per run).

--no-train measures the driver alone, without training and without Ray's workers: one real
attempt of the first point is trained first (at --max-steps 1, into the store), and every
attempt the driver then launches ends at once with that attempt's outcome (its slug, its
steps, its loss), through a Ray object put in the driver's own local Ray of
--nodes x --cpus-per-node CPUs (so that as many points run at once). What runs is the
driver's own code: the points compiled as `sweep --ray` compiles them (shape groups, one
compile per group, each point bound), their bundles written, the ledger (its journal and
snapshots), leases claimed and renewed, the status reads, the rounds' bookkeeping, and the
live table (drawn to a terminal that is not shown, every round). What it does not cover:
the workers (their start, compile and training, their store requests) and Ray's scheduling
of actors, preemptions, node loss, another driver, and halving (no scheduler is asked).

    python bench/sweep_scale.py --no-train --n 100 1000 10000 --nodes 100 --local
"""

from __future__ import annotations

import argparse
import cProfile
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Optional
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

BUCKET = "bench"
REQUEST_LINE = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP')


TINY = (  # the quickstart's MLP made tiny: a worker's share of a point is its start, not training
    ("(synthetic :spirals :n 2048", "(synthetic :spirals :n 64"), (":batch 64)", ":batch 8)"), ("(nn:mlp 2 64 3)", "(nn:mlp 2 4 3)"),
)


def run_file(points: int) -> str:
    lrs = " ".join(f"{0.01 + 0.0001 * i:.4f}" for i in range(points))
    text = (REPO / "examples" / "quickstart.lisp").read_text()
    for big, tiny in TINY:
        assert big in text, big
        text = text.replace(big, tiny)
    return text.replace("(defknob lr 0.1)", f"(defknob lr 0.1)\n(defsweep grid :lr ({lrs}))")


def serve_moto(log: str) -> None:
    """The child process: moto's server on loopback, one log line per request into LOG."""
    import logging

    from moto.server import ThreadedMotoServer

    handler = logging.FileHandler(log)
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.setLevel(logging.INFO)
    werkzeug.addHandler(handler)
    werkzeug.propagate = False
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(server.get_host_and_port()[1], flush=True)
    sys.stdin.read()  # until the bench closes our stdin
    server.stop()


def server_requests(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if REQUEST_LINE.search(line))


@dataclass
class Counted:
    """The driver's own store requests, by kind, and the ledger bytes it wrote."""

    kinds: Counter[str]
    ledger_bytes: int = 0
    shapes: Counter[str] = field(default_factory=Counter)  # "KIND path-shape" (slugs and numbers as *)

    def hook(self, request: Any, **_: Any) -> None:
        method, url = str(request.method), str(request.url)
        kind = "LIST" if method == "GET" and ("list-type=" in url or "prefix=" in url) else method
        self.kinds[kind] += 1
        path = url.split("?", 1)[0]
        self.shapes[f"{kind} {shape(url)}"] += 1
        if method == "PUT" and "/sweeps/" in path and (path.endswith("/sweep.json") or "/journal/" in path):
            self.ledger_bytes += int(request.headers.get("Content-Length", 0))


def shape(url: str) -> str:
    """A request's path with what differs between points (slugs, numbers) as *: what it is for."""
    path, _, query = url.partition("?")
    prefix = re.search(r"prefix=([^&]*)", query)
    where = path.split(f"/{BUCKET}/", 1)[-1] + (f" prefix={unquote(prefix.group(1))}" if prefix else "")
    where = re.sub(r"store\d+/", "", where)
    where = re.sub(r"[^/ =]+\.[0-9a-f]{8}(?=/|\.json|$)", "SLUG", where)
    return re.sub(r"\d+", "N", where)


def count_requests(store: Any) -> Counted:
    counted = Counted(Counter())
    store.fs.connect()
    store.fs.s3.meta.events.register("before-send.s3", counted.hook)
    return counted


class PeakRss(threading.Thread):
    """The process's resident memory, sampled until stopped: its peak, in MB."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.halt = threading.Event()
        self.peak = 0

    def run(self) -> None:
        while not self.halt.wait(0.05):
            self.peak = max(self.peak, rss_kb())

    def stop(self) -> float:
        self.halt.set()
        self.join()
        return max(self.peak, rss_kb()) / 1024


def thread_cpu() -> Counter[str]:
    """CPU seconds of this process's threads so far, by thread name (the kernel's: Ray's and
    gRPC's native threads name themselves; Python's are all `python`)."""
    ticks = os.sysconf("SC_CLK_TCK")
    spent: Counter[str] = Counter()
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # ended since the listing
            continue
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        spent[re.sub(r"\d+$", "N", name)] += (int(fields[11]) + int(fields[12])) / ticks
    return spent


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["t"]).replace("Z", "+00:00")).timestamp()


def first_step(store: Any, slugs: list[str]) -> Optional[float]:
    from sexpgpu.runtime.runfolder import RunFolder

    times = [stamp(e) for slug in slugs for e in RunFolder(store, slug).read_events() if e.get("kind") == "step"]
    return min(times) if times else None


class Screen:
    """A terminal nobody watches: what the live table writes is counted, not shown."""

    def __init__(self) -> None:
        self.chars = 0
        self.draws = 0

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.chars += len(text)
        self.draws += text.count("\n") >= 2  # a table (its lines in one write), not a log line
        return len(text)

    def flush(self) -> None:
        pass


class EndedAtOnce:
    """Stands in for orchestration.gang.Gang under --no-train: the attempt is over as soon as
    it starts, with the outcome a real attempt of the sweep ended with (OUTCOME), given the
    point's slug (the driver's on_launch names it)."""

    outcome: Any = None

    def __init__(self, *_: Any, **__: Any) -> None:
        import ray

        self.ray = ray
        self.refs: list[Any] = []
        self.slug = ""

    def start(self, request: Any) -> None:
        self.refs = [self.ray.put(None)]

    def collect(self, ref: Any) -> Any:
        return type(self).outcome.model_copy(update={"slug": self.slug, "folder": None})

    def release(self, idle: list[Any]) -> None:
        pass

    def stop(self) -> None:
        pass


def real_outcome(path: Path, url: str) -> Any:
    """The outcome of one real attempt of the sweep's first point, at --max-steps 1."""
    from sexpgpu.ir.experiment import Selection
    from sexpgpu.session import Session, Settings

    session = Session(Settings(store=url, max_steps=1))
    compiled, refusal = session.compile_sweep(path, "grid", 1, Selection())
    assert refusal is None and compiled, refusal
    outcome = session.train(compiled[0])
    assert outcome.exit_code == 0, outcome
    return outcome


class FirstPoint:
    """The first launched point's way to its first step, from the driver's side (its launch,
    its worker's first answer) and the run's own events (run.start, the first step); with
    STOP, the sweep is interrupted once that step is in (only the first step is measured)."""

    def __init__(self, store: Any, stop: bool) -> None:
        self.store, self.stop = store, stop
        self.times: dict[str, float] = {}
        self.thread: Optional[threading.Thread] = None
        self.slug = ""

    def launched(self, record: Any, gang: Any) -> None:
        if self.thread is None:
            self.times["launch"] = time.time()
            self.thread = threading.Thread(target=self.follow, args=(record.slug, gang.workers[0]), daemon=True)
            self.thread.start()

    def follow(self, slug: str, worker: Any) -> None:
        import _thread

        import ray

        self.slug = slug
        ray.get(worker.where.remote())
        self.times["actor ready"] = time.time()
        if not self.stop:  # read once the sweep has ended (no requests of the bench's in the sweep's count)
            return
        while not self.read_events():
            time.sleep(0.2)
        _thread.interrupt_main()

    def read_events(self) -> bool:
        """The first point's run.start and first step from its events; False before that step."""
        from sexpgpu.runtime.runfolder import RunFolder

        kinds = {str(e.get("kind")): stamp(e) for e in reversed(RunFolder(self.store, self.slug).read_events())}
        if "step" not in kinds:
            return False
        self.times["run.start"], self.times["first step"] = kinds.get("run.start", float("nan")), kinds["step"]
        return True


def measure(root: Path, n: int, url: str, log: Optional[Path], profile: Optional[str], verbose: bool = False, no_train: bool = False,
            first_only: bool = False, cold: bool = False) -> dict[str, Any]:
    import orchestration.driver as driver_module
    from orchestration.driver import Driver, streamed_points
    from sexpgpu.cli.sweeps import LiveTable
    from sexpgpu.runtime.store import Store
    from sexpgpu.session import Session, Settings

    path = root / f"scale{n}.lisp"
    path.write_text(run_file(n))
    launches: list[float] = []
    began = time.time()

    def say(line: str) -> None:
        if verbose:
            print(f"{time.time() - began:7.2f} s {rss_kb() / 1024:6.0f} MB  {line}", file=sys.stderr, flush=True)

    follower = FirstPoint(Store.open(url), first_only and not no_train)

    def launched(record: Any, gang: Any) -> None:
        launches.append(time.time())
        gang.slug = record.slug
        if not no_train:
            follower.launched(record, gang)

    table: Optional[LiveTable] = None
    screen = Screen()
    if no_train:
        EndedAtOnce.outcome = real_outcome(path, f"{url}/template")
        driver_module.Gang = EndedAtOnce  # type: ignore[misc,assignment]
        table = LiveTable(screen, Store.open(url), enabled=True, height=40)
        say_to = say

        def say(line: str) -> None:  # the driver's lines go above the live table, as on a terminal
            assert table is not None
            table.say(line)
            say_to(line)

    if not no_train and not cold:  # a user's kernel cache: the first point trained once before (its kernels built)
        real_outcome(path, f"{url}/warm")
    settled = settle()
    print(f"(this host settled {settled:.1f} s before the sweep: its processes under {QUIET:.0%} of a core for two seconds)", file=sys.stderr)
    driver = Driver(path, "grid", url, None, None, 1, say=say, on_launch=launched, table=table)
    if no_train:
        driver.warmed = True  # no worker is started: no warm pool either
    journal_after_round: list[int] = []  # this driver's journal objects in the store after each round's write
    write_points = driver.ledger_store.write_points

    def counting_write(records: Any, compact: bool = True) -> int:
        changed = write_points(records, compact)
        journal_after_round.append(sum(1 for p in driver.ledger_store.folded if "/journal/" in p))
        return changed

    driver.ledger_store.write_points = counting_write  # type: ignore[method-assign]
    counted = count_requests(driver.store) if not driver.store.is_local else Counted(Counter())
    before = server_requests(log) if log is not None else 0
    rss = PeakRss()
    rss.start()
    profiler = cProfile.Profile() if profile else None
    base_mb, threads_before = rss_kb() / 1024, thread_cpu()
    cpu, started = time.process_time(), time.time()
    if profiler is not None:
        profiler.enable()
    try:
        ledger = driver.run(streamed_points(Session(Settings()), path, "grid", [{"lr": 0.01 + 0.0001 * i} for i in range(n)]))
    except KeyboardInterrupt:  # --first: stopped once the first step was in
        if not first_only:
            raise
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{profile}.{n}")
        return {"n": n, "first": {k: v - started for k, v in follower.times.items()}, "first_launch_s": min(launches) - started}
    if follower.thread is not None:
        follower.thread.join()
        follower.read_events()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(f"{profile}.{n}")
    cpu, wall = time.process_time() - cpu, time.time() - started
    peak = rss.stop()
    threads = thread_cpu()
    threads.subtract(threads_before)
    everything = (server_requests(log) - before) if log is not None else 0
    bad = [(p.point, p.state, p.reason) for p in ledger.points if p.state not in ("finished", "truncated")]
    assert not bad, bad[:5]
    store = Store.open(url)
    first = None if no_train else first_step(store, [p.slug for p in sorted(ledger.points, key=lambda p: p.point)[:8]])
    driver_requests = sum(counted.kinds.values())
    return {
        "n": n, "wall_s": wall, "first_step_s": (first - started) if first else float("nan"), "first_launch_s": min(launches) - started,
        "cpu_ms": 1000 * cpu / n, "peak_mb": peak, "driver_req": driver_requests / n,
        "kinds": {k: v / n for k, v in sorted(counted.kinds.items())}, "all_req": everything / n,
        "ledger_b": driver.ledger_store.bytes_written / n, "shapes": {k: v / n for k, v in counted.shapes.most_common()},
        "base_mb": base_mb, "threads": {k: 1000 * v / n for k, v in threads.most_common() if v > 0},
        "draws": screen.draws, "journal_rounds": len(journal_after_round), "journal_max": max(journal_after_round, default=0),
        "journal_last_round": journal_after_round[-1] if journal_after_round else 0, "ledger_objects": len(store.list(f"sweeps/{path.stem}.grid/journal")),
        "first": {k: v - started for k, v in follower.times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("--profile", metavar="OUT", help="write the driver's cProfile statistics to OUT.N")
    parser.add_argument("--verbose", action="store_true", help="the driver's lines on stderr, with the seconds since its start and its RSS")
    parser.add_argument("--requests", action="store_true", help="the driver's requests per point by what they are for")
    parser.add_argument("--no-train", action="store_true", help="the driver alone: every attempt ends at once with a real attempt's outcome (see above)")
    parser.add_argument("--local", action="store_true", help="a local folder for the store instead of S3 on loopback (requests are not counted)")
    parser.add_argument("--first", action="store_true", help="stop each sweep once its first step is in: only the way to it is measured")
    parser.add_argument("--cold", action="store_true", help="an empty kernel cache: the workers build the first point's kernels (by default the first point is trained once before the sweep, as a user's cache has it)")
    parser.add_argument("--serve-moto", metavar="LOG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_moto:
        serve_moto(args.serve_moto)
        return
    if args.local:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / ".git").mkdir()
            os.environ["SEXPGPU_CACHE"] = str(root / "cache")
            rows = on_ray(args, root, lambda n: str(root / f"store{n}"), None)
        report(args, rows)
        return

    from s3_server import make_bucket, s3_env

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / ".git").mkdir()
        log = root / "moto.log"
        server = subprocess.Popen([sys.executable, __file__, "--serve-moto", str(log)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        endpoint = f"http://127.0.0.1:{server.stdout.readline().strip()}"
        os.environ.update({k: v for k, v in s3_env(endpoint).items() if v})
        for key in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            os.environ.pop(key, None)
        os.environ["SEXPGPU_CACHE"] = str(root / "cache")
        make_bucket(BUCKET, endpoint)
        try:
            rows = on_ray(args, root, lambda n: f"s3://{BUCKET}/store{n}", log)
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(timeout=30)
    report(args, rows)


def on_ray(args: argparse.Namespace, root: Path, url_for: Any, log: Optional[Path]) -> list[dict[str, Any]]:
    """Each N measured on a simulated cluster of --nodes raylets (--no-train: one local Ray of
    as many CPUs, since no worker is started)."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = None
    if args.no_train:
        ray.init(address="local", num_cpus=args.nodes * args.cpus_per_node, include_dashboard=False, log_to_driver=False)
    else:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.cpus_per_node, "include_dashboard": False})
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=args.cpus_per_node)
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for n in args.n:
            rows.append(measure(root, n, url_for(n), log, args.profile, args.verbose, args.no_train, args.first, args.cold))
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    return rows


def host_cpu_s() -> float:
    """The CPU seconds every process of this host has used (/proc/stat: user, nice, system)."""
    with open("/proc/stat") as handle:
        fields = handle.readline().split()[1:4]
    return sum(int(f) for f in fields) / os.sysconf("SC_CLK_TCK")


QUIET = 0.15  # of a core: what this host's processes use when nothing runs (the VM's own)


def settle(window_s: float = 1.0, quiet: float = QUIET, most_s: float = 90.0) -> float:
    """Wait until this host is quiet (under QUIET of a core busy, over two windows in a row):
    Cluster.add_node returns when a raylet is registered, while each node's agents (the
    dashboard and runtime-env agents) and the workers Ray starts ahead go on starting for
    some seconds, several CPU seconds each. A sweep is measured on a cluster that is up, as a
    user's is. Returns the seconds waited (MOST_S at most)."""
    began, calm = time.time(), 0
    while time.time() - began < most_s and calm < 2:
        before = host_cpu_s()
        time.sleep(window_s)
        calm = calm + 1 if (host_cpu_s() - before) / window_s < quiet else 0
    return time.time() - began


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if r.get("first"):
            print(f"N={r['n']}: the first point, seconds from the sweep's start: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["first"].items(), key=lambda kv: kv[1])))
    rows = [r for r in rows if "wall_s" in r]
    where = "a local folder" if args.local else "S3 on loopback (moto)"
    if args.no_train:
        print(f"Ray sweep driver alone (--no-train: attempts end at once), {args.nodes * args.cpus_per_node} points at once, {where}, --max-steps 1")
    else:
        print(f"Ray sweep driver, {args.nodes} nodes x {args.cpus_per_node} CPU (raylets on one host), {where}, --max-steps 1")
    print(f"{'N':>6}{'1st launch s':>14}{'1st step s':>12}{'wall s':>9}{'CPU ms/pt':>11}{'peak MB':>9}"
          f"{'driver req/pt':>15}{'all req/pt':>12}{'ledger B/pt':>13}")
    for r in rows:
        print(f"{r['n']:>6}{r['first_launch_s']:>14.1f}{r['first_step_s']:>12.1f}{r['wall_s']:>9.1f}"
              f"{r['cpu_ms']:>11.1f}{r['peak_mb']:>9.0f}{r['driver_req']:>15.1f}{r['all_req']:>12.1f}{r['ledger_b']:>13.0f}")
    for r in rows:
        print(f"N={r['n']}: driver requests per point by kind: " + ", ".join(f"{k} {v:.2f}" for k, v in r["kinds"].items()))
        print(f"N={r['n']}: RSS before the sweep {r['base_mb']:.0f} MB; CPU ms per point by thread: "
              + ", ".join(f"{k} {v:.1f}" for k, v in r["threads"].items()))
        print(f"N={r['n']}: live table drawn {r['draws']} times; journal objects left {r['ledger_objects']}; "
              f"this driver's journal objects after its {r['journal_rounds']} ledger writes: at most {r['journal_max']}, {r['journal_last_round']} after the last")
        if args.requests:
            for what, per_point in r["shapes"].items():
                print(f"    {per_point:7.2f}  {what}")


if __name__ == "__main__":
    main()
