"""The code-editing workload: real functions from the running Python's standard library, each request
asking for the function back with type hints and a docstring.

The answer repeats most of the prompt, which is the traffic where speculative decoding by prompt
lookup pays. The functions are read (with ast, never imported) from a fixed list of pure-Python
modules under sysconfig's stdlib path, so nothing is downloaded and the same Python sends the same
functions; another minor version may hold other sources, and a module it lacks is skipped.
"""

from __future__ import annotations

import ast
import functools
import os
import sysconfig
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Pure-Python modules every CPython ships and that change little between versions (no module that
# became a package or a shim lately, as pathlib and datetime did).
STDLIB_MODULES = (
    "argparse.py", "base64.py", "calendar.py", "configparser.py", "contextlib.py", "copy.py", "csv.py",
    "difflib.py", "email/utils.py", "fnmatch.py", "fractions.py", "ftplib.py", "functools.py", "getopt.py",
    "gettext.py", "glob.py", "graphlib.py", "heapq.py", "html/parser.py", "ipaddress.py", "json/decoder.py",
    "json/encoder.py", "posixpath.py", "pprint.py", "random.py", "shlex.py", "shutil.py", "statistics.py",
    "string.py", "textwrap.py", "tokenize.py", "urllib/parse.py",
)
MIN_LINES, MAX_LINES = 15, 80
INSTRUCTION = ("Add type hints and a docstring to this Python function. "
               "Return the whole function in one ```python block and nothing else.")
# max_tokens: the function again, plus room for the hints, the docstring and the fences
OUTPUT_SCALE, OUTPUT_MARGIN = 1.3, 64


@dataclass(frozen=True)
class StdlibFunction:
    """One function or method as its module's file holds it (decorators included), dedented."""

    module: str      # path under the stdlib, e.g. "json/decoder.py"
    name: str        # qualified: "JSONDecoder.raw_decode" for a method
    line: int        # its first line in the module's file
    source: str

    @property
    def num_lines(self) -> int:
        return self.source.count("\n") + 1


@dataclass(frozen=True)
class EditRequest:
    """A function's request: its chat message and token lengths (of the prompt tokenizer)."""

    function: StdlibFunction
    message: str          # the one user message
    prompt_tokens: int    # the message in the chat template, as the server sees it
    output_tokens: int    # max_tokens: the function's own tokens x OUTPUT_SCALE + OUTPUT_MARGIN


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def module_functions(path: str, module: str) -> list[StdlibFunction]:
    """Top-level functions and methods of top-level classes of MIN_LINES..MAX_LINES lines that parse alone."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")     # as ast counts lines (splitlines would also split at form feeds)
    tree = ast.parse(text, path)
    found = []
    for node, qualname in _functions(tree):
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        if not MIN_LINES <= node.end_lineno - start + 1 <= MAX_LINES:
            continue
        source = textwrap.dedent("\n".join(lines[start - 1:node.end_lineno]))
        if _parses(source):      # a method whose strings sit left of its body does not dedent
            found.append(StdlibFunction(module, qualname, start, source))
    return found


def _functions(tree: ast.Module) -> list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    out = []
    for node in tree.body:
        if isinstance(node, defs):
            out.append((node, node.name))
        elif isinstance(node, ast.ClassDef):
            out += [(m, f"{node.name}.{m.name}") for m in node.body if isinstance(m, defs)]
    return out


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


@functools.lru_cache(maxsize=4)
def stdlib_functions(modules: tuple[str, ...] = STDLIB_MODULES, root: str | None = None) -> tuple[StdlibFunction, ...]:
    """Every candidate of `modules` (under `root`, default this Python's stdlib), in module and line order."""
    root = stdlib_dir() if root is None else root
    found = [f for m in modules if os.path.isfile(os.path.join(root, m))
             for f in module_functions(os.path.join(root, m), m)]
    if not found:
        raise ValueError(f"no functions of {MIN_LINES}-{MAX_LINES} lines in the stdlib modules under {root}")
    return tuple(found)


def sample_functions(count: int, seed: int = 0, pool: Sequence[StdlibFunction] | None = None) -> list[StdlibFunction]:
    """`count` distinct functions of the pool (all of it where it holds fewer), a seeded draw."""
    pool = stdlib_functions() if pool is None else pool
    if count < 1:
        raise ValueError(f"code-editing needs functions >= 1, got {count}")
    picked = np.random.default_rng(seed).choice(len(pool), size=min(count, len(pool)), replace=False)
    return [pool[int(i)] for i in picked]


def edit_message(function: StdlibFunction) -> str:
    return f"{INSTRUCTION}\n\n```python\n{function.source}\n```"


def edit_request(function: StdlibFunction, tokenizer: Any) -> EditRequest:
    """Lengths by `tokenizer` (loadgen.prompts.load_prompt_tokenizer): the prompt with its chat template."""
    message = edit_message(function)
    prompt = len(tokenizer.apply_chat_template([{"role": "user", "content": message}]))
    own = len(tokenizer.encode(function.source)) - len(tokenizer.encode(""))    # without a BOS
    return EditRequest(function, message, prompt, round(OUTPUT_SCALE * own + OUTPUT_MARGIN))


@dataclass(frozen=True)
class CodeEditingLengths:
    """Lengths (loadgen.workload.Lengths) whose requests carry their own prompt: each draw is one of
    the sampled functions, every function once before any repeats (a seeded order per pass)."""

    requests: tuple[EditRequest, ...]

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        passes = -(-n // len(self.requests))
        return np.concatenate([rng.permutation(len(self.requests)) for _ in range(passes)])[:n]

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        prompts, outputs, _ = self.sample_messages(rng, n)
        return prompts, outputs

    def sample_messages(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
        picked = [self.requests[int(i)] for i in self.draw(rng, n)]
        return (np.array([r.prompt_tokens for r in picked], dtype=np.int64),
                np.array([r.output_tokens for r in picked], dtype=np.int64), [r.message for r in picked])


@functools.lru_cache(maxsize=8)
def code_editing_lengths(functions: int = 200, seed: int = 0) -> CodeEditingLengths:
    """The workload kind's lengths, with the bundled model's tokenizer (the bench client's default)."""
    from loadgen.prompts import load_prompt_tokenizer

    tokenizer = load_prompt_tokenizer(None)
    return CodeEditingLengths(tuple(edit_request(f, tokenizer) for f in sample_functions(functions, seed)))
