"""``ldp-simulate``: plan a collection by simulating it, in-process or against a server.

Re-exports only; see :mod:`simulate.runner` (in-process) and
:mod:`simulate.via` (end to end).
"""

from importlib.util import find_spec

# What the simulation imports beyond the aggregator: the `simulate` extra.
EXTRA_MODULES = ("tqdm", "matplotlib", "ot")


def missing_modules(names: tuple[str, ...] = EXTRA_MODULES) -> list[str]:
    """The modules of ``names`` that cannot be imported here."""
    return [name for name in names if find_spec(name) is None]


if _missing := missing_modules():
    raise ModuleNotFoundError(
        "ldp-simulate needs the simulate extra: pip install 'ldp-collect[simulate]' "
        f"(missing: {', '.join(_missing)})"
    )

from simulate.metrics import Scores, score  # noqa: E402
from simulate.populations import Population, PopulationError  # noqa: E402
from simulate.runner import ALL_METHODS, SimulationResult, simulate  # noqa: E402
from simulate.via import SimulationError, ViaResult, run_via_server  # noqa: E402

__all__ = [
    "ALL_METHODS",
    "Population",
    "PopulationError",
    "Scores",
    "SimulationError",
    "SimulationResult",
    "ViaResult",
    "run_via_server",
    "score",
    "simulate",
]
