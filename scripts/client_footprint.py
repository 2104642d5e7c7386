"""Installed footprint of a client-only install of ldp-collect (no extras).

Builds the project's wheel, installs it into a fresh virtual environment with
pip (dependencies from the configured index), and measures what a device
carries: the size of every installed distribution, the size of each of our
top-level packages, the modules that ``import client, client.cli`` loads,
import time (median of fresh interpreters) and the peak memory of a dry run
of the reporting path. Prints a markdown table and writes it into
BENCHMARKS.md (section ``client_footprint``).

    python scripts/client_footprint.py [--runs 7] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT, write_section

# Run inside the virtual environment: what is installed besides the venv's own tooling.
_DISTRIBUTIONS = r"""
import json, importlib.metadata as md
rows = []
for dist in md.distributions():
    name = dist.metadata["Name"]
    if name.lower() in ("pip", "setuptools", "wheel"):
        continue
    size, by_top = 0, {}
    for f in dist.files or []:
        path = dist.locate_file(f)
        if path.is_file():
            n = path.stat().st_size
            size += n
            top = f.parts[0]
            if not top.endswith((".dist-info", ".data")) and top != "..":
                by_top[top] = by_top.get(top, 0) + n
    rows.append({"name": name, "version": dist.version, "bytes": size, "by_top": by_top})
print(json.dumps(rows))
"""

_IMPORT = r"""
import json, sys, time
start = time.perf_counter()
import client, client.cli
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "modules": sorted(sys.modules)}))
"""

# The reporting path without a server: spec parsing, memoized perturbation, state writes.
_REPORT_PATH = r"""
import json, resource, sys, tempfile
from client.memo import memo_rng
from client.state import StateStore
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec
spec = CampaignSpec.from_dict({
    "id": "p", "title": "p", "mechanism": "planar_laplace", "epsilon": 0.004,
    "region": {"lat_min": 48.1, "lat_max": 48.2, "lon_min": 11.5, "lon_max": 11.6},
    "cell_size_m": 100,
})
mechanism = Mechanism.from_spec(spec)
with tempfile.TemporaryDirectory() as d:
    store = StateStore(d)
    secret = store.secret()
    for x in range(200):
        mechanism.perturb_index(x, memo_rng(secret, spec.id, spec.spec_hash, x))
    with store.transaction() as state:
        state.forgotten_spent = 0.0
heavy = [m for m in sys.modules if m.split(".")[0] in ("numpy", "scipy")]
print(json.dumps({"max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "heavy": heavy}))
"""


def run(args: list[str], **kwargs) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, **kwargs).stdout


def kib(n: int) -> str:
    return f"{n / 1024:,.0f} KiB"


def measure(runs: int) -> str:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        # Build from a copy, so that nothing (build/, *.egg-info) lands in the working tree.
        source = tmp / "source"
        source.mkdir()
        for name in ("pyproject.toml", "setup.cfg", "README.md", "MANIFEST.in"):
            if (ROOT / name).exists():
                shutil.copy2(ROOT / name, source / name)
        if not (source / "README.md").exists():
            (source / "README.md").write_text("ldp-collect\n")
        for package in ("shared", "client", "aggregator"):
            shutil.copytree(
                ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
            )
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "-w",
                str(tmp / "wheels"),
                str(source),
            ]
        )
        [wheel] = (tmp / "wheels").glob("ldp_collect-*.whl")
        run([sys.executable, "-m", "venv", str(tmp / "venv")])
        python = str(tmp / "venv" / "bin" / "python")
        run([python, "-m", "pip", "install", "--quiet", str(wheel)])
        # Outside the repository, so the installed copy is imported, not the sources.
        rows = json.loads(run([python, "-c", _DISTRIBUTIONS], cwd=tmp))
        imports = [json.loads(run([python, "-c", _IMPORT], cwd=tmp)) for _ in range(runs)]
        report_path = json.loads(run([python, "-c", _REPORT_PATH], cwd=tmp))
        help_ok = (
            subprocess.run(
                [str(tmp / "venv" / "bin" / "ldp-client"), "--help"], capture_output=True, cwd=tmp
            ).returncode
            == 0
        )

    rows.sort(key=lambda r: -r["bytes"])
    total = sum(r["bytes"] for r in rows)
    lines = [
        "Client-only install (`pip install ldp-collect`, no extras) into a fresh virtual "
        "environment; sizes are the installed files of each distribution.",
        "",
        "| distribution | version | installed size |",
        "|---|---|---:|",
    ]
    lines += [f"| {r['name']} | {r['version']} | {kib(r['bytes'])} |" for r in rows]
    lines.append(f"| **total** | | **{kib(total)}** |")
    ours = next(r for r in rows if r["name"].lower() == "ldp-collect")
    lines += ["", "| ldp-collect package | installed size |", "|---|---:|"]
    lines += [f"| `{top}/` | {kib(n)} |" for top, n in sorted(ours["by_top"].items())]
    modules = imports[0]["modules"]
    heavy = [m for m in modules if m.split(".")[0] in ("numpy", "scipy", "flask", "redis")]
    seconds = statistics.median(i["seconds"] for i in imports)
    lines += [
        "",
        "| measure | value |",
        "|---|---:|",
        f"| `import client, client.cli`: median of {runs} fresh interpreters | "
        f"{seconds * 1000:.0f} ms |",
        f"| modules loaded by that import | {len(modules)} |",
        f"| numpy / scipy / flask / redis loaded | {', '.join(heavy) or 'none'} |",
        f"| peak RSS, 200 memoized planar perturbations + a state write | "
        f"{report_path['max_rss_kib'] / 1024:.1f} MiB |",
        f"| numpy / scipy loaded on the reporting path | {', '.join(report_path['heavy']) or 'none'} |",
        f"| `ldp-client --help` runs from the install | {'yes' if help_ok else 'NO'} |",
        "",
        "The `aggregator/` package ships in the same wheel (code only: its dependencies come "
        "with the `aggregator` extra and are not installed here).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters for import time")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md")
    args = parser.parse_args()
    markdown = measure(args.runs)
    print(markdown)
    if not args.no_write:
        write_section("client_footprint", markdown)


if __name__ == "__main__":
    main()
