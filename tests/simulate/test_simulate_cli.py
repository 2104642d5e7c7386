"""``ldp-simulate run`` and ``reproduce``: tables, JSON, figures, errors, and the Gowalla data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from shared.spec import CampaignSpec
from simulate.cli import _default_methods, main
from simulate.options import parse_epsilon, parse_n
from simulate.reproduce import square_region
from simulate.runner import ALL_METHODS

GOWALLA = Path(__file__).resolve().parents[3] / "shared" / "data" / "gowalla_sf_downtown.csv"
# The 3 km square around the Gowalla check-ins that ``ldp-simulate reproduce`` uses.
GOWALLA_REGION = "37.7723373,37.7993168,-122.4233913,-122.3892533"
PNG = b"\x89PNG\r\n\x1a\n"


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def run(*args: str):
    return invoke("run", "--no-progress", *args)


@pytest.mark.parametrize("command", [[], ["run"], ["via"], ["reproduce"], ["advise"]])
def test_version_and_short_help_on_the_group_and_each_subcommand(command):
    version = invoke(*command, "--version")
    assert version.exit_code == 0, version.output
    assert version.output.startswith("ldp-simulate, version ")
    usage = invoke(*command, "-h")
    assert usage.exit_code == 0, usage.output
    assert usage.output.startswith(f"Usage: {' '.join(['ldp-simulate', *command])} [OPTIONS]")


def test_the_group_lists_its_subcommands():
    listed = invoke("-h").output.split("Commands:", 1)[1].split()
    assert {"run", "via", "reproduce"} <= set(listed)


def test_each_subcommand_has_only_its_own_options():
    run_help, via_help, reproduce_help = (
        invoke(c, "-h").output for c in ("run", "via", "reproduce")
    )
    for option in ("--repeats", "--plot", "--ibu-iterations"):
        assert option in run_help and option not in via_help
    for option in ("--server", "--campaign", "--admin-token", "--workers", "--deadline"):
        assert option in via_help and option not in run_help and option not in reproduce_help
    assert "--population" not in reproduce_help


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--population", "zipf"], "Options follow the subcommand: 'ldp-simulate run"),
        (["--via", "http://127.0.0.1:9"], "'ldp-simulate via --server URL"),
        (["simulate"], "No such command 'simulate'"),
        (["run", "--via", "http://127.0.0.1:9"], "No such option '--via'"),
        (["run", "--workers", "2"], "No such option '--workers'"),
        (["via", "-e", "1"], "Missing option '--server'"),
        (["via", "--server", "http://127.0.0.1:9", "-e", "1,2"], "'1,2' is not a number"),
        (["via", "--server", "http://127.0.0.1:9", "--repeats", "3"], "No such option"),
        (["reproduce"], "Missing option '--csv'"),
        (["reproduce", "--csv", "no-such-file.csv"], "does not exist"),
    ],
)
def test_options_in_the_wrong_place_are_usage_errors(args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output


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
    # Every method: k-RR takes them all.
    assert sorted({r["method"] for r in rows}) == sorted(set(ALL_METHODS) - {"smoothed_projection"})
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


def write_check_ins(path: Path, n: int = 1500) -> Path:
    """Clustered points whose bounding box is a 2.9 km square, so the reproduction's grid is 20 x 20."""
    box = square_region(48.137, 11.575, 2900.0)
    rng = np.random.default_rng(5)
    centres = rng.uniform((box.lat_min, box.lon_min), (box.lat_max, box.lon_max), size=(4, 2))
    points = centres[rng.integers(0, 4, n)] + rng.normal(0, 0.002, size=(n, 2))
    lows, highs = (box.lat_min, box.lon_min), (box.lat_max, box.lon_max)
    points = np.vstack([np.clip(points, lows, highs), [lows, highs]])  # the corners fix the box
    lines = [f"{i},{lat:.7f},{lon:.7f},0" for i, (lat, lon) in enumerate(points)]
    path.write_text("user_id,lat,lon,unix_time\n" + "\n".join(lines) + "\n")
    return path


def test_reproduce_compares_planar_laplace_and_krr_on_a_points_file(tmp_path):
    check_ins = write_check_ins(tmp_path / "check_ins.csv")
    args = ["reproduce", "--csv", str(check_ins), "--repeats", "2", "--ibu-iterations", "50"]
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["check_ins"], document["grid"]["rows"], document["grid"]["cols"]) == (
        1502,
        20,
        20,
    )
    rows = [(r["mechanism"], r["estimator"], r["ibu_iterations"]) for r in document["results"]]
    assert rows[:2] + rows[3:5] == [
        ("planar_laplace", "IBU, fixed", 50),
        ("planar_laplace", "noisy reports as they are", None),
        ("krr", "IBU, fixed", 50),
        ("krr", "noisy reports as they are", None),
    ]
    assert [rows[2][:2], rows[5][:2], rows[6][:2]] == [
        ("planar_laplace", "IBU, cross-validated"),
        ("krr", "IBU, cross-validated"),
        ("krr", "the service's default (Norm-Sub smoothed over neighbouring cells)"),
    ]
    emd = {(r["mechanism"], r["estimator"]): r["emd_m"] for r in document["results"]}
    assert emd[("planar_laplace", "IBU, fixed")] < emd[("krr", "IBU, fixed")]

    table = invoke(*args).stdout.splitlines()
    assert table[3].startswith("| mechanism | epsilon | estimator | IBU iterations | EMD (m)")
    assert table[5].startswith("| planar_laplace | ln(2)/100 per m | IBU, fixed | 50 | ")
    assert len(table) == 12


