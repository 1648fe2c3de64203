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
    """The measured tables stay rendered blocks: the zero-config matrix and the live runs in docs/tuning.md,
    the side-by-side runs per machine in docs/llama_cpp.md, the fleet day, the H100 steps, prefix caching,
    and every headline claim in docs/performance.md with the provenance of its files."""
    rendered = {(b.doc.name, s) for b in BLOCKS for s in b.sources}
    headline = ["zero_config.jsonl", "wrong_start_live.json", "wrong_start_live_zen5.json", "soak.json",
                "llama_cpp_single_stream_xeon.json", "llama_cpp_single_stream_zen5.json", "prefix_caching.json",
                "fleet_day_86400s_chat.json", "gpu_h100_step_graphs.json", "resident_memory_xeon.json"]
    expected = {("tuning.md", "docs/results/zero_config.jsonl"), ("tuning.md", "docs/results/wrong_start_live.json"),
                ("tuning.md", "docs/results/wrong_start_live_zen5.json"),
                *(("llama_cpp.md", f"docs/results/llama_cpp_single_stream{s}.json")
                  for s in ("_xeon", "_xeon_native", "_gemma3_xeon", "_zen5", "_zen5_4bit")),
                ("cluster.md", "docs/results/fleet_day_86400s_chat.json"), ("gpu.md", "docs/results/gpu_h100_step_graphs.json"),
                ("prefix_caching.md", "docs/results/prefix_caching.json"),
                *(("performance.md", f"docs/results/{name}") for name in headline)}
    assert expected <= rendered, expected - rendered
    provenance = {s for b in BLOCKS if b.doc.name == "performance.md" and b.renderer.endswith(":render_provenance")
                  for s in b.sources}
    figures = {s for b in BLOCKS if b.doc.name == "performance.md" and not b.renderer.endswith(":render_provenance")
               for s in b.sources}
    assert figures == provenance, figures ^ provenance
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


# ---- the docs as a manual: links, commands, size, no history ----

import argparse  # noqa: E402
import shlex  # noqa: E402
from unittest.mock import patch  # noqa: E402

from serving.cli import build_parser  # noqa: E402

PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(p for p in DOCS.rglob("*.md"))])
GUIDES = sorted(p for p in DOCS.glob("*.md"))                  # docs/design/ and docs/results/ are not guides
DESIGN = sorted((DOCS / "design").glob("*.md"))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
HISTORY = re.compile(r"\bstops? [0-9]+|stop[0-9]+|/tmp/s[0-9]", re.I)
RETRACTION = re.compile(r"withdraw[n]", re.I)         # a note that a figure was taken back


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page."""
    text = FENCE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", page.read_text()))
            if not re.match(r"[a-z]+:", t)]                    # http:, https:, mailto:, file:


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_every_relative_link_resolves(page: Path):
    """Each relative link of README.md, CHANGELOG.md and docs/ names a file of the tree, and a `#section`
    a heading of that page."""
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(target)
    assert not broken, broken


def shell_lines(page: Path) -> list[str]:
    """The lines of a page's shell code (fenced shell blocks and 4-space indented blocks), continuations joined."""
    text = page.read_text()
    code = [body for lang, body in FENCE.findall(text) if lang in SHELL_FENCES]
    code += [m for m in re.findall(r"(?:^|\n\n)((?: {4}\S.*\n?)+)", FENCE.sub("", text))]
    return [line.strip() for block in code for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at |, &&, ;), comments and VAR=value prefixes dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:           # an unbalanced quote: not a shell line
        return []
    found, current = [], []
    for token in tokens + [";"]:
        if token in ("|", "||", "&&", ";", "&", "(", ")"):
            found.append(current)
            current = []
        elif current or not re.match(r"^[A-Z_][A-Z0-9_]*=", token):
            current.append(token)
    return [c for c in found if c]


def quoted_commands(pages: list[Path]) -> list[tuple[str, list[str]]]:
    """(page, argv) of every `autotuned-serve ...` and `python benchmarks/X.py ...` command the pages quote."""
    found = []
    for page in pages:
        for line in shell_lines(page):
            for argv in commands(line):
                if argv[0].endswith("autotuned-serve") or (
                        re.search(r"(^|/)python3?$", argv[0]) and len(argv) > 1 and argv[1].startswith("benchmarks/")):
                    found.append((relative(page), argv))
    return found


