"""Nodes the driver must not place a new attempt on: lost, but not yet marked dead by Ray.

A node that goes away kills its workers at once, and the driver learns of it within a
second or two (their result refs fail), but Ray marks the node dead only after its health
checks give up (about 15 s by default). A new attempt placed in between lands on the dead
node, dies before it begins, and the point waits for Ray before it runs anywhere. So when
an attempt is lost the driver asks each node's raylet whether it still answers (a TCP
connect to its port, a second at most, every node at once); the ones that do not are left
out of every placement (a label selector on Ray's node id) until Ray marks them dead. A
worker killed on a node that lives (a SIGKILL, Ray's memory monitor) leaves its node in.
"""

from __future__ import annotations

import socket
from typing import Any, Callable, Optional

from sexpgpu.sweeps.ledger import concurrently

NODE_ID_LABEL = "ray.io/node-id"  # the label Ray gives every node (ray.util.placement_group.NODE_ID_LABEL_KEY)
PROBE_TIMEOUT_S = 1.0


def raylet_answers(address: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a node's raylet takes a connection now."""
    try:
        socket.create_connection((address, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


class LostNodes:
    """The nodes lost and not yet marked dead: the placements to avoid."""

    def __init__(self, nodes: Callable[[], list[dict[str, Any]]], answers: Callable[[str, int], bool] = raylet_answers) -> None:
        self.nodes = nodes  # ray.nodes(): each node's id, liveness and raylet address
        self.answers = answers
        self.lost: set[str] = set()

    def look(self) -> set[str]:
        """After a loss: probe every node Ray holds alive; returns the nodes newly found lost.
        When no node answers the driver cannot reach the raylets at all (a client far from
        the cluster): nothing is left out, as before."""
        alive = [n for n in self.nodes() if n.get("Alive")]
        answered = concurrently(lambda n: self.answers(str(n["NodeManagerAddress"]), int(n["NodeManagerPort"])), alive)
        silent = {str(n["NodeID"]) for n, ok in zip(alive, answered, strict=True) if not ok}
        if alive and len(silent) == len(alive):
            return set()
        found = silent - self.lost
        self.lost = silent | (self.lost & {str(n["NodeID"]) for n in alive})
        return found

    def forget_dead(self) -> None:
        """Ray places nothing on a node it marked dead: those need no selector any more."""
        if self.lost:
            alive = {str(n["NodeID"]) for n in self.nodes() if n.get("Alive")}
            self.lost &= alive

    def selector(self) -> Optional[dict[str, str]]:
        """The label selector that keeps a placement off the lost nodes (None: no node lost)."""
        if not self.lost:
            return None
        return {NODE_ID_LABEL: f"!in({','.join(sorted(self.lost))})"}
