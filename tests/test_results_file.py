"""benchmarks/results_file.py's meta: which code a results file's figures came from."""

from __future__ import annotations

import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))   # the scripts import by name
import results_file  # noqa: E402


def test_meta_names_the_tree_the_served_code_came_from_when_it_is_not_the_scripts(tmp_path, monkeypatch):
    """A benchmark run with PYTHONPATH at another checkout (an older commit's worktree) serves that
    checkout's packages: meta says so beside the script's own commit."""
    assert "served_commit" not in results_file.meta(["x"])          # the packages of this tree
    (tmp_path / "engine").mkdir()
    other = types.ModuleType("engine")
    other.__file__ = str(tmp_path / "engine" / "__init__.py")
    monkeypatch.setitem(sys.modules, "engine", other)
    meta = results_file.meta(["x"])
    assert meta["served_tree"] == str(tmp_path)
    assert meta["served_commit"] == results_file.git_commit(tmp_path) != meta["commit"]
