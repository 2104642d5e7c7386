"""scripts/bench_krr_grid.py stays working: k-RR over cells at ln 8, one seed, printed only."""

from __future__ import annotations


def test_the_krr_grid_benchmark_prints_its_rows(capsys):
    from scripts import bench_krr_grid as module

    assert module.main(["--quick", "--seeds", "300-300"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "k-RR ln 8" in line]
    assert len(rows) == len(module.populations())
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        # Every error a number of metres; the default within the 2% the smoothing may cost
        # over Norm-Sub (fixed seed: a deterministic row).
        assert all(float(cell) > 0 for cell in cells[1:6] + cells[9:])
        assert float(cells[7]) <= 1.02, row