class Parsed(Exception):
    """Raised by the patched parse_args once a command line parsed."""


def parse_script_argv(script: str, argv: list[str]) -> None:
    """Parse `argv` with `script`'s own argument parser: its main() runs up to its parse_args, then stops."""
    source = (ROOT / script).read_text()
    if "argparse" not in source:
        assert not argv, f"{script} takes no arguments"
        return
    module = render_docs.load_script(script)
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise Parsed

    with patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop), \
            patch.object(sys, "argv", [script, *argv]), pytest.raises(Parsed):
        module.main()


QUOTED = quoted_commands(PAGES)


def test_the_docs_quote_commands():
    """The extraction below reads what the pages hold (a broken extraction would pass everything)."""
    assert sum(argv[0].endswith("autotuned-serve") for _, argv in QUOTED) >= 30
    assert sum(not argv[0].endswith("autotuned-serve") for _, argv in QUOTED) >= 10


@pytest.mark.parametrize("page,argv", QUOTED, ids=[f"{p}: {' '.join(a)[:80]}" for p, a in QUOTED])
def test_every_quoted_command_parses(page: str, argv: list[str]):
    """Every command a page quotes parses with the argument parser it would meet: the CLI's own for
    `autotuned-serve`, the script's for `python benchmarks/X.py` (no stale flag, no removed script)."""
    if argv[0].endswith("autotuned-serve"):
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit as e:
            pytest.fail(f"{page}: `{shlex.join(argv)}` does not parse (exit {e.code})")
        return
    assert (ROOT / argv[1]).exists(), f"{page}: {argv[1]} is not in the tree"
    parse_script_argv(argv[1], argv[2:])


def test_history_stays_out_of_the_tree():
    """No page, script, test or comment names a work session or its scratch folders; no notes of figures taken back
    (what changed and why lives in git history and CHANGELOG.md). Results files' recorded commands excepted."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in tracked:
        path = ROOT / name
        if name.startswith("docs/results/") and not name.endswith(".md") or not path.is_file():
            if HISTORY.search(name):
                hits.append(name)            # a results path named after a session
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{name}: {m.group(0)}" for m in HISTORY.finditer(text)]
        retraction = RETRACTION.search(text) if name.endswith(".md") else None
        if retraction:
            hits.append(f"{name}: {retraction.group(0)}")
    assert not hits, hits[:20]


def test_the_readme_is_short_and_links_every_guide():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 150
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(readme)}
    assert set(GUIDES) <= linked, sorted(relative(g) for g in set(GUIDES) - linked)


@pytest.mark.parametrize("page", GUIDES + DESIGN, ids=relative)
def test_a_page_fits_in_a_sitting(page: Path):
    assert len(page.read_text().splitlines()) <= 400


@pytest.mark.parametrize("page", GUIDES, ids=relative)
def test_a_guide_opens_with_how_to_use_it(page: Path):
    """Within its first 30 lines a guide shows a command or a request: a code block."""
    assert "```" in "\n".join(page.read_text().splitlines()[:30]), relative(page)


NEEDS_A_SERVER = {"bench", "tuner", "serve", "cluster"}     # and `capacity` without --simulate, and bare serving
SHORT_DURATION_S = "300"


def standalone_readme_commands() -> list[list[str]]:
    """README's `autotuned-serve` commands that need no running server, in the README's order."""
    found = []
    for _, argv in quoted_commands([ROOT / "README.md"]):
        sub = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else "serve"
        if argv[0].endswith("autotuned-serve") and sub not in NEEDS_A_SERVER \
                and (sub != "capacity" or "--simulate" in argv):
            found.append(argv)
    return found


def shortened(argv: list[str]) -> list[str]:
    argv = list(argv)
    if "--duration" in argv:
        argv[argv.index("--duration") + 1] = SHORT_DURATION_S
    return argv


@pytest.mark.slow
def test_every_standalone_readme_command_runs_as_written(tmp_path: Path):
    """Each README command that needs no server runs to completion as written, in the README's order, in
    a fresh directory (a `--duration` shortened): a stale flag, a what-if that cannot meet its SLO or a
    command that needs what no earlier one made fails here."""
    runs = standalone_readme_commands()
    assert {"tune", "simulate", "policies"} <= {argv[1] for argv in runs}, runs
    for argv in runs:
        cmd = [sys.executable, "-P", "-m", "serving.cli", *shortened(argv)[1:]]
        done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{shlex.join(argv)}: {done.stderr[-2000:]}"


def test_the_results_index_is_current():
    """docs/results/README.md is render_docs' index of the results files as they are now."""
    assert render_docs.INDEX.read_text() == render_docs.render_index(), \
        "stale: run .venv/bin/python benchmarks/render_docs.py"


