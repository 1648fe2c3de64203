"""docs/architecture.md's import direction holds in the code: every package imports only packages
listed before it there, so the packages form no cycle."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def documented_order() -> list[str]:
    """The packages in the order docs/architecture.md's table lists them."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    return re.findall(r"^\| \d+ \| `(\w+)/` \|", text, re.M)


def imported_packages(path: Path, ours: set[str]) -> set[str]:
    """Our packages that a module imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & ours


def upward_imports(order: list[str]) -> list[str]:
    rank = {package: i for i, package in enumerate(order)}
    return [f"{path.relative_to(ROOT)} imports {other}"
            for package in order for path in sorted((ROOT / package).glob("*.py"))
            for other in imported_packages(path, set(order)) if rank[other] > rank[package]]


def test_the_documented_packages_are_the_top_level_packages():
    order = documented_order()
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists() and p.name != "tests"}
    assert set(order) == packages
    assert order[:2] == ["policies", "engine"] and order[-2:] == ["serving", "cluster"]


def test_no_package_imports_one_listed_after_it():
    assert upward_imports(documented_order()) == []


def test_the_check_sees_an_upward_import():
    """Reversed, the order makes every real import an upward one: the check is not vacuous."""
    assert len(upward_imports(documented_order()[::-1])) > 20
