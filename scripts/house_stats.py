"""How the house stands: modules, lines per module, and imports that point up a layer.

    python scripts/house_stats.py [CHECKOUT]

Reads the four packages of a checkout (default: this one) as text, so it also
measures older commits (``git worktree add /tmp/old REV``). The layers are the
ones ``tests/test_architecture.py`` enforces: ``shared`` imports only the
standard library; ``client`` not numpy, ``aggregator`` or ``simulate``;
``aggregator`` not ``client`` or ``simulate``.
"""

from __future__ import annotations

import ast
import statistics
import sys
from pathlib import Path

FORBIDDEN = {
    "shared": {"client", "aggregator", "simulate", "numpy", "requests"},
    "client": {"aggregator", "simulate", "numpy"},
    "aggregator": {"client", "simulate"},
    "simulate": set(),
}


def top_level_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level module) of every absolute import in a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else ".")
    sizes: list[tuple[int, str]] = []
    upward: list[str] = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text("utf-8")
            name = str(path.relative_to(root))
            sizes.append((len(text.splitlines()), name))
            for line, module in top_level_imports(ast.parse(text)):
                if module in forbidden:
                    upward.append(f"{name}:{line} -> {module}")
    lines = [n for n, _ in sizes]
    print(f"modules: {len(lines)}")
    print(
        f"lines: {sum(lines)} (mean {statistics.mean(lines):.0f}, median {statistics.median(lines):.0f})"
    )
    print(f"modules over 400 lines: {sum(n > 400 for n in lines)}")
    print("largest: " + ", ".join(f"{p} {n}" for n, p in sorted(sizes, reverse=True)[:6]))
    print(f"imports pointing up a layer: {len(upward)}")
    for item in upward:
        print(f"  {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
