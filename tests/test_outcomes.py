"""The same failure reads the same on every path that starts a run: `run`, a local `sweep`,
`sweep --ray` (the point's TrainWorker) and `submit` (the detached supervisor's worker) all
end with the same exit code and the same kind of reason, because all of them start runs
through sexpgpu.session and map what happened to one AttemptOutcome.

One class of failure per test; each test drives the four paths as a user would (the verbs'
own `main`, on a real local Ray for the last two) and compares what they report."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pytest

from sexpgpu.cli.main import main

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one local Ray cluster at a time

RUN = """;;;; f.lisp -- a small MLP on a CSV, one sweep point
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defknob lr 0.1)
(defsweep one :lr (LR))

(defloader train
  :source (csv "data.csv")
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 16)

(defpart net (nn:mlp 2 8 2))

(defobjective (batch)
  (nn:cross-entropy (net (field batch x)) (field batch y)))

(defgroups (all "**" (optim:sgd :lr lr)))

(defrun :steps 40 :seed 0 :checkpoint (:every 10 :keep 2))
"""


@dataclass
class Reported:
    """What one path said: its exit code, and the attempt's reason."""

    code: int
    reason: str
    stderr: str


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="sexpgpu-outcomes")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def project(root: Path, lr: str = "0.1", bad_row: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / ".git").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    rows = ["x_0,x_1,y"] + [f"{a:.4f},{b:.4f},{int(a + b > 0)}" for a, b in rng.normal(size=(64, 2))]
    if bad_row:
        rows[6] = "abc,0.5,1"
    (root / "data.csv").write_text("\n".join(rows) + "\n")
    path = root / "f.lisp"
    path.write_text(RUN.replace("LR", lr))
    return path


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def said(stderr: str) -> str:
    """The last line the CLI said as itself (`sexpgpu: ...`)."""
    lines = [line[len("sexpgpu: "):] for line in stderr.splitlines() if line.startswith("sexpgpu: ")]
    return lines[-1] if lines else ""


def via_run(path: Path, store: str, *flags: str) -> Reported:
    code, out, err = cli("run", str(path), "--sweep", "one", "--point", "0", "--store", store, "--json", *flags)
    reason = json.loads(out)["reason"] if out.strip() else said(err)
    return Reported(code, reason, err)


def via_sweep(path: Path, store: str, *flags: str) -> Reported:
    code, out, err = cli("sweep", str(path), "--sweep", "one", "--store", store, "--json", *flags)
    reason = json.loads(out)["points"][0]["reason"] if out.strip() else said(err)
    return Reported(code, reason, err)


def via_ray_sweep(path: Path, store: str, *flags: str) -> Reported:
    code, out, err = cli("sweep", str(path), "--sweep", "one", "--store", store, "--json", "--ray", *flags)
    reason = json.loads(out)["points"][0]["reason"] if out.strip() else said(err)
    return Reported(code, reason, err)


def via_submit(path: Path, store: str, address: str, *flags: str) -> Reported:
    """Bundle the point, submit it, and wait for its supervisor to record the end."""
    bundle = path.parent / f"bundle-{time.monotonic_ns()}"
    code, out, err = cli("bundle", str(path), "--sweep", "one", "--point", "0", "-o", str(bundle), "--json")
    assert code == 0, err
    return submit_bundle(bundle, store, address, *flags)


def submit_bundle(bundle: Path, store: str, address: str, *flags: str) -> Reported:
    code, out, err = cli("submit", str(bundle), "--ray", address, "--store", store, "--json", *flags)
    if code != 0:
        return Reported(code, said(err), err)
    slug = json.loads(out)["slug"]
    record = wait_for_end(Path(store) / slug / "submit.json")
    return Reported(record["exit_code"], record["reason"], err)


