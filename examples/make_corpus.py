"""Writes examples/data/stdlib-docstrings.txt: the docstrings of a fixed list of Python
standard-library modules (and their public functions and classes), as plain ASCII text.

Provenance: the text is the documentation that ships inside CPython (PSF License),
extracted with inspect.getdoc from Python 3.11. Characters outside printable ASCII and
newline are dropped, so the character vocabulary has at most 96 symbols (what
examples/charlm.lisp declares). Run it again to regenerate; the output is deterministic
for a given Python version.

    python examples/make_corpus.py
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

MODULES = [
    "abc", "argparse", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "enum", "fractions", "functools", "glob", "hashlib", "heapq", "itertools",
    "json", "logging", "math", "operator", "os", "pathlib", "pickle", "pprint", "queue", "random", "re", "shutil",
    "statistics", "string", "struct", "tempfile", "textwrap", "threading", "typing", "unittest", "uuid", "zipfile",
]
ALLOWED = set(chr(c) for c in range(32, 127)) | {"\n"}


def docs(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    out = [inspect.getdoc(module) or ""]
    for name in sorted(getattr(module, "__all__", None) or dir(module)):
        if name.startswith("_"):
            continue
        obj = getattr(module, name, None)
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", None) == module_name:
            doc = inspect.getdoc(obj)
            if doc:
                out.append(doc)
    return out


def main() -> None:
    chunks: list[str] = []
    for name in MODULES:
        chunks.extend(d for d in docs(name) if d)
    text = "\n\n".join(chunks)
    text = "".join(c for c in text.replace("\t", "    ") if c in ALLOWED)
    target = Path(__file__).parent / "data" / "stdlib-docstrings.txt"
    target.parent.mkdir(exist_ok=True)
    target.write_text(text + "\n", encoding="ascii")
    print(f"{target}: {len(text):,} characters, {len(set(text))} distinct")


if __name__ == "__main__":
    main()
