"""The mechanism advisor: rank the mechanisms for a domain by expected error, best first.

Categories and integer ranges are ranked by the closed forms of
:mod:`aggregator.estimation.advice` (``E ||f_hat - f||^2`` summed over the
domain, for ``n`` users); a region by the short seeded simulation of
:mod:`aggregator.estimation.region_advice` (the earth mover's distance of each
mechanism's estimate on a synthetic city), the same ranking the server applies to a
campaign created without a mechanism.
"""

from __future__ import annotations

import math

from aggregator.estimation.advice import Option, rank_categorical, rank_range
from aggregator.estimation.region_advice import DEFAULT_SEED, DEFAULT_TRIALS, rank_grid
from shared.geo import Grid, Region


def advise(
    *,
    epsilon: float,
    users: int,
    domain_size: int | None = None,
    lo: int | None = None,
    hi: int | None = None,
    region: Region | None = None,
    cell_size_m: float | None = None,
    trials: int = DEFAULT_TRIALS,
    seed: int = DEFAULT_SEED,
) -> list[Option]:
    """The mechanisms for one domain, best first; give exactly one of the three domains."""
    given = [
        name
        for name, present in (
            ("domain size", domain_size is not None),
            ("range", lo is not None or hi is not None),
            ("region", region is not None or cell_size_m is not None),
        )
        if present
    ]
    if len(given) != 1:
        raise ValueError(
            "give one domain: a domain size, a range lo..hi, or a region with a cell size"
            + (f" (got {' and '.join(given)})" if given else "")
        )
    if domain_size is not None:
        return rank_categorical(domain_size, epsilon, users)
    if lo is not None or hi is not None:
        if lo is None or hi is None:
            raise ValueError("a range needs both lo and hi")
        return rank_range(lo, hi, epsilon, users)
    if region is None or cell_size_m is None:
        raise ValueError("a region needs its cell size, and a cell size its region")
    return rank_grid(Grid(region, cell_size_m), epsilon, users, trials=trials, seed=seed)


def recommendation(options: list[Option]) -> str:
    """One line: the best mechanism, and the best the service hosts if that differs."""
    best = options[0]
    line = f"recommended: {best.mechanism} ({best.why})"
    if len(options) > 1 and best.expected_emd_m is not None:
        second = options[1]
        errors = [o.details.get("expected_emd_se_m") or 0.0 for o in (best, second)]
        gap = (second.expected_emd_m or 0.0) - best.expected_emd_m
        if gap <= 2 * math.hypot(*errors):
            line += (
                f"; {second.mechanism} is within twice the simulation's standard error "
                f"({gap:.1f} m apart): more --trials to tell them apart"
            )
    if not best.hosted:
        served = next((o for o in options if o.hosted), None)
        line += "; not hosted by this service yet"
        if served is not None:
            line += f"; the best it hosts: {served.mechanism}"
    return line


def format_advice(options: list[Option]) -> str:
    """The ranking as a table, then the recommendation."""
    grid = any(o.expected_emd_m is not None for o in options)
    header = ["#", "mechanism", "epsilon", "expected_mse"]
    header += ["expected_emd_m"] if grid else []
    header += ["hosted", "basis"]
    rows = []
    for rank, option in enumerate(options, 1):
        name = option.mechanism
        if "metric" in option.details:
            name += f" ({option.details['metric']})"
        if option.details.get("as_cells"):
            name += " (over the cells)"
        if option.details.get("as_labels"):
            name += " (over the values)"
        row = [
            str(rank),
            name,
            f"{option.epsilon:.4g}",
            "-" if option.expected_mse is None else f"{option.expected_mse:.4g}",
        ]
        if grid:
            row.append("-" if option.expected_emd_m is None else f"{option.expected_emd_m:.1f}")
        row += ["yes" if option.hosted else "no", option.basis]
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *rows]
    ]
    return "\n".join([*(line.rstrip() for line in lines), recommendation(options)])
