"""Shared helpers of the benchmark scripts: the machine they ran on, BENCHMARKS.md sections, ports.

Each benchmark script owns one section of ``BENCHMARKS.md``, delimited by
``<!-- section: NAME -->`` and ``<!-- end: NAME -->`` lines. :func:`write_section`
replaces that section in place (or appends it), with a header line giving the
command that produced it, the date and the machine, so figures are never quoted
without their context.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import re
import shlex
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shared.geo import EARTH_RADIUS_M, Grid, Region  # noqa: E402
from simulate.populations import Population  # noqa: E402

BENCHMARKS_FILE = ROOT / "BENCHMARKS.md"
TITLE = "# Benchmarks\n\nEach section is written by the script named in its header; rerun it to refresh.\n"


def seed_range(text: str) -> range:
    """A command line's seeds: ``"100-107"`` (inclusive), or one seed, ``"100"``."""
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def equator_grid(rows: int, cols: int, cell_m: float) -> Grid:
    """A ``rows x cols`` grid of ``cell_m`` metre cells at the equator."""
    per_degree = EARTH_RADIUS_M * math.pi / 180
    grid = Grid(
        Region(0.0, (rows - 0.5) * cell_m / per_degree, 0.0, (cols - 0.5) * cell_m / per_degree),
        cell_m,
    )
    assert (grid.rows, grid.cols) == (rows, cols)
    return grid


def spiky_city(grid: Grid, seed: int) -> Population:
    """The benchmarks' spiky city: 40 Gaussian hotspots of 20-60 m over a 2% uniform
    background (the shape of check-in data)."""
    return Population.clustered_city(
        grid, hotspots=40, spread_m=(20.0, 60.0), background=0.02, seed=seed
    )


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo``, or what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ram_bytes() -> int | None:
    """Total physical memory in bytes, if the system says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def machine_description() -> str:
    """One line: CPU model, cores, RAM, Python version and platform."""
    ram = ram_bytes()
    ram_text = f"{ram / 2**30:.1f} GiB RAM" if ram else "RAM unknown"
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, {ram_text}, "
        f"Python {platform.python_version()} ({platform.system()} {platform.machine()})"
    )


def command_line(argv: list[str] | None = None) -> str:
    """The command that ran, as one would retype it from the repository root."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0])
    with contextlib.suppress(ValueError):
        script = script.resolve().relative_to(ROOT)
    return shlex.join(["python", str(script), *argv[1:]])


def section_text(name: str, markdown: str, *, command: str | None = None) -> str:
    """The delimited block for ``name``, with its provenance header."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"_Command: `{command or command_line()}`; date: {now}; machine: {machine_description()}._"
    )
    return f"<!-- section: {name} -->\n{header}\n\n{markdown.strip()}\n<!-- end: {name} -->\n"


def write_section(
    name: str, markdown: str, *, command: str | None = None, path: Path | None = None
) -> Path:
    """Replace (or append) section ``name`` of ``BENCHMARKS.md`` with ``markdown``.

    Other sections are left as they are. Returns the path written.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"section names are letters, digits, '.', '_' and '-', got {name!r}")
    path = BENCHMARKS_FILE if path is None else path
    block = section_text(name, markdown, command=command)
    existing = path.read_text() if path.exists() else TITLE
    pattern = re.compile(
        rf"^<!-- section: {re.escape(name)} -->\n.*?^<!-- end: {re.escape(name)} -->\n?",
        re.DOTALL | re.MULTILINE,
    )
    if pattern.search(existing):
        updated = pattern.sub(lambda _: block, existing, count=1)
    else:
        updated = existing.rstrip("\n") + "\n\n" + block
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(updated)
    tmp.replace(path)
    return path