def test_every_results_file_backs_a_page():
    """A results file no page renders or cites is superseded: git keeps it, the tree does not."""
    blocks = render_docs.all_blocks()
    orphans = [str(p.relative_to(ROOT)) for p in render_docs.results_files() if not render_docs.citing_pages(p, blocks)]
    assert not orphans, orphans


def test_benchmarks_readme_lists_every_script():
    """benchmarks/README.md has a line for each script in benchmarks/ and names none that is gone."""
    bullets = re.findall(r"^- (.*?):", (ROOT / "benchmarks" / "README.md").read_text(), re.M)
    listed = {name for b in bullets for name in re.findall(r"`([\w.-]+\.(?:py|sh|yaml))`", b)}
    present = {p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh", ".yaml")}
    assert listed == present, (sorted(present - listed), sorted(listed - present))


def test_the_metrics_page_lists_the_series_the_daemon_serves():
    """docs/metrics.md's table is serving/metrics_reference.py's rendering of the daemon's collectors."""
    from serving import metrics_reference

    text = metrics_reference.PAGE.read_text()
    assert metrics_reference.rendered_page(text) == text, "stale: python -m serving.metrics_reference --write"
    assert "autotuned:time_to_first_token_seconds" in text and "autotuned:tuner_failures_total" in text


def test_the_alert_rules_name_only_series_the_daemon_serves():
    """Every autotuned: series in deploy/alerts.yaml (and in docs/metrics.md's rules) is one the daemon serves."""
    from serving.metrics_reference import EXPOSED_SUFFIX, daemon_series

    served = {s.name + EXPOSED_SUFFIX.get(s.kind, "") if s.kind == "counter" else s.name for s in daemon_series()}
    rules = yaml.safe_load((ROOT / "deploy" / "alerts.yaml").read_text())["groups"][0]["rules"]
    named = {m for r in rules for m in re.findall(r"autotuned:\w+", r["expr"])}
    named |= set(re.findall(r"autotuned:\w+", (DOCS / "metrics.md").read_text().split("## What to alert on")[1]))
    assert named and named <= served, sorted(named - served)


def section(page: Path, anchor: str) -> str:
    """The text of `page` from the heading `anchor` names to the next heading of its level or above."""
    lines, out, level = page.read_text().splitlines(), [], None
    for line in lines:
        heading = re.match(r"^(#+) (.*)$", line)
        if heading and level is None and re.sub(r"[^\w\- ]", "", heading[2].lower()).replace(" ", "-") == anchor:
            level = len(heading[1])
        elif heading and level is not None and len(heading[1]) <= level:
            break
        elif level is not None:
            out.append(line)
    return "\n".join(out)


def test_every_readme_headline_figure_is_in_the_section_it_links():
    """README's Performance table quotes figures docs/performance.md renders: each number of a row's
    figure appears in the section its claim links to (a re-measured results file re-renders that section,
    and a README left behind fails here)."""
    table = (ROOT / "README.md").read_text().split("## Performance", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| [")]
    assert len(rows) >= 8
    for row in rows:
        claim, figure, _machine = [c.strip() for c in row.strip("|").split("|")]
        anchor = re.search(r"\]\(docs/performance\.md#([\w-]+)\)", claim)[1]
        text = section(DOCS / "performance.md", anchor)
        missing = [n for n in re.findall(r"\d+(?:\.\d+)?", figure) if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", text)]
        assert text and not missing, (anchor, missing)
