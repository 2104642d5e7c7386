"""``ldp-simulate`` in-process: tables, JSON, figures, errors, and the Gowalla reproduction."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulate.cli import main, parse_epsilon, parse_n
from simulate.runner import ALL_METHODS

GOWALLA = Path(__file__).resolve().parents[3] / "shared" / "data" / "gowalla_sf_downtown.csv"
# The 3 km square around the Gowalla check-ins that scripts/reproduce_gowalla.py uses.
GOWALLA_REGION = "37.7723373,37.7993168,-122.4233913,-122.3892533"
PNG = b"\x89PNG\r\n\x1a\n"


def run(*args: str):
    return CliRunner().invoke(main, ["--no-progress", *args], catch_exceptions=False)


def test_version_and_short_help():
    version = run("--version")
    assert version.exit_code == 0
    assert version.output.startswith("ldp-simulate, version ")
    assert run("-h").output.startswith("Usage: main [OPTIONS]")


def test_epsilon_and_n_notations():
    assert parse_epsilon("ln(2)/100") == pytest.approx(math.log(2) / 100)
    assert parse_epsilon(" ln(8) ") == pytest.approx(math.log(8))
    assert parse_epsilon("0.5") == 0.5
    assert parse_n("1e5") == parse_n("10^5") == parse_n("100_000") == 100_000


def test_a_sweep_prints_one_row_per_epsilon_n_and_method():
    result = run(
        "--population", "zipf", "-k", "6", "-e", "0.5,2", "-n", "1000", "-n", "20000", "--json"
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    rows = document["results"]
    assert {(r["epsilon"], r["n"]) for r in rows} == {
        (0.5, 1000),
        (0.5, 20000),
        (2.0, 1000),
        (2.0, 20000),
    }
    assert sorted({r["method"] for r in rows}) == sorted(ALL_METHODS)
    assert all(0 <= r["tv"] <= 1.5 and r["mse"] >= 0 for r in rows)
    assert document["inputs"] == 6


def test_the_table_names_every_metric():
    result = run(
        "--population", "uniform", "-k", "4", "-e", "1", "-n", "5000", "-m", "ibu,inversion"
    )
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[1]
    for column in ("epsilon", "method", "TV", "MSE", "max |err|", "KL"):
        assert column in header
    assert "EMD" not in header
    lines = result.output.splitlines()[3:]
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines]
    assert [row[3] for row in cells] == ["ibu", "inversion"]
    assert all(row[2] == "5000" for row in cells)


def test_plots_are_written_for_categories_and_for_a_city(tmp_path):
    figures = tmp_path / "figures"
    result = run(
        "--population",
        "weights",
        "--weights",
        "5,3,2",
        "--labels",
        "a,b,c",
        "-e",
        "0.5,1",
        "-n",
        "2000",
        "--plot",
        str(figures),
        "--json",
    )
    assert result.exit_code == 0, result.output
    city = run(
        "--population",
        "city",
        "--region",
        "48.10,48.12,11.50,11.53",
        "--cell-size-m",
        "250",
        "-e",
        "0.005,0.02",
        "-n",
        "5000",
        "-m",
        "ibu,noisy",
        "--plot",
        str(figures),
        "--json",
    )
    assert city.exit_code == 0, city.output
    rows = json.loads(city.output)["results"]
    assert all(r["emd_m"] is not None for r in rows)
    names = sorted(p.name for p in figures.iterdir())
    assert names == sorted(
        [
            "estimates_krr_eps0.5_n2000.png",
            "estimates_krr_eps1_n2000.png",
            "error_vs_epsilon_krr.png",
            "heatmaps_planar_laplace_eps0.005_n5000.png",
            "heatmaps_planar_laplace_eps0.02_n5000.png",
            "error_vs_epsilon_planar_laplace.png",
        ]
    )
    for path in figures.iterdir():
        assert path.read_bytes()[:8] == PNG and path.stat().st_size > 5000


def test_a_spec_file_is_simulated_as_given(tmp_path):
    spec = {
        "id": "fruit",
        "title": "Fruit",
        "mechanism": "krr",
        "epsilon": 1.5,
        "domain": ["a", "b", "c"],
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    result = run("--spec", str(path), "--population", "zipf", "-n", "3000", "-m", "ibu", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["results"]
    assert (row["mechanism"], row["epsilon"], row["n"]) == ("krr", 1.5, 3000)


def test_a_csv_column_population(tmp_path):
    path = tmp_path / "answers.csv"
    path.write_text("answer\n" + "yes\n" * 30 + "no\n" * 10)
    result = run(
        "--population",
        "csv-column",
        "--csv",
        str(path),
        "--column",
        "answer",
        "--mechanism",
        "rr",
        "-e",
        "1",
        "-m",
        "inversion",
        "--json",
    )
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["results"]
    assert (row["mechanism"], row["n"]) == ("rr", 40)  # every row once


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["-e", "abc"], 2, "not a number or ln(X)"),
        (["-e", "-1"], 2, "not a positive finite epsilon"),
        (["-n", "0.5"], 2, "not a positive whole number"),
        (["-m", "magic"], 2, "'magic'; choose among"),
        (["-e", "60"], 1, "Error: epsilon must be at most 50"),
        (["--population", "city"], 2, "needs --region"),
        (
            ["--population", "weights", "--weights", "1,-1"],
            1,
            "Error: weights must be finite and non-negative",
        ),
        (
            ["--population", "city", "--region", "48.2,48.1,11.5,11.6"],
            1,
            "Error: region.lat_min must be below lat_max",
        ),
        (["--via", "http://127.0.0.1:9", "-e", "1,2"], 2, "at most one --epsilon"),
    ],
)
def test_bad_input_is_an_error_with_a_non_zero_exit(args, code, message):
    result = run(*args)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_bad_points_file_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "points.csv"
    path.write_text("lat,lon\n48.11,11.52\n48.50,11.52\n")
    result = run(
        "--population",
        "csv-points",
        "--csv",
        str(path),
        "--region",
        "48.10,48.12,11.50,11.53",
        "-e",
        "0.01",
    )
    assert result.exit_code == 1
    assert "Error:" in result.output and "line 3: the point is outside the region" in result.output


@pytest.mark.skipif(not GOWALLA.is_file(), reason=f"the Gowalla data set is not at {GOWALLA}")
def test_gowalla_planar_laplace_beats_krr_by_earth_movers_distance():
    """The comparison of the IBU literature on the real check-ins (docs/simulation.md)."""
    common = [
        "--population",
        "csv-points",
        "--csv",
        str(GOWALLA),
        "--region",
        GOWALLA_REGION,
        "--cell-size-m",
        "150",
        "-m",
        "ibu,noisy",
        "--ibu-iterations",
        "300",
        "--json",
    ]
    planar = json.loads(run(*common, "-e", "ln(2)/100").output)
    krr = json.loads(run(*common, "--mechanism", "krr", "-e", "ln(8)").output)
    emd = {
        (doc["results"][0]["mechanism"], r["method"]): r["emd_m"]
        for doc in (planar, krr)
        for r in doc["results"]
    }
    assert planar["results"][0]["n"] > 9000  # every check-in once
    assert planar["inputs"] == 400  # the 20 x 20 grid
    # IBU recovers the check-ins from planar Laplace reports far better than from k-RR ones.
    assert emd[("planar_laplace", "ibu")] < 0.5 * emd[("krr", "ibu")]
    assert emd[("planar_laplace", "ibu")] < emd[("planar_laplace", "noisy")]
