"""A node lost in the middle of a Ray sweep (the scenario in tests/node_loss.py, on a real
multi-node Ray cluster): the loss is one preemption, the next attempt runs on a live node
(never on the dead one, the only node with a free CPU in Ray's view), it resumes from a
checkpoint whose event is in the log, and the point's series is one. How soon it resumes
is a number for `bench/node_loss.py` to print, not a test's bound."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402 (needs Ray)

from node_loss import lose_the_node_of_a_running_point, two_node_cluster  # noqa: E402 (needs Ray)
from test_ray_sweep import assert_one_series  # noqa: E402 (the same sweep's checks)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one local Ray cluster at a time


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with two_node_cluster() as nodes:
        yield nodes


def test_a_lost_node_is_one_preemption_resumed_on_a_live_node(tmp_path: Path, cluster: Cluster) -> None:
    loss = lose_the_node_of_a_running_point(tmp_path, cluster)
    assert loss.lost_node, "the node was never removed (the attempt ended before its first checkpoint)"
    [point] = loss.ledger.points
    assert (point.state, point.attempts, point.preemptions) == ("finished", 2, 1), (point.state, point.attempts, point.preemptions, point.reason)
    assert loss.relaunched_on != loss.lost_node, "the next attempt was placed on the lost node"
    assert loss.resumes and all(e["checkpoint"] in loss.checkpoints for e in loss.resumes), (loss.resumes, sorted(loss.checkpoints))
    assert loss.resumed_after_s() > 0, "the resume event is older than the loss"
    assert_one_series(loss.store, loss.slug)
