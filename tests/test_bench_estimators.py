"""scripts/bench_estimators.py's held-out configurations are not the table's."""

from __future__ import annotations

import numpy as np

from scripts.bench_estimators import HELD_OUT_SEEDS, SEEDS, cases, held_out_cases


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
