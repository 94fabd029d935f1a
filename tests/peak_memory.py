"""A child process's own peak resident memory, for the tests that bound it.

Not `ru_maxrss`: Linux carries the forking process's high-water mark into the child (through
fork and exec), so `wait4`'s or the child's own RUSAGE_SELF figure of a child of a large
pytest worker is the worker's peak (a child of a process holding 1 GiB reports 1 GiB).
`VmHWM` in /proc/self/status is the high-water mark of the child's own memory since its exec.
"""

from __future__ import annotations

import re

# run the CLI with sys.argv[1:], then report VmHWM on stderr and exit with the CLI's code
# (in a finally: a child that raises or exits still reports, and the test's own assertion says why it failed)
MEASURED_CLI = ("import re, sys\nfrom sexpgpu.cli.main import main\ntry:\n    code = main(sys.argv[1:])\nfinally:\n"
                "    hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())\n"
                "    print(f'vmhwm_kb={hwm.group(1) if hwm else -1}', file=sys.stderr, flush=True)\nsys.exit(code)")


def peak_kb(stderr: str) -> int:
    """The VmHWM a MEASURED_CLI child reported, in KiB."""
    match = re.search(r"vmhwm_kb=(-?\d+)", stderr)
    assert match, stderr
    return int(match.group(1))
