"""Runs the ```console blocks of a docs page and compares what each command prints with the
page (tests/test_docs_console.py). The syntax is documented in docs/how-it-works.md,
"Docs that run"; this module is its one implementation.

A page runs in a fresh folder; its setup directives and console blocks run in page order,
so a later block sees what an earlier one made. A command that is `sexpgpu ARGS`, with
optional `VAR=value` assignments before it, `2>/dev/null` or `>/dev/null` after it and one
`| pipeline` behind it, runs in this process through sexpgpu.cli.main.main (the pipeline
gets its stdout through bash); anything else runs in bash, with `sexpgpu` on PATH."""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Optional, Union

REPO = Path(__file__).resolve().parents[1]

# why a block may stay unrun; every skip marker names one of these
SKIP_CATEGORIES = {
    "gpu": "needs an NVIDIA GPU and CuPy",
    "cloud": "needs a Ray cluster, an S3 bucket or cloud credentials",
    "install": "installs packages or needs a tool the test extra does not install",
    "interactive": "needs a person at a moment: a Ctrl-C, an edit while `watch` runs",
    "timing": "its output is this machine's speed (a benchmark), or it runs for minutes",
}

DIRECTIVE = re.compile(r"^<!--\s*console-test:\s*(\w+)\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")
DEFAULT_FOLDER = "/tmp/demo"
COMMAND_TIMEOUT_S = 300


@dataclass
class Command:
    text: str
    expected: list[str]
    line: int  # 1-based line of the `$ ` line on the page


@dataclass
class Block:
    line: int
    commands: list[Command]
    skip: Optional[tuple[str, str]] = None  # (category, why)
    cats: list[str] = field(default_factory=list)  # files the block's `$ cat FILE` shows, written first


@dataclass
class WriteFile:
    name: str
    text: str
    line: int


@dataclass
class Copy:
    source: str
    dest: str
    line: int


@dataclass
class Shell:
    command: str
    line: int


Step = Union[Block, WriteFile, Copy, Shell]


@dataclass
class Page:
    path: Path
    folder: str = DEFAULT_FOLDER
    steps: list[Step] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # malformed directives

    @property
    def blocks(self) -> list[Block]:
        return [s for s in self.steps if isinstance(s, Block)]


def parse_console(text: str, first_line: int) -> list[Command]:
    """The commands of a console block: each `$ ` line and the output lines after it."""
    commands: list[Command] = []
    for offset, line in enumerate(text.splitlines()):
        if line.startswith("$ "):
            commands.append(Command(line[2:], [], first_line + offset))
        elif commands:
            commands[-1].expected.append(line)
    return commands


