"""Which estimator runs by default for each mechanism: the one table every caller reads.

* **Categorical oracles** (randomized response, k-RR, OLH, Hadamard response): Norm-Sub,
  the unbiased inversion projected onto the simplex (Wang et al., NDSS 2020). Their channels
  spread a report over every other category alike, so neighbouring values share nothing for
  a regulariser to borrow; the inversion is unbiased and Norm-Sub removes only its
  impossible shares. Measured against the maximum-likelihood estimate on populations and
  seeds nobody tuned on, it is as accurate or better (``scripts/bench_estimators.py``), and
  it costs one pass over the counts.
  Where epsilon is so small that a report is as likely from every value in floating point,
  the inversion does not exist: the MLE, equal shares, runs instead.
* **The same oracles over a region's cells**: Norm-Sub smoothed over neighbouring cells, the
  kernel's width, none included, chosen by 10-fold cross-validation of the held-out
  likelihood (:mod:`aggregator.estimation.smoothing`). The labels are cells, and people near
  each other make neighbouring cells alike.
* **Smoothing channels** (the geometric mechanism, planar Laplace, the exponential mechanism
  on a grid): IBU stopped by 10-fold cross-validation of the held-out likelihood. Their noise
  moves a report to nearby values, so the inversion amplifies the noise's high frequencies;
  stopping IBU early is a regulariser whose strength the held-out reports choose.
"""

from __future__ import annotations

from shared.geo import Grid
from shared.mechanisms import GridMechanism, IntegerWeights, Mechanism
from shared.spec import (
    EXPONENTIAL_GRID,
    GEOMETRIC,
    HADAMARD_RESPONSE,
    KRR,
    MECHANISMS,
    OLH_NAME,
    OUE_NAME,
    PLANAR_LAPLACE,
    RR,
)

PROJECTION, MLE, IBU, CLIP, INVERSION = "projection", "mle", "ibu", "clip", "inversion"
SMOOTHED = "smoothed_projection"
# Every method an estimate can be asked for; the response's ``method`` is one of these.
METHODS = (PROJECTION, SMOOTHED, MLE, IBU, CLIP, INVERSION)
DEFAULT_METHODS: dict[str, str] = {
    RR: PROJECTION,
    KRR: PROJECTION,
    OLH_NAME: PROJECTION,
    HADAMARD_RESPONSE: PROJECTION,
    OUE_NAME: PROJECTION,
    GEOMETRIC: IBU,
    PLANAR_LAPLACE: IBU,
    EXPONENTIAL_GRID: IBU,
}
# Over a region's cells, the categorical oracles' default instead.
REGION_DEFAULT = SMOOTHED
METHOD_NAMES = {
    PROJECTION: "Norm-Sub (the unbiased inversion projected onto the simplex)",
    SMOOTHED: "Norm-Sub smoothed over neighbouring cells (width by cross-validation)",
    MLE: "maximum likelihood (closed form for k-RR, else IBU run to convergence)",
    IBU: "IBU stopped by 10-fold cross-validation of the held-out likelihood",
    CLIP: "the unbiased inversion, negatives clipped to 0 and renormalised",
    INVERSION: "the unbiased inversion (shares may fall outside [0, 1])",
}
assert set(DEFAULT_METHODS) >= set(MECHANISMS)


def default_method(subject: Mechanism | str) -> str:
    """The default method for a mechanism, or for every mechanism of a wire name."""
    if isinstance(subject, str):
        if subject not in DEFAULT_METHODS:
            raise ValueError(f"no such mechanism: {subject!r}")
        return DEFAULT_METHODS[subject]
    if isinstance(subject, IntegerWeights) and subject.p_keep <= subject.p_other:
        return MLE
    if cell_grid(subject) is not None:
        return REGION_DEFAULT
    return DEFAULT_METHODS[subject.name]


def cell_grid(mechanism: Mechanism) -> Grid | None:
    """The grid whose cells are a categorical mechanism's values (a region campaign of k-RR,
    OLH or Hadamard response), or None."""
    if isinstance(mechanism, GridMechanism):
        return None
    grid = getattr(mechanism, "grid", None)
    return grid if isinstance(grid, Grid) else None


def described_defaults() -> str:
    """The table in words, for the OpenAPI document and the CLI's help."""
    by_method: dict[str, list[str]] = {}
    for mechanism in MECHANISMS:
        by_method.setdefault(DEFAULT_METHODS[mechanism], []).append(mechanism)
    return (
        "; ".join(
            f"{method} for {', '.join(mechanisms)}" for method, mechanisms in by_method.items()
        )
        + f" ({REGION_DEFAULT} for those over a region's cells)"
    )
