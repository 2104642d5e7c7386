"""The default path (scipy.fft, numpy) and the ``fast`` extra's compiled one agree.

The ``test`` extra installs ``fast`` too, so both run here: the default path is
forced by making the compiled code look absent, as it is in a plain
``pip install '.[aggregator]'``.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from aggregator.estimation import IBU, channel_for, channels, fftw, krr_steps, planar_steps
from aggregator.estimation.ibu import IBUSteps
from shared.geo import Grid, Region
from shared.mechanisms import KRR, PlanarLaplace


@pytest.fixture
def default_path(monkeypatch):
    """Run on the default path even where the ``fast`` extra is installed."""

    def use() -> None:
        monkeypatch.setattr(fftw, "load", lambda: None)
        monkeypatch.setattr(channels, "_krr_loops", lambda: krr_steps)

    return use


def planar_case() -> tuple[PlanarLaplace, np.ndarray]:
    grid = Grid(Region(45.0, 45.01, 7.0, 7.014), 100.0)
    mechanism = PlanarLaplace(epsilon=0.02, grid=grid)
    rng = np.random.default_rng(11)
    truth = rng.dirichlet(np.full(grid.n_cells, 0.3))
    return mechanism, rng.multinomial(20_000, truth).astype(float)


def krr_case() -> tuple[KRR, np.ndarray]:
    mechanism = KRR(epsilon=1.0, domain=[f"v{i}" for i in range(300)])
    rng = np.random.default_rng(12)
    weights = 1.0 / np.arange(1, 301) ** 1.2
    return mechanism, rng.multinomial(50_000, weights / weights.sum()).astype(float)


@pytest.mark.parametrize("case", [planar_case, krr_case], ids=["planar", "krr"])
def test_the_default_path_estimates_what_the_compiled_path_does(case, default_path):
    mechanism, counts = case()
    if fftw.load() is None or channels._krr_loops() is krr_steps:
        pytest.skip("the fast extra (pyFFTW, numba) is not installed")
    fast_channel = channel_for(mechanism)
    fast = IBU().fit(counts, fast_channel)
    fast_fixed = IBU(tol=0.0).fit(counts, fast_channel, n_iter=300)
    default_path()
    default_channel = channel_for(mechanism)
    steps = default_channel.ibu_steps(counts)
    if isinstance(mechanism, PlanarLaplace):
        assert isinstance(steps, planar_steps.IBUSteps)
    else:
        assert steps._loops is krr_steps
    default = IBU().fit(counts, default_channel)
    default_fixed = IBU(tol=0.0).fit(counts, default_channel, n_iter=300)
    # The cross-validated stop picks the same step; the estimates agree to rounding.
    assert default.n_iter_ == fast.n_iter_
    np.testing.assert_allclose(default.frequencies_, fast.frequencies_, rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        default_fixed.frequencies_, fast_fixed.frequencies_, rtol=0, atol=1e-12
    )


def test_the_default_planar_steps_are_the_operator_steps(default_path):
    default_path()
    mechanism, counts = planar_case()
    channel = channel_for(mechanism)
    fused, generic = channel.ibu_steps(counts), IBUSteps(channel, counts)
    assert isinstance(fused, planar_steps.IBUSteps)
    for steps in (1, 9, 50):
        assert fused.advance(steps, 0.0) == pytest.approx(generic.advance(steps, 0.0), rel=1e-9)
        np.testing.assert_allclose(fused.p, generic.p, rtol=1e-11, atol=1e-15)
        np.testing.assert_allclose(fused.predicted, generic.predicted, rtol=1e-11, atol=1e-15)


def test_importing_the_aggregator_loads_no_compiled_extra():
    # numba's first compile takes seconds and pyFFTW wraps GPL FFTW: neither may be imported
    # unless an estimate needs them and the fast extra is installed.
    code = (
        "import sys, aggregator.app, aggregator.cli, aggregator.estimation, simulate.cli\n"
        "aggregator.app.create_app({'REDIS_URL': 'redis://127.0.0.1:1/0'})\n"
        "print(sorted({'numba', 'pyfftw', 'llvmlite'} & set(sys.modules)))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert completed.stdout.strip() == "[]"


def test_the_default_krr_steps_are_the_operator_steps_on_every_fold(default_path):
    default_path()
    mechanism, counts = krr_case()
    channel = channel_for(mechanism)
    folds = np.stack([counts, counts[::-1], np.roll(counts, 7)])
    batched = channel.ibu_steps(folds)
    singles = [IBUSteps(channel, row) for row in folds]
    for steps in (1, 9, 50):
        _, change = batched.advance(steps, 0.0)
        changes = [single.advance(steps, 0.0)[1] for single in singles]
        assert change == pytest.approx(max(changes), rel=1e-9)
        for row, single in enumerate(singles):
            np.testing.assert_allclose(batched.p[row], single.p, rtol=1e-11, atol=1e-15)
            np.testing.assert_allclose(
                batched.predicted[row], single.predicted, rtol=1e-11, atol=1e-15
            )
    # A tolerance stops all rows together, after the first step that moves no row by more.
    taken, change = channel.ibu_steps(folds).advance(10_000, 1e-6)
    assert taken < 10_000 and change <= 1e-6
