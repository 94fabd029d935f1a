"""Bundles: one directory with the source, the IR and the data manifest; `run BUNDLE`
recompiles and refuses another IR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sexpgpu.bundle as bundle_module
from conftest import REPO
from sexpgpu.bundle import BundleError, compile_unpacked, make_bundle, unpacked
from sexpgpu.ir.experiment import Selection


def sexpgpu(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], cwd=cwd, capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})


def test_bundle_runs_anywhere_with_the_same_slug(tmp_path: Path) -> None:
    made = sexpgpu("bundle", "--set", "lr=0.002", str(REPO / "examples" / "charlm.lisp"), "-o", str(tmp_path / "b"), "--json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    manifest = json.loads(made.stdout)
    assert manifest["selection"]["set"] == {"lr": "0.002"} and manifest["data"][0]["copied"] is True
    assert (tmp_path / "b" / "source" / "examples" / "data" / "stdlib-docstrings.txt").is_file()
    ran = sexpgpu("run", str(tmp_path / "b"), "--store", str(tmp_path / "runs"), "--max-steps", "5", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["slug"] == manifest["slug"]
    direct = sexpgpu("variants", "--json", str(REPO / "examples" / "charlm.lisp"), cwd=tmp_path)
    assert json.loads(direct.stdout)["base"] != manifest["slug"]  # the bundle carries its --set


def test_a_bundle_whose_source_changed_is_refused(tmp_path: Path) -> None:
    make_bundle(REPO / "examples" / "quickstart.lisp", Selection(), str(tmp_path / "b"))
    bundled = tmp_path / "b" / "source" / "examples" / "quickstart.lisp"
    bundled.write_text(bundled.read_text().replace("(nn:mlp 2 64 3)", "(nn:mlp 2 32 3)"))
    with pytest.raises(BundleError, match="refusing"), unpacked(str(tmp_path / "b")) as bundle:
        compile_unpacked(bundle)
    ran = sexpgpu("run", str(tmp_path / "b"), "--store", str(tmp_path / "runs"), cwd=tmp_path)
    assert ran.returncode == 3 and "bundle refused" in ran.stderr


def test_large_local_data_must_be_a_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle_module, "MAX_COPIED_BYTES", 1000)
    with pytest.raises(BundleError, match="URL the workers can read"):
        make_bundle(REPO / "examples" / "charlm.lisp", Selection(), str(tmp_path / "b"))
    assert not (tmp_path / "b" / "bundle.json").exists()


def test_unreadable_data_url_fails_at_bundle_time(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    run_file = tmp_path / "r.lisp"
    run_file.write_text((REPO / "examples" / "charlm.lisp").read_text().replace('(text "data/stdlib-docstrings.txt")', '(text "memory://nowhere/corpus.txt")'))
    with pytest.raises(BundleError, match="cannot be read from here"):
        make_bundle(run_file, Selection(), str(tmp_path / "b"))
