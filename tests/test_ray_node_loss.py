"""A node lost in the middle of a Ray sweep, on a real multi-node Ray cluster (several raylets
on this host, ray.cluster_utils.Cluster): the point's worker dies with its node after a
checkpoint; the driver finds the node's raylet gone and places the next attempt on a live
node (never on the dead one, which Ray marks dead only later, and which is the only node with
a free CPU in Ray's view while the live one is busy), and it resumes within seconds of the
loss; the loss is one preemption, and the checkpoint it resumes from has its event in the log."""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import wait_for
from sexpgpu.runtime.checkpoint import list_checkpoints
from sexpgpu.runtime.store import Store
from sexpgpu.session import Session, Settings

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402 (needs Ray)

from orchestration.driver import Driver, sweep_points  # noqa: E402
from test_ray_sweep import LRS, RUN, assert_one_series, events_of  # noqa: E402 (the same sweep and checks)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one local Ray cluster at a time

RESUMED_WITHIN_S = 10.0


@ray.remote(num_cpus=1)
class Busy:
    """Holds a node's CPU, so that Ray's only free CPU is the lost node's."""

    def ready(self) -> bool:
        return True


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head that runs no worker and two nodes of one CPU each."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        nodes.add_node(num_cpus=1)
    ray.init(address=nodes.address, include_dashboard=False, log_to_driver=False)
    yield nodes
    ray.shutdown()
    nodes.shutdown()


def test_a_lost_node_is_one_preemption_resumed_on_a_live_node(tmp_path: Path, cluster: Cluster) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "stdlib-docstrings.txt").write_bytes((Path(__file__).parents[1] / "examples" / "data" / "stdlib-docstrings.txt").read_bytes())
    path = tmp_path / "lm.lisp"
    path.write_text(RUN)
    compiled, refusal = Session(Settings()).compile_sweep(path, "lrs", len(LRS))
    assert refusal is None, refusal
    points = sweep_points(compiled, [{"lr": lr} for lr in LRS])[:1]
    remote = tmp_path / "store"
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
    assert removed, "the node was never removed (the attempt ended before its first checkpoint)"
    [point] = ledger.points
    assert (point.state, point.attempts, point.preemptions) == ("finished", 2, 1), (point.state, point.attempts, point.preemptions, point.reason)
    assert relaunched["node"] != removed["node"], "the next attempt was placed on the lost node"
    store = Store.open(str(remote))
    everything = events_of(store, point.slug)
    checkpoints = {e["path"] for e in everything if e["kind"] == "checkpoint"}
    resumes = [e for e in everything if e["kind"] == "resume"]
    assert resumes and all(e["checkpoint"] in checkpoints for e in resumes), (resumes, sorted(checkpoints))
    resumed = datetime.fromisoformat(str(resumes[0]["t"]).replace("Z", "+00:00")).timestamp()
    assert resumed - removed["at"] < RESUMED_WITHIN_S, f"resumed {resumed - removed['at']:.1f} s after the loss"
    assert_one_series(store, point.slug)
