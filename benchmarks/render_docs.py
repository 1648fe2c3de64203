"""Render every table in docs/*.md and README.md that quotes a results file, from that file.

A rendered block in a doc is delimited by

    <!-- rendered: docs/results/A.json[, docs/results/B.json ...] by benchmarks/SCRIPT.py[:FUNCTION] -->
    ...
    <!-- end rendered -->

and its text is FUNCTION (default `render_doc`) of SCRIPT called with the results files' paths. The
benchmark that writes a results file renders it, so a figure has one source: the file.
tests/test_docs.py fails when a block and its rendering differ (a number edited by hand, or a results
file re-measured without re-rendering).

    .venv/bin/python benchmarks/render_docs.py            # rewrite every stale block
    .venv/bin/python benchmarks/render_docs.py --check    # list stale blocks, exit 1 if any
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- rendered: (?P<sources>.+?) by (?P<renderer>\S+?) -->\n(?P<body>.*?)\n?<!-- end rendered -->",
                   re.S)


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int                      # of the opening marker, 1-based
    sources: tuple[str, ...]       # results files, relative to the repository root
    renderer: str                  # benchmarks/SCRIPT.py[:FUNCTION]
    body: str

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line} ({', '.join(Path(s).name for s in self.sources)})"


def docs() -> list[Path]:
    """README.md and every page under docs/ (the results index included)."""
    return sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def find_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [Block(path, text.count("\n", 0, m.start()) + 1, tuple(s.strip() for s in m["sources"].split(",")),
                  m["renderer"], m["body"]) for m in BLOCK.finditer(text)]


def all_blocks() -> list[Block]:
    return [b for path in docs() for b in find_blocks(path)]


@cache
def load_script(path: str) -> ModuleType:
    """A benchmark script as a module (benchmarks/ is not a package; the scripts import their
    neighbours by name, so that folder goes on sys.path)."""
    bench = str(ROOT / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    file = ROOT / path
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module       # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def render(block: Block) -> str:
    script, _, function = block.renderer.partition(":")
    return getattr(load_script(script), function or "render_doc")([ROOT / s for s in block.sources]).rstrip("\n")


def rewrite(path: Path) -> list[Block]:
    """Re-render `path`'s blocks in place; the stale ones."""
    stale = [b for b in find_blocks(path) if b.body != render(b)]
    if stale:
        fresh = iter([render(b) for b in find_blocks(path)])
        path.write_text(BLOCK.sub(lambda m: f"<!-- rendered: {m['sources']} by {m['renderer']} -->\n{next(fresh)}\n"
                                            "<!-- end rendered -->", path.read_text()))
    return stale


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="only list the stale blocks; exit 1 if any")
    args = p.parse_args()
    stale = [b for b in all_blocks() if b.body != render(b)] if args.check else \
        [b for path in docs() for b in rewrite(path)]
    for b in stale:
        print(f"{'stale' if args.check else 're-rendered'}: {b}")
    sys.exit(1 if stale and args.check else 0)


if __name__ == "__main__":
    main()