def parse_page(path: Path) -> Page:
    """PATH's folder, setup directives and console blocks, in page order."""
    page = Page(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    pending_file: Optional[tuple[str, int]] = None
    pending_skip: Optional[tuple[str, str, int]] = None
    pending_cats: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = DIRECTIVE.match(line)
        fence = FENCE.match(line)
        if directive:
            verb, rest = directive.group(1), directive.group(2)
            where = f"{path.name}:{i + 1}"
            if verb == "folder" and rest:
                page.folder = rest
            elif verb == "file" and rest:
                pending_file = (rest, i + 1)
            elif verb == "copy" and rest:
                parts = rest.split()
                page.steps.append(Copy(parts[0], parts[1] if len(parts) > 1 else Path(parts[0]).name, i + 1))
            elif verb == "cat" and rest:
                pending_cats.append(rest)
            elif verb == "sh" and rest:
                page.steps.append(Shell(rest, i + 1))
            elif verb == "skip":
                category, _, why = rest.partition(":")
                category = category.strip()
                if category not in SKIP_CATEGORIES:
                    page.errors.append(f"{where}: skip category {category!r} is not one of {sorted(SKIP_CATEGORIES)}")
                if not why.strip():
                    page.errors.append(f"{where}: a skip says why: <!-- console-test: skip {category or 'gpu'}: WHY -->")
                pending_skip = (category, why.strip(), i + 1)
            else:
                page.errors.append(f"{where}: unknown console-test directive {line.strip()!r}")
            i += 1
            continue
        if fence and fence.group(1):
            lang, start = fence.group(1), i + 1
            end = start
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            body = "\n".join(lines[start:end]) + "\n"
            if pending_file is not None:
                page.steps.append(WriteFile(pending_file[0], body, pending_file[1]))
                pending_file = None
            if lang == "console":
                skip = None
                if pending_skip is not None:
                    skip = (pending_skip[0], pending_skip[1])
                    pending_skip = None
                commands = parse_console(body, start + 1)
                if skip is None and not commands:
                    page.errors.append(f"{path.name}:{start}: a console block without `$ ` commands must carry a skip marker")
                for name in pending_cats:
                    if not any(c.text == f"cat {name}" for c in commands):
                        page.errors.append(f"{path.name}:{start}: `cat {name}` directive, but the block has no `$ cat {name}`")
                page.steps.append(Block(start, commands, skip, pending_cats))
                pending_cats = []
            elif pending_skip is not None or pending_cats:
                page.errors.append(f"{path.name}:{start}: a skip or cat directive must come just before a console block")
                pending_skip, pending_cats = None, []
            i = end + 1
            continue
        i += 1
    if pending_file is not None:
        page.errors.append(f"{path.name}:{pending_file[1]}: a file directive must come just before a fenced block")
    return page


# ---- comparing output ----------------------------------------------------------------

NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
UNIT = r"(?:ms|s|KiB|MiB|GiB)?"  # a time or a size may carry its unit: step_time=3s, memory=61.6MiB
# values that differ on every run: compared by their shape, not their text
SHAPES: list[tuple[str, str]] = [
    (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z", r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z"),
    (r"\b\d{4}-\d\d-\d\d\b", r"\d{4}-\d\d-\d\d"),
    (r"\b\d\d:\d\d:\d\d\b", r"\d\d:\d\d:\d\d"),
    (r"\b\d+(?:\.\d+)?(?:ms|s)\b", r"\d+(?:\.\d+)?(?:ms|s)"),
    (r"\bpid \d+", r"pid \d+"),
    # a number under a key that names a time or a rate: "seconds", "step_time", "*_s"
    (r"(?:\"(?:seconds|step_time|memory|\w+_s)\":\s*|\b(?:seconds|step_time|memory|\w+_s)=)" + NUMBER + UNIT,
     r"(?:\"(?:seconds|step_time|memory|\w+_s)\":\s*|\b(?:seconds|step_time|memory|\w+_s)=)" + NUMBER + UNIT),
]
SHAPE = re.compile("|".join(f"({source})" for source, _ in SHAPES))


# a page's number of this many significant digits or more matches a printed number within
# NEAR of it (relative): f32 results differ in their last bits between BLAS kernels (OpenBLAS
# picks them by CPU), and training carries the difference into later digits
NEAR_DIGITS = 6
NEAR = 1e-4
DECIMAL = re.compile(r"(?<![\w.])-?\d+\.\d+(?:[eE][-+]?\d+)?(?![\w.])")


def significant_digits(number: str) -> int:
    mantissa = re.split(r"[eE]", number)[0].lstrip("-").replace(".", "").lstrip("0")
    return len(mantissa)


@dataclass(frozen=True)
class LinePattern:
    regex: re.Pattern[str]
    near: tuple[float, ...]  # the page's value for each of the regex's groups

    def matches(self, actual: str) -> bool:
        found = self.regex.fullmatch(actual)
        if found is None:
            return False
        return all(abs(float(got) - want) <= NEAR * abs(want) for got, want in zip(found.groups(), self.near))


def literal_part(text: str, near: list[float]) -> str:
    """TEXT (page text with no `...` and no SHAPE value) as a regex: a number of
    NEAR_DIGITS significant digits or more becomes a group, its value appended to NEAR."""
    parts: list[str] = []
    at = 0
    for match in DECIMAL.finditer(text):
        if significant_digits(match.group(0)) < NEAR_DIGITS:
            continue
        parts.append(re.escape(text[at:match.start()]) + f"({NUMBER})")
        near.append(float(match.group(0)))
        at = match.end()
    return "".join(parts) + re.escape(text[at:])


@lru_cache(maxsize=None)
def line_pattern(expected: str) -> LinePattern:
    """EXPECTED as a pattern: `...` matches any text, each value of a SHAPE matches any
    value of that shape, and a number of NEAR_DIGITS significant digits or more any number
    within NEAR of it; everything else is literal."""
    parts: list[str] = []
    near: list[float] = []
    for k, literal in enumerate(expected.split("...")):
        if k:
            parts.append(".*?")
        at = 0
        for match in SHAPE.finditer(literal):
            parts.append(literal_part(literal[at:match.start()], near))
            group = next(g for g in range(len(SHAPES)) if match.group(g + 1) is not None)
            key = re.match(r"(\"\w+\":\s*|\w+=)", match.group(0)) if group == len(SHAPES) - 1 else None
            parts.append(re.escape(key.group(1)) + NUMBER + UNIT if key else SHAPES[group][1])
            at = match.end()
        parts.append(literal_part(literal[at:], near))
    return LinePattern(re.compile("".join(parts)), tuple(near))


def trimmed(lines: list[str]) -> list[str]:
    lines = [line.rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def lines_match(expected: list[str], actual: list[str]) -> bool:
    """Whether ACTUAL matches EXPECTED line by line; an expected line of only `...` matches
    any number of lines (none included)."""
    expected, actual = trimmed(expected), trimmed(actual)

    @lru_cache(maxsize=None)
    def match(i: int, j: int) -> bool:
        if i == len(expected):
            return j == len(actual)
        if expected[i].strip() == "...":
            return any(match(i + 1, k) for k in range(j, len(actual) + 1))
        return j < len(actual) and line_pattern(expected[i]).matches(actual[j]) and match(i + 1, j + 1)

    return match(0, 0)


# ---- running commands ------------------------------------------------------------------

@dataclass
class Words:
    words: list[str]  # shell words with quotes removed
    plain: list[bool]  # False where the word has an unquoted shell metacharacter


SHELL_META = set("$`;&<>()*?[]{}~!\\")


def shell_words(text: str) -> Optional[Words]:
    """TEXT split as a shell would (quotes removed), with each word marked plain or not;
    None where a quote is unclosed."""
    words: list[str] = []
    plain: list[bool] = []
    word, is_plain, in_word = "", True, False
    i = 0
    while i < len(text):
        c = text[i]
        if c in " \t":
            if in_word:
                words.append(word)
                plain.append(is_plain)
                word, is_plain, in_word = "", True, False
        elif c in "'\"":
            end = text.find(c, i + 1)
            if end < 0:
                return None
            inner = text[i + 1:end]
            if c == '"' and any(m in inner for m in "$`\\"):
                is_plain = False
            word += inner
            in_word = True
            i = end
        else:
            if c in SHELL_META:
                is_plain = False
            word += c
            in_word = True
        i += 1
    if in_word:
        words.append(word)
        plain.append(is_plain)
    return Words(words, plain)


def strip_comment(text: str) -> str:
    """TEXT without a trailing unquoted `# comment`."""
    quote = None
    for i, c in enumerate(text):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip()
    return text


def split_pipe(text: str) -> tuple[str, Optional[str]]:
    """TEXT split at its first unquoted `|` (not `||`)."""
    quote = None
    for i, c in enumerate(text):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "|" and text[i + 1:i + 2] != "|" and text[i - 1:i] != "|":
            return text[:i].rstrip(), text[i + 1:].strip()
    return text, None


@dataclass
class InProcess:
    env: dict[str, str]
    argv: list[str]
    stderr: bool  # False: 2>/dev/null
    stdout: bool  # False: >/dev/null


ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def in_process(head: str) -> Optional[InProcess]:
    """HEAD as a call of sexpgpu's main in this process, or None when it needs a shell."""
    parsed = shell_words(head)
    if parsed is None:
        return None
    words, plain = parsed.words, parsed.plain
    env: dict[str, str] = {}
    k = 0
    while k < len(words) and plain[k] and ASSIGNMENT.match(words[k]):
        name, _, value = words[k].partition("=")
        env[name] = value
        k += 1
    if k >= len(words) or words[k] != "sexpgpu":
        return None
    argv: list[str] = []
    stderr = stdout = True
    rest = words[k + 1:]
    rest_plain = plain[k + 1:]
    j = 0
    while j < len(rest):
        word = rest[j]
        if word in ("2>/dev/null", ">/dev/null", "1>/dev/null"):
            stderr = stderr and word != "2>/dev/null"
            stdout = stdout and word == "2>/dev/null"
        elif word in (">", "2>") and j + 1 < len(rest) and rest[j + 1] == "/dev/null":
            stderr = stderr and word != "2>"
            stdout = stdout and word == "2>"
            j += 1
        elif not rest_plain[j]:
            return None
        else:
            argv.append(word)
        j += 1
    return InProcess(env, argv, stderr, stdout)


@lru_cache(maxsize=None)
def wrapper_bin() -> Path:
    """A folder with a `sexpgpu` script that runs this checkout with this Python."""
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"sexpgpu-doc-bin-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "sexpgpu"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" -m sexpgpu "$@"\n')
    script.chmod(0o755)
    return folder


# the variables a reader's shell would not have set; each page starts without them
DROPPED = re.compile(r"^(SEXPGPU_|AWS_|OPENBLAS_NUM_THREADS$|OMP_NUM_THREADS$|MKL_NUM_THREADS$|PYTEST_)")


def page_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not DROPPED.match(k)}
    env.update(NO_COLOR="1", COLUMNS="100", PATH=f"{wrapper_bin()}{os.pathsep}{env.get('PATH', '')}")
    # no AWS credentials from files or an instance role either: a reader's machine has none
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true")
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO)
    return env


