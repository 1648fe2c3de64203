"""Docs that quote the code: the values they quote are the ones in force."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import yaml

from autotuner.controller import RECENT_WINDOWS, SLO_HEADROOM, ControllerSettings
from autotuner.search_space import CONFIG

DOCS = Path(__file__).resolve().parent.parent / "docs"


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
