"""A node lost in the middle of a Ray sweep, on a real multi-node Ray cluster (several raylets
on this host, ray.cluster_utils.Cluster): the scenario that `tests/test_ray_node_loss.py`
checks and `bench/node_loss.py` times.

The point's worker dies with its node after a checkpoint, while the other node's CPU is
held, so that the only free CPU in Ray's view is the dead node's (Ray marks a node dead
only about 15 s after the loss). The driver must find the node's raylet gone and place the
next attempt on the live node."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import ray
from ray.cluster_utils import Cluster

from conftest import wait_for
from orchestration.driver import Driver, sweep_points
from sexpgpu.runtime.checkpoint import list_checkpoints
from sexpgpu.runtime.store import Store
from sexpgpu.session import Session, Settings
from sexpgpu.sweeps.ledger import SweepLedger
from test_ray_sweep import LRS, RUN, events_of


@ray.remote(num_cpus=1)
class Busy:
    """Holds a node's CPU, so that Ray's only free CPU is the lost node's."""

    def ready(self) -> bool:
        return True


@contextlib.contextmanager
def two_node_cluster() -> Iterator[Cluster]:
    """A head that runs no worker and two nodes of one CPU each, all on loopback."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        nodes.add_node(num_cpus=1)
    ray.init(address=nodes.address, include_dashboard=False, log_to_driver=False)
    try:
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()


@dataclass
class NodeLoss:
    ledger: SweepLedger
    store: Store
    slug: str
    lost_node: str  # "" when the attempt ended before its first checkpoint (no loss happened)
    lost_at: float  # time.time() when the node was removed
    relaunched_on: str  # the node of the second attempt's worker, or why it gave no answer
    resumes: list[dict[str, Any]]  # the point's `resume` events, in the log's order
    checkpoints: set[str]  # the paths of the point's `checkpoint` events

    def resumed_after_s(self) -> float:
        """Seconds from the loss to the first `resume` event's time."""
        resumed = datetime.fromisoformat(str(self.resumes[0]["t"]).replace("Z", "+00:00")).timestamp()
        return resumed - self.lost_at


def lose_the_node_of_a_running_point(folder: Path, cluster: Cluster) -> NodeLoss:
    """One point of the test sweep in FOLDER (a fresh one), its node removed once its first
    attempt published a checkpoint."""
    (folder / ".git").mkdir()
    (folder / "data").mkdir()
    (folder / "data" / "stdlib-docstrings.txt").write_bytes((Path(__file__).parents[1] / "examples" / "data" / "stdlib-docstrings.txt").read_bytes())
    path = folder / "lm.lisp"
    path.write_text(RUN)
    compiled, refusal = Session(Settings()).compile_sweep(path, "lrs", len(LRS))
    assert refusal is None, refusal
    points = sweep_points(compiled, [{"lr": lr} for lr in LRS])[:1]
    remote = folder / "store"
    removed: dict[str, Any] = {}
    relaunched: dict[str, Any] = {}
    threads: list[threading.Thread] = []
    busy: list[Any] = []

    def latest(slug: str) -> int:
        try:
            return max((c.step for c in list_checkpoints(Store.open(str(remote)), slug) if c.valid), default=-1)
        except OSError:
            return -1

    def remove_its_node(record: Any, gang: Any) -> None:
        wait_for(lambda: latest(record.slug) > 0 or gang.stopped, "a checkpoint of the first attempt")
        if gang.stopped:
            return
        node = ray.get(gang.workers[0].where.remote(), timeout=60)["node"]
        [victim] = [n for n in cluster.list_all_nodes() if n.node_id == node]
        [live] = [n for n in cluster.list_all_nodes() if n.node_id not in (node, cluster.head_node.node_id)]
        busy.append(Busy.options(label_selector={"ray.io/node-id": live.node_id}).remote())
        ray.get(busy[0].ready.remote(), timeout=120)
        removed["node"], removed["at"] = node, time.time()
        cluster.remove_node(victim, allow_graceful=False)

    def on_launch(record: Any, gang: Any) -> None:
        if record.attempts == 1:
            threads.append(threading.Thread(target=remove_its_node, args=(record, gang), daemon=True))
            threads[-1].start()
        elif record.attempts == 2:
            for holder in busy:  # the live node's CPU is free again
                ray.kill(holder)
            try:
                relaunched["node"] = ray.get(gang.workers[0].where.remote(), timeout=60)["node"]
            except Exception as exc:  # placed on the dead node: never answers
                relaunched["node"] = f"no answer ({type(exc).__name__})"

    ledger = Driver(path, "lrs", str(remote), None, 1, None, say=lambda _: None, on_launch=on_launch).run(points)
    for thread in threads:
        thread.join(60)
    [point] = ledger.points
    store = Store.open(str(remote))
    everything = events_of(store, point.slug)
    return NodeLoss(
        ledger=ledger,
        store=store,
        slug=point.slug,
        lost_node=str(removed.get("node", "")),
        lost_at=float(removed.get("at", 0.0)),
        relaunched_on=str(relaunched.get("node", "")),
        resumes=[e for e in everything if e["kind"] == "resume"],
        checkpoints={str(e["path"]) for e in everything if e["kind"] == "checkpoint"},
    )
