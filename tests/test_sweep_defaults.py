"""scripts/sweep_defaults.py flags the settings whose default is worse than the raw reports."""

from __future__ import annotations

import numpy as np

from scripts.bench_estimators import Case
from scripts.sweep_defaults import MECHANISMS, settings, sweep
from shared.mechanisms import RandomizedResponse


def rr_case(epsilon: float, share: float) -> Case:
    truth = np.array([1.0 - share, share])
    return Case(f"rr {epsilon}", truth, RandomizedResponse(epsilon=epsilon), 1000)


def test_a_setting_worse_than_the_raw_reports_is_flagged_and_counted(capsys):
    # Measured on these seeds: at epsilon 6 the reports are nearly the users' answers and the
    # default is about 2.7 times their error; at epsilon 1 it is about half of it.
    flagged, total = sweep(iter([rr_case(6.0, 0.02), rr_case(1.0, 0.3)]), range(600, 604))
    assert (flagged, total) == (1, 2)
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("| rr 6.0 |") and rows[0].count("(!)") == 1
    assert "(!)" not in rows[1]


def test_every_mechanism_has_settings():
    for mechanism in MECHANISMS:
        names = [case.name for case in settings(mechanism)]
        assert names and len(set(names)) == len(names)
