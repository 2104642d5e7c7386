"""scripts/sweep_defaults.py flags the settings whose default is worse than the raw reports."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.estimation import channel_for, estimators
from aggregator.estimation.estimators import default_estimator
from scripts.bench_estimators import SF_CSV, Case, hindsight_best, ibu_errors, krr_case
from scripts.sweep_defaults import (
    MECHANISMS,
    Yardsticks,
    confirm,
    main,
    paired_ratio,
    settings,
    sweep,
)
from shared.mechanisms import RandomizedResponse


def rr_case(epsilon: float, share: float, n: int) -> Case:
    truth = np.array([1.0 - share, share])
    return Case(f"rr {epsilon} {share}", truth, RandomizedResponse(epsilon=epsilon), n)


def test_a_setting_worse_than_the_raw_reports_is_flagged_and_counted(capsys):
    # Measured on these seeds: with p(yes) = 0.5 the raw reports are unbiased, and in one seed
    # of four the default moved away from them (1.35 times their mean error); with p(yes) = 0.3
    # it is about a quarter of it.
    cases = [rr_case(1.0, 0.5, 30_000), rr_case(1.0, 0.3, 1000)]
    flagged, total, ratios = sweep(iter(cases), range(200, 204))
    assert ([case.name for case in flagged], total) == (["rr 1.0 0.5"], 2)
    assert ratios[0] > 1 > ratios[1]
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("| rr 1.0 0.5 |") and rows[0].count("(!)") == 1
    assert "(!)" not in rows[1]


def test_every_mechanism_has_settings():
    for mechanism in MECHANISMS:
        names = [case.name for case in settings(mechanism)]
        if mechanism == "krr-checkins" and not SF_CSV.is_file():
            assert names == []  # the check-in settings need the data
            continue
        assert names and len(set(names)) == len(names)


@pytest.mark.skipif(not SF_CSV.is_file(), reason=f"needs the SF check-ins at {SF_CSV}")
def test_k_rr_over_coarse_grids_of_the_check_ins():
    """Each setting's categories are the occupied cells, its users drawn from the check-ins."""
    cases = list(settings("krr-checkins"))
    assert len(cases) == 18
    assert {case.truth.size for case in cases} == {9, 25, 61}
    case = cases[0]
    assert np.all(case.truth > 0) and case.truth.sum() == pytest.approx(1.0)
    counts, users = case.reports(700)
    assert counts.sum() == case.n == 1000 and users.size == case.truth.size


def test_the_check_in_settings_without_the_data_are_refused(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("scripts.sweep_defaults.SF_CSV", tmp_path / "missing.csv")
    with pytest.raises(SystemExit) as exited:
        main(["krr-checkins", "--seeds", "700"])
    assert exited.value.code == 2
    assert "krr-checkins: needs the SF check-ins at" in capsys.readouterr().err


def test_the_wide_randomized_response_grid_and_the_ibu_comparison(capsys):
    wide = list(settings("rr", wide=True))
    assert len(wide) == 140 and len({case.name for case in wide}) == 140
    assert len(list(settings("rr"))) == 36
    assert len({c.name for c in settings("krr", wide=True)}) == 192
    assert {c.name for c in settings("krr")} < {c.name for c in settings("krr", wide=True)}
    assert main(["rr", "--method", "ibu", "--seeds", "600-601"]) == 0
    out = capsys.readouterr().out
    assert "cross-validated IBU / raw" in out.splitlines()[0]
    assert "largest ratio" in out and "geometric mean of the ratios" in out


def test_a_method_the_mechanism_does_not_take_is_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["rr", "--method", "empirical_bayes", "--seeds", "600"])
    assert exited.value.code == 2
    assert "rr: empirical Bayes estimates k-RR over three categories" in capsys.readouterr().err


def test_the_geometric_gain_rule_and_the_comparison_without_it(monkeypatch):
    """Zipf over 10 values at 0.25 per unit, 300 reports, seed 606: without the gain rule
    (``--gain-se 0``) both IBU runs crept on for thousands of iterations, to about 3 times the
    raw reports' error."""
    case = next(c for c in settings("geometric") if c.name.endswith("n=300, Zipf, low end"))
    assert "k=10 eps=0.25/unit" in case.name
    _, _, with_rule = sweep(iter([case]), [606])
    monkeypatch.setattr(estimators, "GEOMETRIC_GAIN_SE", 0.0)
    _, _, without = sweep(iter([case]), [606])
    assert with_rule[0] < 1.0 and without[0] > 2.0


def test_paired_ratio_and_its_two_standard_errors():
    table = np.array([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])  # differences 0, 1, 2
    ratio, margin = paired_ratio(table)
    assert ratio == pytest.approx(2.0)
    assert margin == pytest.approx(2 * 1.0 / np.sqrt(3))  # sd 1 of the differences
    assert paired_ratio(np.array([[0.5, 1.0]])) == (0.5, 0.0)
    assert paired_ratio(np.zeros((2, 2))) == (1.0, 0.0)


