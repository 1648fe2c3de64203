"""Docs that quote the code: the values they quote are the ones in force."""

from __future__ import annotations

import importlib.util
import re
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


def test_tuning_doc_quotes_the_settings_in_configs_tuning_yaml():
    """docs/tuning.md quotes the controller settings configs/tuning.yaml sets, not the dataclass
    defaults that only apply when the file leaves a setting out."""
    in_force = ControllerSettings.load(CONFIG)
    names = {f.name for f in fields(ControllerSettings)}
    text = (DOCS / "tuning.md").read_text()
    quoted = quoted_settings(text, names)
    assert len({name for name, _ in quoted}) >= 12, quoted       # the test reads what the doc says
    wrong = [(name, value, getattr(in_force, name)) for name, value in quoted
             if value != getattr(in_force, name)]
    assert not wrong, wrong
    assert set(yaml.safe_load(CONFIG.read_text())["controller"]) <= names
    assert f"latest {RECENT_WINDOWS} windows" in text and f"within {SLO_HEADROOM:.0%}" in text


def test_the_zero_config_tables_are_rendered_from_their_results_file():
    """docs/tuning.md's zero-config tables are benchmarks/render_zero_config.py's rendering of
    docs/results/zero_config.jsonl and wrong_start_live.json: a number edited by hand, or a results
    file re-run without re-rendering, fails here."""
    render = load_module(ROOT / "benchmarks" / "render_zero_config.py")
    rows = render.load()
    assert rows and all(r["cells"] for r in rows)
    assert render.block((DOCS / "tuning.md").read_text()) == render.render_all()


@pytest.mark.parametrize("results", ["llama_cpp_single_stream.json", "llama_cpp_single_stream_xeon.json",
                                     "llama_cpp_single_stream_gemma3_xeon.json"])
def test_the_llama_cpp_table_is_rendered_from_its_results_file(results: str):
    """docs/llama_cpp.md's side-by-side tables (one per machine) are benchmarks/llama_cpp_single_stream.py's
    rendering of their results files."""
    sys.path.insert(0, str(ROOT / "benchmarks"))     # the script imports bench_common by name
    try:
        bench = load_module(ROOT / "benchmarks" / "llama_cpp_single_stream.py")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    table = bench.markdown_table(bench.load_results(str(DOCS / "results" / results)))
    assert table.count("\n") >= 2 and table in (DOCS / "llama_cpp.md").read_text()


def load_module(path: Path):
    """A benchmark script as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module       # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
