"""Docs that quote the code: the values they quote are the ones in force."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from autotuner.controller import RECENT_WINDOWS, SLO_HEADROOM, ControllerSettings
from autotuner.search_space import CONFIG

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def quoted_settings(text: str, names: set[str]) -> list[tuple[str, float]]:
    """Every "`name` (value" in `text` for a controller setting, value as the YAML would hold it
    ("15%" is 0.15, "60 s" is 60, "2x" is 2)."""
    found = []
    for name, number, unit in re.findall(r"`(\w+)` \((\d+(?:\.\d+)?)(%|x| s)?", text):
        if name in names:
            found.append((name, float(number) / (100 if unit == "%" else 1)))
    return found


def test_tuning_doc_quotes_the_settings_in_force():
    """docs/tuning.md quotes the controller settings in force: autotuner/controller_settings.py's
    defaults as configs/tuning.yaml overrides them (it overrides none by default)."""
    in_force = ControllerSettings.load(CONFIG)
    names = {f.name for f in fields(ControllerSettings)}
    text = (DOCS / "tuning.md").read_text()
    quoted = quoted_settings(text, names)
    assert len({name for name, _ in quoted}) >= 12, quoted       # the test reads what the doc says
    wrong = [(name, value, getattr(in_force, name)) for name, value in quoted
             if value != getattr(in_force, name)]
    assert not wrong, wrong
    assert set(yaml.safe_load(CONFIG.read_text()).get("controller", {})) <= names
    assert f"latest {RECENT_WINDOWS} windows" in text and f"within {SLO_HEADROOM:.0%}" in text


sys.path.insert(0, str(ROOT / "benchmarks"))     # render_docs and the scripts it loads import by name
import render_docs  # noqa: E402
import results_file  # noqa: E402

BLOCKS = render_docs.all_blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_a_rendered_block_is_the_rendering_of_its_results_files(block: render_docs.Block):
    """Every `<!-- rendered: ... -->` block of docs/*.md and README.md is what its renderer makes of its
    results files: a number edited by hand, or a results file re-measured without
    `benchmarks/render_docs.py`, fails here."""
    assert block.body == render_docs.render(block), f"stale: run .venv/bin/python benchmarks/render_docs.py ({block})"


def test_the_docs_render_their_tables_from_results_files():
    """The tables that were checked one by one before stay rendered blocks: docs/tuning.md's zero-config
    matrix, docs/llama_cpp.md's side-by-side (one per machine) and README's Performance section."""
    rendered = {(b.doc.name, s) for b in BLOCKS for s in b.sources}
    expected = {("tuning.md", "docs/results/zero_config.jsonl"), ("tuning.md", "docs/results/wrong_start_live.json"),
                ("README.md", "docs/results/zero_config.jsonl"),
                *(("llama_cpp.md", f"docs/results/llama_cpp_single_stream{s}.json")
                  for s in ("", "_xeon", "_gemma3_xeon"))}
    assert expected <= rendered, expected - rendered
    rows = results_file.read_lines(ROOT / "docs" / "results" / "zero_config.jsonl")
    assert rows and all(r["cells"] for r in rows)


@pytest.mark.parametrize("source", sorted({s for b in BLOCKS for s in b.sources}))
def test_a_rendered_results_file_says_where_it_came_from(source: str):
    """Each results file a doc renders carries results_file's meta (a field nobody recorded says so)."""
    path = ROOT / source
    rows = results_file.read_lines(path) if path.suffix == ".jsonl" else [results_file.read(path)]
    for meta in (r["meta"] for r in rows):
        assert {"machine", "commit", "date_utc", "command"} <= set(meta), source
        assert {"cpu_model", "isa", "cores"} <= set(meta["machine"]), source


def test_the_readme_layout_names_every_top_level_folder():
    """README's Layout section has a line for each top-level folder git tracks."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folders = {line.split("/")[0] for line in tracked.splitlines() if "/" in line}
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^([\w.-]+)/", layout, re.M))
    assert folders <= named, sorted(folders - named)
