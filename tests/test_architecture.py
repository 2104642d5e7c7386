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
    from aggregator.storage.ingest import IngestStatus
    from aggregator.storage.store import CreateStatus

    assert lua_constants("ingest.lua") == {status.name: status.value for status in IngestStatus}
    assert lua_constants("create.lua") == {status.name: status.value for status in CreateStatus}


ESTIMATION = ROOT / "aggregator" / "estimation"


def estimation_imports(path: Path) -> set[str]:
    """The modules of aggregator.estimation that one module imports, at any depth of its body
    (a function-level import is an import all the same; names imported for type checking
    alone are not imported when the program runs)."""
    tree = ast.parse(path.read_text("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "aggregator.estimation":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "aggregator.estimation."
        ):
            found.add(node.module.split(".")[2])
    modules = {p.stem for p in ESTIMATION.glob("*.py")}
    return (found & modules) - {path.stem}


def test_no_import_cycle_inside_estimation():
    graph = {
        path.stem: estimation_imports(path)
        for path in ESTIMATION.glob("*.py")
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
    """No module over about 500 lines, and at most 40 module-level numeric constants in all
    (docs/estimation.md's table lists those that change an estimate)."""
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
    assert constants <= 40, constants