@contextlib.contextmanager
def environment(env: dict[str, str], cwd: Path) -> Iterator[None]:
    saved, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved)


def run_in_process(call: InProcess, env: dict[str, str], cwd: Path) -> tuple[int, str]:
    from sexpgpu.cli.main import main

    merged, dropped = io.StringIO(), io.StringIO()
    saved_stdin = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        with environment({**env, **call.env}, cwd), \
                contextlib.redirect_stdout(merged if call.stdout else dropped), \
                contextlib.redirect_stderr(merged if call.stderr else dropped):
            rc = main(list(call.argv))
    finally:
        sys.stdin = saved_stdin
    return rc, merged.getvalue()


def run_in_shell(command: str, env: dict[str, str], cwd: Path, last_rc: int, stdin: Optional[str] = None) -> tuple[int, str]:
    done = subprocess.run(["bash", "-c", f"(exit {last_rc}); {command}"], cwd=cwd, env=env, input=stdin or "",
                          capture_output=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=COMMAND_TIMEOUT_S)
    return done.returncode, done.stdout


def run_command(text: str, env: dict[str, str], cwd: Path, last_rc: int) -> tuple[int, str]:
    """TEXT's exit status and what it printed (stdout and stderr, in order)."""
    text = strip_comment(text)
    head, tail = split_pipe(text)
    call = in_process(head)
    if call is None:
        return run_in_shell(text, env, cwd, last_rc)
    rc, out = run_in_process(call, env, cwd)
    if tail is None:
        return rc, out
    return run_in_shell(tail, env, cwd, 0, stdin=out)


