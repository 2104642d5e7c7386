"""Schemathesis against a real server: a campaign spec valid against the served document is
accepted, and one that is not is refused.

``schemathesis run`` (the CLI, as an operator would run it) sends the campaign-creation
operation's generated bodies (valid and invalid: ``--mode all``, ``--checks all``) with the
admin token, at a fixed seed and 60 examples per phase. The relations between fields that
OpenAPI 3.0 cannot state are left to :mod:`schemathesis_relations`, which drops exactly
those refusals; any other failure fails the test. About 15 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from schemathesis_relations import is_relation
from support import running_server

ADMIN = "schemathesis-admin-token-0123456789abcdef"
HERE = Path(__file__).resolve().parent
SEED = 1
EXAMPLES = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("schemathesis")
    with running_server(base / "data", env={"LDP_ADMIN_TOKEN": ADMIN}, workers=2) as running:
        yield running


def schemathesis_run(url: str, workdir: Path, *options: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_relations"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    command = [
        *(sys.executable, "-m", "schemathesis.cli", "run", f"{url}/api/v1/openapi.json"),
        *("--header", f"Authorization: Bearer {ADMIN}"),
        *("--include-name", "POST /api/v1/campaigns"),
        *("--max-examples", str(EXAMPLES), "--seed", str(SEED), "--checks", "all"),
        *("--no-color", "--generation-database", "none", *options),
    ]
    # In its own directory: schemathesis keeps a cache (.schemathesis/) where it runs.
    return subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )


def test_schemathesis_finds_no_failure_creating_campaigns(server, tmp_path):
    run = schemathesis_run(server.url, tmp_path)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "1 selected" in run.stdout  # the one operation, and it was tested
    assert "passed" in run.stdout and "failed" not in run.stdout


def refusal(message: str, field: str | None) -> str:
    return json.dumps({"error": {"code": "invalid_spec", "message": message, "field": field}})


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ("region.lat_min must be below lat_max", "region.lat_min"),
        ("the range [0, 200000] holds 200,001 values; at most 100,000 are allowed", "hi"),
        ("lo must be below hi, got lo=0, hi=0", "lo"),
        ("the grid would have 1 x 1 cell; olh needs at least 2: use smaller cells", "cell_size_m"),
        ("epsilon 1.5 per metre is too large for this grid: the sampler ...", "epsilon"),
        ("epsilon 2 per metre times the 100 m cells is 200; exponential_grid takes", "epsilon"),
    ],
)
def test_only_relations_between_fields_are_left_to_the_hook(message, field):
    assert is_relation(422, refusal(message, field))


@pytest.mark.parametrize(
    ("message", "field"),
    [
        # The refusal schemathesis found while the document allowed every domain at once.
        (
            "give one domain: domain (labels), lo and hi (an integer range), or region with "
            "cell_size_m; got domain and lo and hi and region with cell_size_m",
            "domain",
        ),
        ("region applies only to planar_laplace, exponential_grid, krr", "region"),
        ("krr takes domain or region with cell_size_m, not both", "region"),
        ("epsilon must be at most 50.0, got 60.0", "epsilon"),
        ("region.lat_min must be below lat_max", "epsilon"),  # the message, not its field
    ],
)
def test_any_other_refusal_of_a_valid_body_fails_the_run(message, field):
    assert not is_relation(422, refusal(message, field))
    assert not is_relation(400, refusal("region.lat_min must be below lat_max", "region.lat_min"))
