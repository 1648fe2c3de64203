"""docs/configuration.md and configs/default.yaml, rendered from the settings' own definitions
(serving/settings.py, policies/knobs.py, autotuner/controller_settings.py), so that neither can
disagree with the code: tests/test_settings.py fails when either is stale.

    python -m serving.config_reference --write     # re-render both
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import fields
from pathlib import Path
from typing import Any

from autotuner.controller_settings import ControllerSettings
from policies import POLICIES
from policies.knobs import KNOB_SPECS, Knobs
from serving.settings import DAEMON_KNOBS, Settings, default_of, flags

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "configuration.md"
DEFAULT_YAML = ROOT / "configs" / "default.yaml"


def yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def shown_default(name: str, value: Any) -> str:
    if name == "slo_classes":            # an absolute path on the machine that rendered it
        return "configs/slo_classes.yaml (shipped)"
    return yaml_value(value)


def settings_table() -> list[str]:
    rows = ["| setting | flag | default | what it does |", "|---|---|---|---|"]
    for f in fields(Settings):
        default = default_of(Settings, f.name)
        flag = ", ".join(f"`{x}`" for x in flags(f))
        rows.append(f"| `{f.name}` | {flag} | `{shown_default(f.name, default)}` | {f.metadata['help']} |")
    return rows


def knobs_table() -> list[str]:
    defaults = Knobs(**DAEMON_KNOBS)
    rows = ["| knob | range | default | read by | what it does |", "|---|---|---|---|---|"]
    for name, spec in KNOB_SPECS.items():
        users = ", ".join(p for p, cls in POLICIES.items() if name in cls.knobs)
        rows.append(f"| `{name}` | {spec.describe()} | `{getattr(defaults, name)}` | {users} | {spec.help} |")
    return rows


def controller_table() -> list[str]:
    rows = ["| setting | default | what it does |", "|---|---|---|"]
    for f in fields(ControllerSettings):
        rows.append(f"| `{f.name}` | `{yaml_value(f.default)}` | {f.metadata['help']} |")
    return rows


def render_reference() -> str:
    return "\n".join([
        "# Configuration reference",
        "",
        "```bash",
        "cp configs/default.yaml my.yaml      # every setting at its default; edit what you change",
        ".venv/bin/autotuned-serve --config my.yaml --port 8080 --no-tune      # a flag overrides the file",
        "```",
        "",
        "<!-- rendered by `python -m serving.config_reference --write` from serving/settings.py,",
        "policies/knobs.py and autotuner/controller_settings.py; edit those, not this file -->",
        "",
        "Each default is defined once in the code; this page and `configs/default.yaml` are rendered from",
        "it, and `tests/test_settings.py` fails when they are stale.",
        "",
        "## Daemon settings",
        "",
        "A YAML file (`--config FILE`, e.g. `configs/default.yaml`) sets any of them; a flag overrides the",
        "file. A setting defined by the engine, API or daemon configuration reads its default from there.",
        "",
        *settings_table(),
        "",
        "## Scheduler knobs",
        "",
        "The `knobs` setting (or `--knob NAME=VALUE`, `--token-budget`, `--max-num-seqs`) sets their starting",
        "values; a tuned daemon changes them within `configs/tuning.yaml`'s search space.",
        "",
        *knobs_table(),
        "",
        "## Online controller",
        "",
        "A `controller:` section in `configs/tuning.yaml` overrides these.",
        "",
        *controller_table(),
        "",
    ])


def render_default_yaml() -> str:
    lines = ["# autotuned-serve daemon settings, every one at its default (rendered by",
             "# `python -m serving.config_reference --write`; docs/configuration.md says what each does).",
             "# Every field is optional and flags override them."]
    for f in fields(Settings):
        lines += ["", *textwrap.wrap(f.metadata["help"], 100, initial_indent="# ", subsequent_indent="# ")]
        if f.name == "knobs":
            lines.append("knobs:")
            lines += [f"  {k}: {yaml_value(v)}" for k, v in Knobs(**DAEMON_KNOBS).as_dict().items() if k != "version"]
        elif f.name == "slo":
            lines.append("slo: {}              # the default class's targets come from slo_classes")
        elif f.name == "slo_classes":
            lines.append("# slo_classes: configs/slo_classes.yaml   # the shipped classes")
        else:
            lines.append(f"{f.name}: {yaml_value(default_of(Settings, f.name))}")
    return "\n".join(lines) + "\n"


def stale() -> list[Path]:
    return [path for path, text in ((REFERENCE, render_reference()), (DEFAULT_YAML, render_default_yaml()))
            if not path.exists() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="re-render the files (default: check them)")
    args = parser.parse_args(argv)
    if args.write:
        REFERENCE.write_text(render_reference())
        DEFAULT_YAML.write_text(render_default_yaml())
        return 0
    for path in stale():
        print(f"{path.relative_to(ROOT)} is stale: python -m serving.config_reference --write", file=sys.stderr)
    return 1 if stale() else 0


if __name__ == "__main__":
    sys.exit(main())