def wait_for_end(path: Path, within_s: float = 180.0) -> dict[str, Any]:
    """The submit record once its supervisor wrote a final state (the event we wait for)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists():
            record = json.loads(path.read_text())
            if record["state"] in ("finished", "failed"):
                return record
        time.sleep(0.2)
    raise AssertionError(f"{path} never recorded an end")


def four_paths(tmp_path: Path, address: str, make: Callable[[Path], Path], store: Callable[[Path], str],
               prepare: Optional[Callable[[Path, str], None]] = None, flags: tuple[str, ...] = ()) -> dict[str, Reported]:
    """Each path on a project and a store of its own, made alike."""
    runners: dict[str, Callable[[Path, str], Reported]] = {
        "run": lambda p, s: via_run(p, s, *flags),
        "sweep": lambda p, s: via_sweep(p, s, *flags),
        "sweep --ray": lambda p, s: via_ray_sweep(p, s, *flags),
        "submit": lambda p, s: via_submit(p, s, address, *flags),
    }
    reports = {}
    for name, runner in runners.items():
        root = tmp_path / name.replace(" ", "").replace("-", "")
        path = make(root)
        where = store(root)
        if prepare is not None:
            prepare(path, where)
        reports[name] = runner(path, where)
    for name, report in reports.items():
        assert "internal error" not in report.stderr, (name, report.stderr)
    return reports


def assert_alike(reports: dict[str, Reported], code: int, reason: str) -> None:
    for name, report in reports.items():
        assert report.code == code, (name, report)
        assert report.reason.startswith(reason), (name, report.reason)


def test_a_store_under_a_regular_file_is_exit_4_on_every_path(tmp_path: Path, ray_cluster: str) -> None:
    def store(root: Path) -> str:
        (root / "afile").write_text("not a folder")
        return str(root / "afile" / "runs")

    reports = four_paths(tmp_path, ray_cluster, project, store)
    assert_alike(reports, 4, "cannot start here: the store ")
    assert all("NotADirectoryError" in r.reason and "--store or SEXPGPU_STORE" in r.reason for r in reports.values()), reports


def test_a_data_error_is_exit_5_on_every_path(tmp_path: Path, ray_cluster: str) -> None:
    reports = four_paths(tmp_path, ray_cluster, lambda root: project(root, bad_row=True), lambda root: str(root / "runs"))
    assert_alike(reports, 5, "data error: loader 'train'")
    assert all("'abc'" in r.reason or "abc" in r.reason for r in reports.values()), reports


def test_a_checkpoint_of_another_run_is_exit_6_on_every_path(tmp_path: Path, ray_cluster: str) -> None:
    def written_then_moved(path: Path, store: str) -> None:
        """A run of another :seed leaves a checkpoint, and its folder is moved to the slug of
        this file's point (a folder copied by hand)."""
        original = path.read_text()
        path.write_text(original.replace(":seed 0", ":seed 1"))
        code, out, err = cli("run", str(path), "--sweep", "one", "--point", "0", "--store", store, "--max-steps", "10", "--json")
        assert code == 0, err
        path.write_text(original)
        code, variants, err = cli("variants", "--json", str(path))
        assert code == 0, err
        Path(store, json.loads(out)["slug"]).rename(Path(store, json.loads(variants)["sweeps"]["one"]["points"][0]["slug"]))

    reports = four_paths(tmp_path, ray_cluster, project, lambda root: str(root / "runs"), prepare=written_then_moved)
    assert_alike(reports, 6, "resume refused: checkpoint ")


def test_a_non_finite_loss_is_exit_1_on_every_path(tmp_path: Path, ray_cluster: str) -> None:
    reports = four_paths(tmp_path, ray_cluster, lambda root: project(root, lr="1e30"), lambda root: str(root / "runs"))
    assert_alike(reports, 1, "non-finite loss or gradient at step ")


def test_a_file_that_does_not_check_is_exit_3_on_every_path(tmp_path: Path, ray_cluster: str) -> None:
    """The CLI compiles before anything runs; a submitted bundle whose source was changed
    after bundling is refused the same way, by submit's own compile."""
    store = str(tmp_path / "runs")
    bad = '"fast"'  # a string where SGD's rate must be a number
    reports = {
        "run": via_run(project(tmp_path / "run", lr=bad), store),
        "sweep": via_sweep(project(tmp_path / "sweep", lr=bad), store),
        "sweep --ray": via_ray_sweep(project(tmp_path / "ray", lr=bad), store),
    }
    bundle = tmp_path / "submit" / "bundle"
    assert cli("bundle", str(project(tmp_path / "submit")), "--sweep", "one", "--point", "0", "-o", str(bundle))[0] == 0
    main_file = bundle / "source" / "f.lisp"
    main_file.write_text(main_file.read_text().replace("(defsweep one :lr (0.1))", f"(defsweep one :lr ({bad}))"))
    reports["submit"] = submit_bundle(bundle, store, ray_cluster)
    assert {name: r.code for name, r in reports.items()} == dict.fromkeys(reports, 3), reports
    for name, report in reports.items():
        assert "error[" in report.stderr, (name, report.stderr)  # the diagnostic, with its code


def test_a_device_that_is_not_here_is_exit_4_on_every_path(tmp_path: Path, ray_cluster: str) -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("this machine has CuPy: --device cuda may start here")
    reports = four_paths(tmp_path, ray_cluster, project, lambda root: str(root / "runs"), flags=("--device", "cuda"))
    assert_alike(reports, 4, "cannot start here: ")
    # the paths that run here name the missing software; the Ray paths the missing GPUs
    assert "CuPy" in reports["run"].reason and "CuPy" in reports["sweep"].reason, reports
    assert "GPU" in reports["sweep --ray"].reason and "GPU" in reports["submit"].reason, reports
