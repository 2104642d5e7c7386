"""``scripts/measure_stopping.py noise``: the geometric default with and without its stop at
the reports' noise level, on the same surveys."""

from __future__ import annotations

from aggregator.estimation import estimators
from scripts.measure_stopping import noise


def test_the_noise_table_compares_the_stop_on_the_same_surveys(capsys):
    """Over 30 values at 0.5 per unit with 200 reports the stop changes some estimates (seeds
    900 and 902: the runs that followed the held-out score for 166-353 iterations), and the
    setting is put back afterwards."""
    kept = estimators.GEOMETRIC_DISCREPANCY_SD
    noise(range(900, 903, 2), rows=((30, 0.5, 200),))
    assert kept == estimators.GEOMETRIC_DISCREPANCY_SD
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("| 30, 0.5, 200 |")]
    assert len(rows) == 6  # one per truth
    cells = [row.split(" | ")[-2:] for row in rows]
    assert any(now != without.rstrip(" |") for now, without in cells)
    assert lines[-2].startswith("default: ") and lines[-1].startswith("without the noise-level")