# ---- a page -------------------------------------------------------------------------------

@dataclass
class Mismatch:
    page: str
    line: int  # the command's line on the page
    command: str
    expected: list[str]
    actual: list[str]

    def pairs(self) -> list[tuple[int, int]]:
        """The longest alignment of expected lines with printed lines that match them."""
        expected, actual = trimmed(self.expected), trimmed(self.actual)
        n, m = len(expected), len(actual)
        ok = [[line_pattern(e).matches(a) for a in actual] for e in expected]
        best = [[0] * (m + 1) for _ in range(n + 1)]
        for i in range(n - 1, -1, -1):
            for j in range(m - 1, -1, -1):
                best[i][j] = max(best[i + 1][j], best[i][j + 1], best[i + 1][j + 1] + 1 if ok[i][j] else 0)
        out, i, j = [], 0, 0
        while i < n and j < m:
            if ok[i][j] and best[i][j] == best[i + 1][j + 1] + 1:
                out.append((i, j))
                i, j = i + 1, j + 1
            elif best[i + 1][j] >= best[i][j + 1]:
                i += 1
            else:
                j += 1
        return out

    def render(self) -> str:
        """A diff of the page against what was printed, where a page line that matches
        (a time of another value, a `...`) shows as the printed line."""
        expected, actual = trimmed(self.expected), trimmed(self.actual)
        view = list(expected)
        for i, j in self.pairs():
            view[i] = actual[j]
        diff = difflib.unified_diff(view, actual, "page", "printed", lineterm="", n=2)
        return f"{self.page}:{self.line}: $ {self.command}\n" + "\n".join(diff)


