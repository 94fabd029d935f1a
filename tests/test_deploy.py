"""ray-cluster.yaml is a config Ray's own autoscaler accepts, with what cluster.md asks of it;
deploy/local-cluster's scripts are valid bash."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO

pytest.importorskip("ray")
yaml = pytest.importorskip("yaml")

pytestmark = pytest.mark.xdist_group("ray")  # one local Ray cluster at a time


def config() -> dict[str, Any]:
    return yaml.safe_load((REPO / "ray-cluster.yaml").read_text())


def test_ray_cluster_yaml_passes_rays_validation() -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(config()))  # what `ray up` runs before it starts anything


def test_ray_validation_rejects_a_broken_copy() -> None:
    """The validation above can fail: a misspelled field is refused."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    broken = config()
    broken["available_node_types"]["gpu-spot"]["min_worker"] = 0
    with pytest.raises(Exception, match="min_worker"):
        validate_config(prepare_config(broken))


def test_the_cluster_has_a_cpu_head_and_spot_gpu_workers_from_zero() -> None:
    c = config()
    assert c["provider"]["type"] == "aws"
    types = c["available_node_types"]
    head = types[c["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0 and "InstanceMarketOptions" not in head["node_config"]
    gpu = [t for name, t in types.items() if name != c["head_node_type"] and t["resources"].get("GPU", 0) >= 1]
    assert gpu, "a GPU worker type"
    assert all(t["min_workers"] == 0 and t["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot" for t in gpu)
    assert "sexpgpu" in c["docker"]["image"] or any("sexpgpu[cuda,cluster]" in cmd for cmd in c.get("setup_commands", []))
    assert any("SEXPGPU_STORE" in option for option in c["docker"]["run_options"])


@pytest.mark.parametrize("script", ["start.sh", "stop.sh"])
def test_local_cluster_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(REPO / "deploy" / "local-cluster" / script)], check=True)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_stop_stops_only_what_start_started(tmp_path: Path) -> None:
    """Another Ray on the machine (here this test's own) survives stop.sh; the local
    cluster's processes are gone after it."""
    import os

    import ray

    env = {**os.environ, "SEXPGPU_LOCAL_CLUSTER": str(tmp_path), "S3_PORT": str(free_port()), "RAY_PORT": str(20000 + free_port() % 20000)}
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        started = subprocess.run(["bash", str(REPO / "deploy" / "local-cluster" / "start.sh")], env=env, capture_output=True, text=True, timeout=180)
        assert started.returncode == 0, started.stderr + (tmp_path / "ray.log").read_text()[-2000:]
        pids = [int((tmp_path / f"{name}.pid").read_text()) for name in ("ray", "s3")]
        stopped = subprocess.run(["bash", str(REPO / "deploy" / "local-cluster" / "stop.sh")], env=env, capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert ray.get(ray.remote(lambda: 42).remote(), timeout=60) == 42  # the other Ray still works
    finally:
        ray.shutdown()
