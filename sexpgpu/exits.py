"""The exit codes every verb and every path that runs an attempt reports (docs/command-line.md
lists them). A leaf module: `sexpgpu --version`, `--help` and `docs` load it without pydantic."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    """Exit codes, the same for every verb and every path that runs an attempt."""

    OK = 0
    RUN_FAILED = 1  # the run itself failed: a non-finite step the guard stopped at, a rank's exception
    USAGE = 2
    CHECK_FAILED = 3
    CANNOT_START = 4  # the store, the device, the cluster or missing software
    DATA = 5
    RESUME_REFUSED = 6
    STOPPED = 75  # resumable: a signal, or the attempt was lost (preempted)
    INTERRUPTED = 130  # SIGINT before the attempt wrote anything (128 + 2, as shells report it)
    TERMINATED = 143  # SIGTERM before the attempt wrote anything (128 + 15)
