"""The layers hold: shared <- client, aggregator <- simulate, and storage owns Redis."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("shared", "client", "aggregator", "simulate")
# What each package may import besides the standard library and itself.
ALLOWED = {
    "shared": set(),
    "client": {"shared", "requests", "click"},
    "aggregator": None,  # any third-party library, but not the packages above it
    "simulate": None,
}
FORBIDDEN = {
    "shared": {"client", "aggregator", "simulate"},
    "client": {"aggregator", "simulate", "numpy"},
    "aggregator": {"client", "simulate"},
    "simulate": set(),
}


def imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports in one module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PROJECT)
def test_no_package_imports_a_layer_above_it(package):
    for path in modules(package):
        wrong = imports(path) & FORBIDDEN[package]
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"


@pytest.mark.parametrize("package", ["shared", "client"])
def test_device_side_packages_use_only_the_standard_library_and_their_few_dependencies(package):
    allowed = ALLOWED[package] | {package} | set(sys.stdlib_module_names)
    for path in modules(package):
        extra = imports(path) - allowed
        assert not extra, f"{path.relative_to(ROOT)} imports {sorted(extra)}"


def test_only_storage_touches_the_redis_connection():
    storage = ROOT / "aggregator" / "storage"
    for package in ("aggregator", "simulate"):
        for path in modules(package):
            if storage in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr in ("connection", "_connection"):
                    pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno} reaches into the store")


def lua_constants(script: str) -> dict[str, int]:
    """The status names a Lua script declares: ``local A, B = 0, 1`` lines."""
    text = (ROOT / "aggregator" / "storage" / "lua" / script).read_text("utf-8")
    found = {}
    for names, values in re.findall(r"^local ([A-Z_, ]+) = ([\d, ]+)$", text, re.M):
        found.update(
            zip(names.replace(" ", "").split(","), map(int, values.split(",")), strict=True)
        )
    return found


def test_the_lua_scripts_status_codes_are_the_stores_names():
    from aggregator.storage.campaigns import CreateStatus
    from aggregator.storage.ingest import IngestStatus

    assert lua_constants("ingest.lua") == {status.name: status.value for status in IngestStatus}
    assert lua_constants("create.lua") == {status.name: status.value for status in CreateStatus}


ESTIMATION = ROOT / "aggregator" / "estimation"
STORAGE = ROOT / "aggregator" / "storage"


def package_imports(path: Path, package: Path = ESTIMATION) -> set[str]:
    """The modules of ``package`` (a subpackage of aggregator) that one of its modules
    imports, at any depth of its body (a function-level import is an import all the same;
    names imported for type checking alone are not imported when the program runs)."""
    dotted = f"aggregator.{package.name}"
    tree = ast.parse(path.read_text("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == dotted:
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(dotted + "."):
            found.add(node.module.split(".")[2])
    modules = {p.stem for p in package.glob("*.py")}
    return (found & modules) - {path.stem}


@pytest.mark.parametrize("package", [ESTIMATION, STORAGE], ids=lambda path: path.name)
def test_no_import_cycle_inside_a_package(package):
    """Estimation's modules, and storage's (a report's walk through storage goes down:
    store -> ingest -> cluster, never back up), import each other without a cycle."""
    graph = {
        path.stem: package_imports(path, package)
        for path in package.glob("*.py")
        if path.stem != "__init__"
    }
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        if module in done:
            return
        if module in visiting:
            cycle = [*visiting[visiting.index(module) :], module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        visiting.append(module)
        for target in sorted(graph.get(module, ())):
            visit(target)
        visiting.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_estimation_modules_stay_readable():
    """No module over about 500 lines, and at most 46 module-level numeric constants in all
    (docs/estimation.md's table lists those that change an estimate; six more are the
    advisor's region simulation and its earth mover's distance)."""
    constants = 0
    for path in ESTIMATION.glob("*.py"):
        text = path.read_text("utf-8")
        assert text.count("\n") <= 520, f"{path.name} has {text.count(chr(10))} lines"
        for node in ast.parse(text).body:
            targets = (
                node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            )
            if not all(isinstance(t, ast.Name) and t.id.lstrip("_").isupper() for t in targets):
                continue  # state, not a constant
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, (int, float)):
                constants += not isinstance(value.value, bool)
            elif isinstance(value, (ast.BinOp, ast.UnaryOp, ast.Tuple)):
                numbers = [n for n in ast.walk(value) if isinstance(n, ast.Constant)]
                constants += bool(numbers) and all(
                    isinstance(n.value, (int, float)) for n in numbers
                )
    assert constants <= 46, constants


def test_storage_modules_stay_readable():
    """Each storage module has one concern, in at most 500 lines."""
    for path in STORAGE.glob("*.py"):
        lines = path.read_text("utf-8").count("\n")
        assert lines <= 500, f"{path.name} has {lines} lines"


def key_templates(path: Path) -> list[tuple[int, str]]:
    """The string literals of a module that look like Redis keys (``ldp:`` and no space;
    the parts of an f-string are literals too): prose in docstrings and comments is not."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("ldp:")
        and not any(char.isspace() for char in node.value)
    ]


def test_every_redis_key_is_named_in_the_keys_module():
    keys_module = STORAGE / "keys.py"
    assert key_templates(keys_module), "the keys module names no key"
    for path in modules("aggregator"):
        if path == keys_module:
            continue
        found = key_templates(path)
        assert not found, f"{path.relative_to(ROOT)}:{found[0][0]} names a key: {found[0][1]!r}"
    for script in (STORAGE / "lua").glob("*.lua"):
        text = script.read_text("utf-8")
        assert not re.search(r"""['"]ldp:""", text), f"{script.name} names a key"


def test_storage_imports_nothing_of_the_aggregator_above_it():
    """Storage is the bottom layer of the aggregator: no HTTP, no dashboard, no app."""
    for path in STORAGE.glob("*.py"):
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                package = name.split(".")[:2]
                assert package[0] != "aggregator" or package[1:] == ["storage"], (
                    f"{path.name} imports {name}"
                )