def test_confirm_tells_a_real_excess_from_a_better_estimate(capsys):
    """More seeds separate the verdicts: with p(yes) = 0.3 and 1,000 reports the default is
    about a quarter of the raw reports' error, far beyond two standard errors."""
    cases = [rr_case(1.0, 0.3, 1000)]
    assert confirm(cases, range(300, 316)) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[-1].startswith("| rr 1.0 0.3 |") and rows[-1].endswith("| better |")


def test_the_command_confirms_what_it_marks(capsys):
    assert main(["rr", "--seeds", "200-203", "--confirm", "300-307"]) == 0
    out = capsys.readouterr().out
    marked = [row for row in out.splitlines() if "(!)" in row and row.startswith("| rr")]
    assert marked, "these seeds mark at least one randomized response setting"
    assert "again on 8 other seeds (300-307)" in out
    assert out.rstrip().endswith("on seeds 300-307")
    verdicts = [
        row
        for row in out.splitlines()
        if row.endswith(("| worse |", "| better |", "| not told apart |"))
    ]
    assert len(verdicts) == len(marked)


@pytest.mark.parametrize(
    "mechanism, flag, constant, settings_count",
    [
        # Geometric IBU runs stopped by cross-validation alone.
        ("geometric", "--no-noise-stop", "GEOMETRIC_DISCREPANCY_SD", 72),
        # k-RR's empirical Bayes never replaced by the maximum-likelihood shares.
        ("krr", "--no-likelihood-check", "KRR_LIKELIHOOD_CHECK_MARGIN", 72),
    ],
)
def test_a_sweep_without_a_rule_and_the_rule_put_back(
    monkeypatch, capsys, mechanism, flag, constant, settings_count
):
    """The flag sets the rule's module constant to None for the sweep, and puts it back."""
    seen = []

    def fake_sweep(cases, seeds, estimator, hindsight=None):
        seen.append(getattr(estimators, constant))
        return [], len(list(cases)), []

    monkeypatch.setattr("scripts.sweep_defaults.sweep", fake_sweep)
    kept = getattr(estimators, constant)
    assert main([mechanism, flag, "--seeds", "606"]) == 0
    assert main([mechanism, "--seeds", "606"]) == 0
    assert seen == [None, kept] and kept is not None
    assert kept == getattr(estimators, constant)  # put back
    assert f"0 of {settings_count} settings worse" in capsys.readouterr().out


def test_the_sweep_against_hindsight_best_ibu_and_the_best_fixed_count(capsys):
    """``--hindsight``: each setting's median ratio of the default's error to the best of IBU's
    iterations for that seed, as bench_estimators measures it, and its median and worst ratio
    to IBU at the one iteration count with the least mean error over the seeds."""
    case = krr_case("zipf", 10, 2.0, 10_000)
    seeds = (300, 301, 302)
    hindsight: list[Yardsticks] = []
    sweep(iter([case]), seeds, hindsight=hindsight)
    channel = channel_for(case.mechanism)
    defaults, curves = [], []
    for seed in seeds:
        counts, truth = case.reports(seed)
        fitted = default_estimator(channel).fit(counts, channel).frequencies_
        defaults.append(case.error(truth, fitted))
        curves.append(ibu_errors(case, channel, counts, truth))
    curve = np.array(curves)
    assert curve.min(axis=1) == pytest.approx(
        [hindsight_best(case, channel, *case.reports(s)) for s in seeds]
    )
    to_best = np.array(defaults) / curve.min(axis=1)
    column = int(np.argmin(curve.mean(axis=0)))
    to_fixed = np.array(defaults) / curve[:, column]
    # The fixed count is one column for every seed: no better than each seed's own best.
    assert np.all(to_fixed <= to_best + 1e-12)
    (yardsticks,) = hindsight
    assert yardsticks.best == pytest.approx(float(np.median(to_best)))
    assert yardsticks.fixed == pytest.approx(float(np.median(to_fixed)))
    assert yardsticks.fixed_worst == pytest.approx(float(to_fixed.max()))
    row = capsys.readouterr().out.rstrip()
    assert row.endswith(
        f"| {yardsticks.best:.3f} | {yardsticks.fixed:.3f}, {yardsticks.fixed_worst:.3f} |"
    )
    assert main(["krr", "--hindsight", "--seeds", "600-601"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(
        "default / hindsight-best IBU: median | default / best fixed IBU count: median, "
        "worst seed |"
    )
    assert "settings above 1.05 times hindsight-best IBU in the median seed" in out
    assert "settings above 1.05 times the best fixed IBU count in the median seed" in out
