"""The package's surface and weight: re-exports only, no numpy/scipy, no `random`."""

from __future__ import annotations

import ast
import configparser
import json
import subprocess
import sys
from pathlib import Path

import client

ROOT = Path(__file__).resolve().parents[2]
CLIENT_DIR = ROOT / "client"


def test_all_is_pinned():
    assert client.__all__ == [
        "AlreadyReported",
        "BudgetExceeded",
        "CampaignClosed",
        "CampaignNotFound",
        "ClientError",
        "EpsilonCapExceeded",
        "FlushResult",
        "Policy",
        "PolicyError",
        "ReportResult",
        "Reporter",
        "ServerError",
        "ServerRejected",
        "ServerUnavailable",
        "SpecChanged",
        "StateError",
        "UntrustedSpec",
        "default_state_dir",
    ]
    assert all(hasattr(client, name) for name in client.__all__)


def test_init_only_reexports():
    tree = ast.parse((CLIENT_DIR / "__init__.py").read_text())
    kinds = {type(node).__name__ for node in tree.body}
    assert kinds <= {"Expr", "ImportFrom", "Assign"}


def test_importing_and_reporting_loads_neither_numpy_nor_scipy():
    """In a fresh interpreter: import the library and the CLI, perturb with memoization."""
    code = """
import json, sys
import client, client.cli
from client.memo import memo_rng
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec
specs = [
    {"id": "k", "title": "k", "mechanism": "krr", "epsilon": 1.0, "domain": ["a", "b", "c"]},
    {"id": "p", "title": "p", "mechanism": "planar_laplace", "epsilon": 0.01,
     "region": {"lat_min": 1, "lat_max": 1.01, "lon_min": 2, "lon_max": 2.01}, "cell_size_m": 100},
]
for raw in specs:
    spec = CampaignSpec.from_dict(raw)
    m = Mechanism.from_spec(spec)
    m.report_value(m.perturb_index(0, memo_rng(bytes(32), spec.id, spec.spec_hash, 0)))
print(json.dumps(sorted(sys.modules)))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    modules = json.loads(out)
    heavy = [m for m in modules if m.split(".")[0] in {"numpy", "scipy", "flask", "redis"}]
    assert heavy == []
    assert "client.reporter" in modules and "requests" in modules


def test_client_code_never_imports_random_or_numerics():
    banned = {"random", "numpy", "scipy"}
    for path in CLIENT_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not {n.split(".")[0] for n in names} & banned, (path.name, names)


def test_every_package_ships_its_type_hints():
    """PEP 561: a ``py.typed`` marker in each package, and in the distribution's package data."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    package_data = config["options.package_data"]
    for package in ("shared", "client", "aggregator", "simulate"):
        assert (ROOT / package / "py.typed").is_file(), package
        assert "py.typed" in package_data.get(package, ""), package