def test_reproduce_names_a_bad_line_without_echoing_it(tmp_path):
    check_ins = write_check_ins(tmp_path / "check_ins.csv")
    lines = check_ins.read_text().splitlines()
    lines[7] = "7,48.13x,11.575,0"
    check_ins.write_text("\n".join(lines) + "\n")
    result = invoke("reproduce", "--csv", str(check_ins), "--repeats", "1")
    assert result.exit_code == 1
    assert "line 8: column 'lat' is not a number" in result.output
    assert "48.13x" not in result.output


def test_the_geometric_mechanism_is_simulated_over_an_integer_range():
    result = run(
        "--mechanism", "geometric", "--population", "zipf", "-k", "40", "--lo", "18",
        "-e", "0.5,2", "-n", "20000", "-m", "ibu,inversion,noisy", "--seed", "3", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {(r["epsilon"], r["method"]): r for r in json.loads(result.output)["results"]}
    assert {r["mechanism"] for r in rows.values()} == {"geometric"}
    assert all(r["n"] == 20000 for r in rows.values())
    # The estimates undo the noise,
    # and more epsilon per unit means less error.
    assert rows[(0.5, "ibu")]["tv"] < rows[(0.5, "noisy")]["tv"]
    assert rows[(2.0, "inversion")]["tv"] < rows[(0.5, "inversion")]["tv"]


def test_a_geometric_spec_file_fixes_the_range(tmp_path):
    spec = {"id": "age", "title": "Age", "mechanism": "geometric", "epsilon": 0.3}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**spec, "lo": 10, "hi": 29}))
    result = run(
        "--spec", str(path), "--population", "uniform", "-n", "2000", "-m", "ibu", "--json"
    )
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["results"]
    assert (row["mechanism"], row["epsilon"], row["n"]) == ("geometric", 0.3, 2000)
    assert json.loads(result.output)["inputs"] == 20


def test_geometric_refuses_labels_and_locations():
    labelled = run(
        "--mechanism", "geometric", "--labels", "a,b", "--population", "uniform", "-k", "2"
    )
    assert labelled.exit_code == 2 and "not labels" in labelled.output


@pytest.mark.parametrize("mechanism", ["olh", "oue", "hadamard_response"])
def test_the_large_domain_oracles_are_simulated_over_integers(mechanism):
    """5,000 values, 50,000 users: the unbiased estimate's MSE is within 30% of the closed form
    4 e / (e - 1)^2 / n for OLH and OUE (Hadamard response's is 1 / (2 p - 1)^2 / n), and the
    projection beats it."""
    result = run(
        "--mechanism", mechanism, "--population", "zipf", "-k", "5000", "-e", "1",
        "-n", "50000", "--seed", "4", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {r["method"]: r for r in json.loads(result.output)["results"]}
    assert set(rows) == {"inversion", "clip", "projection"} | (
        {"noisy"} if mechanism == "oue" else set()
    )
    e = math.e
    closed = (
        4 * e / (e - 1) ** 2 / 50_000
        if mechanism != "hadamard_response"
        else ((e + 1) / (e - 1)) ** 2 / 50_000
    )
    assert 0.7 < rows["inversion"]["mse"] / closed < 1.3, rows["inversion"]["mse"] / closed
    assert rows["projection"]["mse"] < rows["inversion"]["mse"]


def test_oracles_refuse_labels():
    labelled = run("--mechanism", "olh", "--labels", "a,b", "--population", "uniform", "-k", "2")
    assert labelled.exit_code == 2 and "not labels" in labelled.output


@pytest.mark.parametrize("metric", ["manhattan", "euclidean"])
def test_exponential_grid_is_simulated_on_a_city_with_its_metric(metric):
    result = run(
        "--mechanism", "exponential_grid", "--metric", metric, "--population", "city",
        "--region", "37.77,37.785,-122.42,-122.40", "--cell-size-m", "150",
        "-e", "0.004,0.02", "-n", "20000", "-m", "ibu,noisy", "--seed", "4", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {(r["epsilon"], r["method"]): r for r in json.loads(result.output)["results"]}
    assert {r["mechanism"] for r in rows.values()} == {"exponential_grid"}
    # IBU undoes the noise, and more epsilon per metre means less error.
    assert rows[(0.004, "ibu")]["emd_m"] < rows[(0.004, "noisy")]["emd_m"]
    assert rows[(0.02, "ibu")]["emd_m"] < rows[(0.004, "ibu")]["emd_m"]


def test_metric_is_for_exponential_grid_only():
    result = run("--mechanism", "krr", "--metric", "euclidean", "--population", "uniform")
    assert result.exit_code == 2 and "exponential_grid only" in result.output


def test_the_default_methods_are_those_the_mechanism_takes():
    # The server refuses the others (422), so `ldp-simulate via` must not ask for them.
    rr = CampaignSpec.from_dict({"id": "a", "title": "A", "mechanism": "rr", "epsilon": 1.0})
    krr = CampaignSpec.from_dict(
        {"id": "b", "title": "B", "mechanism": "krr", "epsilon": 1.0, "domain": ["x", "y", "z"]}
    )
    geometric = CampaignSpec.from_dict(
        {"id": "c", "title": "C", "mechanism": "geometric", "epsilon": 1.0, "lo": 0, "hi": 9}
    )
    planar = CampaignSpec.from_dict(
        {
            "id": "d",
            "title": "D",
            "mechanism": "planar_laplace",
            "epsilon": 0.01,
            "region": {"lat_min": 37.77, "lat_max": 37.78, "lon_min": -122.42, "lon_max": -122.41},
            "cell_size_m": 200,
        }
    )
    for spec in (rr, krr, geometric, planar):
        assert {"projection", "mle", "ibu", "inversion", "noisy"} <= set(_default_methods(spec))