@dataclass
class PageResult:
    problems: list[str]  # malformed directives, failed setup commands
    mismatches: list[Mismatch]
    commands: int
    seconds: float

    def report(self) -> list[str]:
        return self.problems + [m.render() for m in self.mismatches]


# the compiled CPU device's line when it compiles a program this machine has not cached: it
# shows or not depending on what ran before, so pages leave it out and it is not compared
COMPILE_NOTICE = re.compile(r"^cpu: \S+: compiled \d+ kernels? in [\d.]+ s \(cached on disk for the next run\)$")


def shown(text: str, folder: Path, page_folder: str) -> str:
    """TEXT as the page shows it: the folder as the page names it, the home folder as ~,
    this machine's name as vm."""
    for real in {str(folder.resolve()), str(folder)}:
        text = text.replace(real, page_folder)
    home = str(Path.home())
    if home not in ("/", ""):
        text = re.sub(re.escape(home) + r"(?=/|\b)", "~", text)
    host = socket.gethostname()
    if host and host != "vm":
        text = re.sub(rf"\b{re.escape(host)}\b", "vm", text)
    return text


# absolute paths a command could write to outside the page's fresh folder
OUTSIDE = re.compile(r"(?<![\w.~])/(?:tmp|home|work|root|var|opt|srv|mnt)/[^\s'\"]*")


def prepare_folder(folder: Path) -> None:
    """A reader's checkout: a project root (`.git`) with the examples where the pages expect
    them."""
    (folder / ".git").mkdir()
    shutil.copytree(REPO / "examples", folder / "examples", ignore=shutil.ignore_patterns("__pycache__"))


