"""Results files of the benchmarks behind docs/: each holds its results and a `meta` record saying
where they came from (machine, commit, UTC date, command line), so a figure in docs/ can be traced.

A JSON results file is an object with a "meta" key beside the benchmark's own keys; a JSON-lines one
starts with a {"meta": ...} line. benchmarks/render_docs.py renders docs/ from these files.

This module imports nothing heavy (no torch), so the renderers and tests can use it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
UNRECORDED = "unrecorded"      # a meta field nobody wrote down when the file was made
# the /proc/cpuinfo flags that pick our kernels' code paths (and llama.cpp's)
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vbmi", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, list[str]]:
    """The CPU's model name and which of ISA_FLAGS it lists."""
    model, flags = UNRECORDED, set()
    try:
        text = Path(path).read_text()
    except OSError:
        return model, []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == UNRECORDED:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, [f for f in ISA_FLAGS if f in flags]


def machine() -> dict[str, Any]:
    model, isa = cpuinfo()
    return {"cpu_model": model, "isa": isa, "cores": os.cpu_count() or 0}


def git_commit(tree: Path = ROOT) -> str:
    """HEAD, with "-dirty" when the tree has uncommitted changes (the code run was not HEAD's alone)."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=40"], cwd=tree,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return UNRECORDED
    return out.strip()


def served_tree() -> Path | None:
    """The tree the project's packages were imported from, where it is not this script's (PYTHONPATH
    pointing at another checkout, e.g. a worktree at an older commit run beside this one)."""
    engine = sys.modules.get("engine")
    tree = Path(engine.__file__).resolve().parent.parent if engine and engine.__file__ else ROOT
    return None if tree == ROOT else tree


def meta(command: list[str] | None = None) -> dict[str, Any]:
    """Where results come from; `command` defaults to this process's own command line, exactly."""
    served = served_tree()
    return {"machine": machine(), "commit": git_commit(),
            **({"served_commit": git_commit(served), "served_tree": str(served)} if served else {}),
            "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": shlex.join(command if command is not None else sys.orig_argv)}


def write(path: str | Path, results: dict[str, Any], indent: int = 2) -> None:
    """`results` as a JSON object with `meta` first."""
    Path(path).write_text(json.dumps({"meta": meta(), **results}, indent=indent, default=str) + "\n")


def meta_line() -> str:
    """The first line of a JSON-lines results file."""
    return json.dumps({"meta": meta()}) + "\n"


def read(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def read_lines(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines results file, its meta line left out."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if set(r) != {"meta"}]
