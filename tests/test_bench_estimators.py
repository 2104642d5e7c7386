"""scripts/bench_estimators.py: the held-out configurations are not the table's, and its ratios."""

from __future__ import annotations

import math

import numpy as np

from scripts.bench_estimators import (
    HELD_OUT_SEEDS,
    SEEDS,
    cases,
    held_out_cases,
    krr_case,
    run_case,
    to_raw,
)


def test_the_held_out_configurations_are_none_of_the_tables():
    table, held_out = cases(quick=False), held_out_cases()
    assert held_out and not {case.name for case in table} & {case.name for case in held_out}
    assert not set(SEEDS) & set(HELD_OUT_SEEDS)
    cities = [case for case in table if case.name.startswith("clustered city planar ln 2")]
    other = [case for case in held_out if "another clustered city" in case.name]
    assert cities and other and not np.allclose(cities[0].truth, other[0].truth)
    # The check-in grids, where the data are present, have other cell sizes than the table's.
    table_cells = {case.grid.cell_size_m for case in table if case.name.startswith("SF")}
    held_out_cells = {case.grid.cell_size_m for case in held_out if case.name.startswith("SF")}
    assert not table_cells & held_out_cells


def test_a_seed_whose_raw_reports_are_exact():
    # Over 12 categories at epsilon 7 a report keeps its answer with probability 0.99, and
    # seed 1008's 500 reports are every user's answer; the default keeps them (to rounding).
    case = krr_case("spiky", 12, 7.0, 500)
    counts, truth = case.reports(1008)
    assert case.error(truth, counts / counts.sum()) == 0
    row = run_case(case, [1008])
    assert row["worse_than_raw"] == 0 and row["raw_worst"] == 1.0
    assert to_raw(0.01, 0.0) == math.inf and to_raw(1e-17, 0.0) == 1.0
    assert to_raw(0.2, 0.4) == 0.5
