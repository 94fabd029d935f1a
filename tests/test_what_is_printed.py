"""What a command prints is true, and goes where the docs say: a closed stdout is a quiet
exit, Ctrl-C at start-up one line and exit 130, notices on stderr, progress by the wall
clock, a rerun's reason as the run folder has it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

QUICKSTART = REPO / "examples" / "quickstart.lisp"


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "sexpgpu", *args]


def sexpgpu(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(command(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart trained to its end in a store of its own; the run folder."""
    root = tmp_path_factory.mktemp("printed")
    (root / "q.lisp").write_text(QUICKSTART.read_text())
    done = sexpgpu("run", "q.lisp", "--store", "runs", "--quiet", cwd=root)
    assert done.returncode == 0, done.stderr
    (folder,) = (root / "runs").iterdir()
    return folder


# -- a closed stdout -------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", [["logs"], ["status"], ["checkpoint", "{run}", "list"]])
def test_a_closed_stdout_is_a_quiet_exit(trained: Path, verb: list[str]) -> None:
    """`sexpgpu logs RUN | head -2`: the reader went away. Exit 0 and not a word, never the
    store blamed (exit 4) for the pipe."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    args = [a.replace("{run}", str(trained)) for a in verb] if len(verb) > 1 else [*verb, str(trained)]
    try:
        done = subprocess.run(command(*args), stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


# -- Ctrl-C while the command starts ---------------------------------------------------------------


def default_sigint() -> None:
    """In the child: SIGINT interrupts, as at a terminal (a test runner started in the
    background may hand its children SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_the_verb_loads_is_exit_130_with_one_line(tmp_path: Path) -> None:
    """SIGINT while `run` is still importing its modules (seen in -X importtime's report of
    numpy, which only the verb's modules load): exit 130, `interrupted`, no traceback."""
    (tmp_path / "q.lisp").write_text(QUICKSTART.read_text())
    process = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "sexpgpu", "run", "q.lisp"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.startswith("import time:") and line.split("|")[-1].strip() == "numpy":
            process.send_signal(signal.SIGINT)
            break
    out, rest = process.communicate(timeout=120)
    lines = [line for line in (*seen, *rest.splitlines(keepends=True)) if not line.startswith("import time:")]
    assert process.returncode == 130, "".join(lines)
    assert [line.rstrip("\n") for line in lines] == ["interrupted"]
    assert out == ""
    assert not (tmp_path / "runs").exists()
