"""scripts/bench_grid_mechanisms.py: skips without the check-ins, compares on a points file."""

from __future__ import annotations

import numpy as np

from scripts import bench_grid_mechanisms as bench


def test_without_the_data_file_the_comparison_is_skipped_with_a_message(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(bench, "SF_CSV", tmp_path / "absent.csv")
    assert bench.main(["--quick"]) == 0
    assert "the San Francisco comparison is skipped" in capsys.readouterr().err


def test_a_points_file_gives_one_row_per_mechanism_and_a_plot(tmp_path, monkeypatch):
    # 3,000 synthetic check-ins around two venues a kilometre apart, in San Francisco.
    generator = np.random.default_rng(8)
    centres = np.array([[37.780, -122.410], [37.789, -122.410]])
    points = centres[generator.integers(0, 2, 3000)] + generator.normal(0, 0.002, (3000, 2))
    lines = ["user_id,lat,lon,unix_time"]
    lines += [f"{i},{lat:.6f},{lon:.6f},0" for i, (lat, lon) in enumerate(points)]
    path = tmp_path / "points.csv"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(bench, "SF_CSV", path)
    results = bench.run([0.01], [1])
    assert len(results) == 6
    errors = {label: by_epsilon[0.01][0] for label, by_epsilon in results.items()}
    planar = errors["planar Laplace, eps"]
    euclidean = errors["exponential_grid euclidean, eps"]
    neighbours = next(e for label, e in errors.items() if "neighbours" in label)
    assert max(planar, euclidean) < 0.5 * neighbours, errors
    table = bench.table(results, 3000, [1])
    assert table.count("\n| ") == 1 + 6 and "eps = 0.01" in table  # the header and 6 rows
    plot = bench.plot(results, tmp_path / "plot.png")
    assert plot.stat().st_size > 1000
