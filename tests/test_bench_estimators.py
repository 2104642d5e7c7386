"""scripts/bench_estimators.py: its rows run to finite numbers, its ratios, and its rows' spread."""

from __future__ import annotations

import math

from scripts.bench_estimators import (
    POPULATION_SEED,
    SEEDS,
    Case,
    categorical_cases,
    categorical_table,
    geometric_mean,
    krr_case,
    main,
    oracle_case,
    planar_cases,
    planar_grid,
    planar_table,
    run_categorical,
    run_planar,
    to_better,
)
from shared.mechanisms import KRR, HadamardResponse, PlanarLaplace, RandomizedResponse
from shared.oracles import OLH
from simulate.populations import Population


def finite(*values: float | None) -> bool:
    return all(value is not None and math.isfinite(value) and value >= 0 for value in values)


def test_the_ratio_and_its_geometric_mean():
    assert to_better(0.2, 0.4, 0.25) == 0.8
    assert to_better(0.3, 0.25, None) == 1.2  # the MLE not measured: Norm-Sub alone
    # Where the better of the two is exact, an exact default is its equal.
    assert to_better(0.0, 0.0, 0.1) == 1.0 and to_better(1e-17, 0.2, 0.0) == 1.0
    assert to_better(0.01, 0.0, 0.3) == math.inf
    assert math.isclose(geometric_mean([2.0, 0.5]), 1.0)
    assert math.isclose(geometric_mean([1.1, 1.1, 1.1]), 1.1)


def test_a_tiny_categorical_row_and_its_table():
    row = run_categorical(krr_case("zipf", 5, 1.0, 300), [1, 2])
    means = row["means"]
    assert finite(means["raw"], means["default"], means["norm_sub"], means["mle"], row["ratio"])
    assert row["methods"] and row["seeds"] == 2
    table = categorical_table([row])
    assert "zipf k-RR k=5 eps=1, n=300" in table and "Geometric mean" in table
    assert "The MLE had not converged" in table and 0 <= row["mle_at_cap"] <= 2


def test_an_oracle_row_without_the_mle_is_against_norm_sub_alone():
    unmeasured = run_categorical(oracle_case("olh", "spiky", 20, 2.0, 400, mle=False), [1, 2])
    means = unmeasured["means"]
    assert means["mle"] is None and means["raw"] is None  # hashed reports: no raw shares
    assert unmeasured["ratio"] == to_better(means["default"], means["norm_sub"], None)
    assert unmeasured["step_seconds"] > 0
    measured = run_categorical(oracle_case("hadamard", "zipf", 6, 1.0, 300, mle=True), [1])
    assert finite(measured["means"]["mle"], measured["ratio"])
    table = categorical_table([unmeasured, measured])
    assert "(Norm-Sub only)" in table and "[1] spiky OLH k=20" in table


def test_a_seed_whose_raw_reports_are_exact():
    # Over 12 categories at epsilon 8 a report keeps its answer with probability 0.996, and
    # seed 10's 500 reports are every user's answer.
    case = krr_case("spiky", 12, 8.0, 500)
    counts, truth = case.reports(10)
    assert case.error(truth, counts / counts.sum()) == 0
    row = run_categorical(case, [10])
    assert row["means"]["raw"] == 0 and finite(row["ratio"])
    assert "| 0 |" in categorical_table([row])


def test_a_tiny_planar_row():
    grid = planar_grid(500.0, 100.0)
    city = Population.clustered_city(grid, hotspots=2, seed=POPULATION_SEED).probabilities
    planar = PlanarLaplace(epsilon=math.log(2) / 100, grid=grid)
    row = run_planar(Case("tiny city", city, planar, 300, grid=grid), [1, 2])
    assert finite(row["raw"], row["default"], row["best"], row["median"], row["worst"])
    # Hindsight-best IBU looks at the default's own count too: never worse than it.
    assert row["best"] <= row["default"] + 1e-9 and row["median"] >= 1 - 1e-9
    assert "tiny city" in planar_table([row])


def test_the_rows_cover_the_issue_and_nobody_tuned_on_their_seeds():
    rows = categorical_cases()
    ks = {case.truth.size for case in rows if case.grid is None}
    assert {2, 7, 10, 100, 1000, 100_000} <= ks
    assert {type(case.mechanism) for case in rows} >= {RandomizedResponse, KRR, OLH}
    assert any(isinstance(case.mechanism, HadamardResponse) for case in rows)
    assert any(case.n == 1_000_000 and isinstance(case.mechanism, KRR) for case in rows)
    epsilons = {case.mechanism.epsilon for case in rows}
    assert {0.5, 1.0, 2.0, 4.0, 8.0} <= epsilons
    assert len(planar_cases()) >= 2
    assert len(SEEDS) >= 20
    earlier = [*range(0, 6), *range(100, 108), *range(200, 232), *range(400, 432)]
    earlier += [*range(600, 608), *range(700, 708), *range(900, 980)]
    assert not set(SEEDS) & set(earlier)
    assert POPULATION_SEED not in (77, 1234, 2024, 4242)


def test_only_and_seeds_print_without_writing(capsys, monkeypatch):
    written = []
    monkeypatch.setattr("scripts.bench_estimators.write_section", lambda *a: written.append(a))
    assert main(["--only", "commute", "--seeds", "1-2"]) == 0
    out = capsys.readouterr().out
    assert "commute shares k-RR k=7" in out and "seeds 1-2 (2 a row)" in out
    assert "Cost of the default" not in out and not written
