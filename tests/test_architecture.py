"""docs/design/architecture.md's import direction holds in the code: every package imports only packages
listed before it there, so the packages form no cycle; inside engine/, every room imports only the
rooms listed before it and the engine's shared leaves."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def documented_order() -> list[str]:
    """The packages in the order docs/design/architecture.md's table lists them."""
    text = (ROOT / "docs" / "design" / "architecture.md").read_text()
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
            for package in order for path in sorted((ROOT / package).rglob("*.py"))
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


def engine_layout() -> tuple[list[str], set[str], set[str]]:
    """(rooms in order, shared leaf modules, front modules) as docs/design/architecture.md lists them."""
    text = (ROOT / "docs" / "design" / "architecture.md").read_text()
    rooms = re.findall(r"^\| \d+ \| `engine/(\w+)/` \|", text, re.M)
    leaves = text[text.index("Shared leaves"):text.index("And the front")]
    front = text[text.index("And the front"):]
    front = front[:front.index("\n\n")]
    modules = lambda part: set(re.findall(r"`(\w+)\.py`", part))  # noqa: E731
    return rooms, modules(leaves), modules(front)


def runtime_nodes(tree: ast.AST):
    """Every node outside `if TYPE_CHECKING:` blocks (annotations only, no import at run time)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            continue
        yield node
        yield from runtime_nodes(node)


def engine_parts(path: Path) -> set[str]:
    """The engine's rooms and top-level modules that a module imports at run time."""
    found = set()
    for node in runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] == "engine":
                found |= {parts[1]} if len(parts) > 1 else {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("engine.")}
    return found


def engine_violations(rooms: list[str], leaves: set[str], front: set[str]) -> list[str]:
    rank = {room: i for i, room in enumerate(rooms)}
    engine, wrong = ROOT / "engine", []
    for path in sorted(engine.rglob("*.py")):
        where = path.relative_to(engine).parts
        if len(where) == 1:                       # a top-level module: a leaf imports leaves only
            if path.stem in leaves:
                wrong += [f"leaf engine/{where[0]} imports {p}" for p in engine_parts(path) - leaves]
            continue
        for part in engine_parts(path):
            if part in front or rank.get(part, -1) > rank[where[0]]:
                wrong.append(f"engine/{'/'.join(where)} imports {part}")
    return wrong


def test_engine_is_in_the_documented_rooms_and_modules():
    rooms, leaves, front = engine_layout()
    engine = ROOT / "engine"
    assert rooms == ["kernels", "attention", "model", "kv_cache", "scheduling", "structured", "speculation"]
    assert {p.name for p in engine.iterdir() if (p / "__init__.py").exists()} == set(rooms)
    assert {p.stem for p in engine.glob("*.py")} - {"__init__"} == leaves | front and not leaves & front


def test_no_engine_room_imports_a_later_room_or_the_front():
    assert engine_violations(*engine_layout()) == []


def test_the_room_check_sees_an_upward_import():
    """Reversed, the rooms' order makes their real imports upward ones; a leaf importing a room is seen."""
    rooms, leaves, front = engine_layout()
    assert len(engine_violations(rooms[::-1], leaves, front)) >= 8
    assert engine_violations(rooms, leaves | {"engine_config"}, front - {"engine_config"})
