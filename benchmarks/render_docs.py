"""Render every table in docs/*.md and README.md that quotes a results file, from that file.

A rendered block in a doc is delimited by

    <!-- rendered: docs/results/A.json[, docs/results/B.json ...] by benchmarks/SCRIPT.py[:FUNCTION] -->
    ...
    <!-- end rendered -->

and its text is FUNCTION (default `render_doc`) of SCRIPT called with the results files' paths. The
benchmark that writes a results file renders it, so a figure has one source: the file.
tests/test_docs.py fails when a block and its rendering differ (a number edited by hand, or a results
file re-measured without re-rendering). It also writes docs/results/README.md, the index of every results
file: the page that renders or cites it, the script and command that wrote it, its machine and commit.

    .venv/bin/python benchmarks/render_docs.py            # rewrite every stale block
    .venv/bin/python benchmarks/render_docs.py --check    # list stale blocks, exit 1 if any
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
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


RESULTS = ROOT / "docs" / "results"
MODELS_DIR = re.compile(r"^\S*/\.cache/autotuned-models/")    # where ../shared/models/get-model.sh puts GGUF files
INDEX = RESULTS / "README.md"


def docs() -> list[Path]:
    """README.md and every page under docs/ but the results index."""
    return sorted(p for p in (ROOT / "docs").rglob("*.md") if p != INDEX) + [ROOT / "README.md"]


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


def results_files() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file() and p != INDEX)


def recorded_meta(path: Path) -> dict | None:
    """The results file's meta (the first line's, for a .jsonl); None for a file that holds none (a plot)."""
    if path.suffix not in (".json", ".jsonl"):
        return None
    import results_file
    row = results_file.read_lines(path)[0] if path.suffix == ".jsonl" else results_file.read(path)
    return row.get("meta")


def citing_pages(path: Path, blocks: list[Block]) -> list[str]:
    """The pages that render `path` in a block, or name it."""
    name = str(path.relative_to(ROOT))
    pages = {b.doc for b in blocks if name in b.sources}
    pages |= {doc for doc in docs() if name in doc.read_text() or str(path.relative_to(RESULTS)) in doc.read_text()}
    return sorted(os.path.relpath(p, INDEX.parent) for p in pages)


def reproducing_command(command: str | list[str], path: Path) -> str:
    """The recorded command with its scratch output paths pointed into the tree (the one named like the
    results file at the file itself, any other under out/) and the model folder as $M."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    fixed = [str(path.relative_to(ROOT)) if a.startswith("/tmp/") and Path(a).name == path.name
             else f"out/{Path(a).name}" if a.startswith("/tmp/") else MODELS_DIR.sub("$M/", a) for a in argv]
    return " ".join(fixed)


def index_row(path: Path, blocks: list[Block]) -> str:
    meta = recorded_meta(path) or {}
    machine = meta.get("machine", {})
    where = f"{machine.get('cpu_model', '')}, {machine.get('cores', '?')} cores" if machine else ""
    pages = ", ".join(f"[{Path(p).name}]({p})" for p in citing_pages(path, blocks)) or "none"
    command = reproducing_command(meta.get("command", ""), path)
    commit = short_commit(str(meta.get("commit", "")))
    return (f"| `{path.relative_to(RESULTS)}` | {pages} | {where} | {commit} | "
            f"{f'`{command}`' if command else ''} |")


def short_commit(commit: str) -> str:
    """A 40-digit hash to its first 12 digits, keeping a suffix such as `-dirty`."""
    return re.sub(r"^([0-9a-f]{12})[0-9a-f]{28}", r"\1", commit)


def render_provenance(paths: list[Path]) -> str:
    """Where each results file's figures came from (machine, commit, date) and the command that
    reproduces it (a .jsonl's first row's: each row records its own): the lines under a figure in
    docs/performance.md."""
    lines = []
    for path in paths:
        meta = recorded_meta(path) or {}
        machine = meta.get("machine", {})
        isa = machine.get("isa", "unrecorded")
        commit = meta.get("commit", "unrecorded")
        if commit == "unrecorded" and "committed_in" in meta:
            commit = f"unrecorded (the file was committed in {meta['committed_in'][:12]})"
        rows = f" ({len(path.read_text().splitlines())} rows, the first's command)" if path.suffix == ".jsonl" else ""
        lines.append(f"- `{path.relative_to(RESULTS)}`{rows}: {machine.get('cpu_model', 'unrecorded')}, "
                     f"{machine.get('cores', '?')} cores, {' '.join(isa) if isinstance(isa, list) else isa}; "
                     f"commit {short_commit(commit)}, {meta.get('date_utc', 'unrecorded')}: "
                     f"`{reproducing_command(meta.get('command', ''), path)}`")
    return "\n".join(lines)


def render_index() -> str:
    blocks = all_blocks()
    rows = [index_row(p, blocks) for p in results_files()]
    return "\n".join([
        "# Results files",
        "",
        "Every figure in the docs is rendered from one of these files by the script that wrote it",
        "(`benchmarks/render_docs.py`, which also writes this index). Each JSON file's `meta` records the",
        "machine, the commit, the date and the exact command; below, the command's scratch output paths",
        "point into the tree (the results file itself, or `out/`).",
        "",
        "| file | rendered or cited on | machine | commit | command |",
        "|---|---|---|---|---|",
        *rows]) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="only list the stale blocks; exit 1 if any")
    args = p.parse_args()
    stale = [b for b in all_blocks() if b.body != render(b)] if args.check else \
        [b for path in docs() for b in rewrite(path)]
    for b in stale:
        print(f"{'stale' if args.check else 're-rendered'}: {b}")
    index_stale = not INDEX.exists() or INDEX.read_text() != render_index()
    if index_stale and not args.check:
        INDEX.write_text(render_index())
    if index_stale:
        print(f"{'stale' if args.check else 're-rendered'}: {INDEX.relative_to(ROOT)}")
    sys.exit(1 if (stale or index_stale) and args.check else 0)


if __name__ == "__main__":
    main()
