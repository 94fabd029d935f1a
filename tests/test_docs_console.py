"""The docs' console blocks are run, and what each command prints is compared with the page
(the syntax: docs/how-it-works.md, "Docs that run"; the runner: tests/doc_console.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from doc_console import REPO, SKIP_CATEGORIES, lines_match, parse_page, run_page, shell_words, in_process

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CONSOLE_PAGES = [p for p in PAGES if "```console" in p.read_text(encoding="utf-8")]


def page_id(path: Path) -> str:
    return path.name


@pytest.mark.parametrize("page", CONSOLE_PAGES, ids=page_id)
def test_console_blocks_print_what_the_page_shows(page: Path, tmp_path: Path) -> None:
    report = run_page(page, tmp_path).report()
    assert not report, f"{len(report)} problem(s) on {page.name}:\n\n" + "\n\n".join(report)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_console_block_runs_or_says_why_not(page: Path) -> None:
    """A block that is not run carries a skip marker with a category from the allowed list
    and a reason; a directive the runner does not know is an error, not ignored."""
    parsed = parse_page(page)
    assert not parsed.errors, "\n".join(parsed.errors)
    text = page.read_text(encoding="utf-8")
    assert len(parsed.blocks) == text.count("```console"), "a console block the runner did not see"
    for block in parsed.blocks:
        if block.skip is not None:
            assert block.skip[0] in SKIP_CATEGORIES and block.skip[1]


def test_skipped_blocks_are_the_ones_that_cannot_run_here() -> None:
    """Each skip category is used only for what it names: a skipped block whose commands
    mention nothing of the kind would be a runnable block left unrun."""
    signs = {
        "gpu": r"cuda|gpu",
        "cloud": r"s3://|--ray|ray |AWS_|submit",
        "install": r"pip |apt-get|git clone|sbcl|generate\.sh|ruff|mypy|pytest",
        "interactive": r"watch|SIGINT|SIGTERM|Ctrl-C",
        "timing": r"bench/|pytest",
    }
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for block in parse_page(page).blocks:
            if block.skip is None:
                continue
            category, why = block.skip
            end = next(i for i in range(block.line, len(lines)) if lines[i].startswith("```"))
            body = "\n".join(lines[block.line:end]) + "\n" + why
            assert re.search(signs[category], body, re.I), f"{page.name}:{block.line}: skipped as {category!r}, but nothing in it needs that"


# ---- the matcher itself: it must be able to fail ----

def test_ellipsis_inside_a_line_matches_any_text() -> None:
    assert lines_match(["loss 0.47..."], ["loss 0.4709"])
    assert not lines_match(["loss 0.47..."], ["loss 0.48"])


def test_a_line_of_ellipsis_matches_any_lines_including_none() -> None:
    assert lines_match(["a", "...", "z"], ["a", "b", "c", "z"])
    assert lines_match(["a", "...", "z"], ["a", "z"])
    assert not lines_match(["a", "...", "z"], ["a", "b"])


def test_times_and_rates_match_by_shape_only() -> None:
    assert lines_match(['{"t":"2026-11-29T19:39:02.163Z","seconds":0.0140}'], ['{"t":"2031-01-02T03:04:05.006Z","seconds":12.5}'])
    assert lines_match(["finished: 300 steps in 0.1s  loss 0.47092"], ["finished: 300 steps in 12.3s  loss 0.47092"])
    assert lines_match(["19:39:01   50  step  step_time=0.129ms  examples_per_s=4.955e+05"],
                       ["07:00:00   50  step  step_time=3s  examples_per_s=12"])
    assert lines_match(['  "worker": "pid 48213",'], ['  "worker": "pid 7",'])
    assert not lines_match(["finished: 300 steps in 0.1s  loss 0.47092"], ["finished: 300 steps in 0.1s  loss 0.47093"])
    assert not lines_match(['"steps": 300'], ['"steps": 301'])


def test_a_number_of_six_digits_or_more_matches_within_its_last_bits_and_no_further() -> None:
    # the losses one page printed under OpenBLAS's Haswell kernels and its SkylakeX ones
    assert lines_match(["finished: 1000 steps in 0.3s  loss 0.0601997  acc 1"], ["finished: 1000 steps in 0.2s  loss 0.0602004  acc 1"])
    assert lines_match(['{"loss":0.05320984045299611,"acc":0.9825}'], ['{"loss":0.05320960976730475,"acc":0.9825}'])
    assert lines_match(["[100,9.321403503417969e-05]"], ["[100,9.3214e-05]"])
    assert not lines_match(["loss 0.0601997"], ["loss 0.0602100"])  # 1.7e-4 apart
    assert not lines_match(["loss 0.0601997"], ["loss -0.0601997"])
    assert not lines_match(['{"acc":0.9825}'], ['{"acc":0.9826}'])  # four digits: exact
    assert not lines_match(["IR 5e789727d176, 3.11.7, 123456"], ["IR 5e789727d177, 3.11.7, 123456"])
    assert not lines_match(["steps 123456"], ["steps 123457"])  # a whole number is exact


def test_plain_sexpgpu_commands_run_in_process_and_shell_syntax_does_not() -> None:
    call = in_process("USER=ada sexpgpu run x.lisp --store runs --json 2>/dev/null")
    assert call is not None and call.env == {"USER": "ada"} and call.argv == ["run", "x.lisp", "--store", "runs", "--json"]
    assert not call.stderr and call.stdout
    assert in_process("sexpgpu eval '(+ 1 2)'") is not None
    assert in_process("sexpgpu fmt --check examples/*.lisp") is None
    assert in_process("cat x.lisp") is None
    words = shell_words("a 'b c' \"$d\"")
    assert words is not None and words.words == ["a", "b c", "$d"] and words.plain == [True, True, False]


def test_update_keeps_the_page_lines_that_still_match() -> None:
    from doc_console import Mismatch, updated_output

    mismatch = Mismatch("p.md", 3, "sexpgpu run x.lisp", ["x.base.1234abcd  /tmp/demo/runs/x", "finished: 300 steps in 0.1s  loss 0.47..."],
                        ["x.base.9999ffff  /tmp/demo/runs/x", "finished: 300 steps in 2.5s  loss 0.4719"])
    assert updated_output(mismatch) == ["x.base.9999ffff  /tmp/demo/runs/x", "finished: 300 steps in 0.1s  loss 0.47..."]
