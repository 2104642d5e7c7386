"""scripts/bench_krr_grid.py stays working: two synthetic rows, one seed, printed only."""

from __future__ import annotations


def test_the_krr_grid_benchmark_prints_its_rows(capsys):
    from scripts import bench_krr_grid as module

    status = module.main(["--seeds", "200", "--only", "city 20 x 20 ln 8, n=500", "--no-write"])
    assert status == 0
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ")]
    names = [row[0].strip("| ") for row in rows[1:]]
    assert names == ["clustered city 20 x 20 ln 8, n=500", "spiky city 20 x 20 ln 8, n=500"]
    for row in rows[1:]:
        assert len(row) == 10, row
        # With 500 reports over 400 cells nothing is smoothed: the grid estimator is the default.
        assert row[2] == "0" and row[8] == "1.000", row
        assert float(row[3].split(",")[0]) > 0, row  # hindsight-best IBU was found