def run_page(path: Path, folder: Path) -> PageResult:
    page = parse_page(path)
    if page.errors:
        return PageResult(page.errors, [], 0, 0.0)
    prepare_folder(folder)
    env = page_environment()
    problems: list[str] = []
    mismatches: list[Mismatch] = []
    count, last_rc = 0, 0
    start = time.monotonic()

    def in_folder(text: str) -> str:
        return text.replace(page.folder, str(folder))

    for step in page.steps:
        if isinstance(step, WriteFile):
            (folder / step.name).parent.mkdir(parents=True, exist_ok=True)
            (folder / step.name).write_text(step.text, encoding="utf-8")
        elif isinstance(step, Copy):
            source = REPO / step.source
            (folder / step.dest).parent.mkdir(parents=True, exist_ok=True)
            if "#" in step.source:  # PAGE.md#NAME: the file another page's `file NAME` block defines
                other, _, name = step.source.partition("#")
                made = [s for s in parse_page(REPO / other).steps if isinstance(s, WriteFile) and s.name == name]
                if not made:
                    problems.append(f"{path.name}:{step.line}: {other} defines no file {name}")
                    continue
                (folder / step.dest).write_text(made[0].text, encoding="utf-8")
            elif source.is_dir():
                shutil.copytree(source, folder / step.dest, dirs_exist_ok=True)
            else:
                shutil.copyfile(source, folder / step.dest)
        elif isinstance(step, Shell):
            rc, out = run_in_shell(in_folder(step.command), env, folder, 0)
            if rc != 0:
                problems.append(f"{path.name}:{step.line}: setup `{step.command}` exited {rc}:\n{out}")
        elif step.skip is None:
            for name in step.cats:
                shown_text = next(c for c in step.commands if c.text == f"cat {name}").expected
                (folder / name).write_text("\n".join(trimmed(shown_text)) + "\n", encoding="utf-8")
            for command in step.commands:
                outside = [m for m in OUTSIDE.findall(command.text) if not m.startswith(page.folder)]
                if outside:
                    problems.append(f"{path.name}:{command.line}: `{outside[0]}` is outside the page's folder {page.folder}: "
                                    "a command may write only there (use a relative path, or the folder's)")
                    continue
                count += 1
                last_rc, out = run_command(in_folder(command.text), env, folder, last_rc)
                actual = [line for line in shown(out, folder, page.folder).splitlines() if not COMPILE_NOTICE.match(line)]
                if not lines_match(command.expected, actual):
                    mismatches.append(Mismatch(path.name, command.line, command.text, command.expected, actual))
    return PageResult(problems, mismatches, count, time.monotonic() - start)


# ---- updating a page ----------------------------------------------------------------------

def updated_output(mismatch: Mismatch) -> list[str]:
    """What the page should show for a command that printed something else: the printed
    lines, except that a printed line the page's own line matches keeps the page's line (its
    `...` and its times stay as written)."""
    expected, actual = trimmed(mismatch.expected), trimmed(mismatch.actual)
    kept = dict((j, i) for i, j in mismatch.pairs())
    return [expected[kept[j]] if j in kept else line for j, line in enumerate(actual)]


def update_page(path: Path, folder: Path) -> list[str]:
    """Run PATH in FOLDER and write into it what each mismatching command printed; returns
    the problems that no rewrite fixes (setup failures, malformed directives). The lead reads
    the diff: a value that changed is a change of behaviour to explain, not only to accept."""
    result = run_page(path, folder)
    lines = path.read_text(encoding="utf-8").splitlines()
    for mismatch in sorted(result.mismatches, key=lambda m: m.line, reverse=True):
        start = mismatch.line  # the `$ ` line is lines[start - 1]; its output follows
        end = start + len(trimmed(mismatch.expected))
        lines[start:end] = updated_output(mismatch)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return result.problems


if __name__ == "__main__":
    # python tests/doc_console.py --update docs/PAGE.md ...: rewrite the pages' outputs
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="run docs pages' console blocks; --update writes what they print into the pages")
    parser.add_argument("--update", action="store_true")
    parser.add_argument("pages", nargs="+", type=Path)
    args = parser.parse_args()
    failed = False
    for page_path in args.pages:
        with tempfile.TemporaryDirectory() as tmp:
            if args.update:
                problems = update_page(page_path.resolve(), Path(tmp))
            else:
                problems = run_page(page_path.resolve(), Path(tmp)).report()
        for problem in problems:
            print(problem, file=sys.stderr)
        failed = failed or bool(problems)
        print(f"{page_path}: {'updated' if args.update else 'checked'}, {len(problems)} problem(s)")
    sys.exit(1 if failed else 0)
