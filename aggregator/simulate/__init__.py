"""``ldp-simulate``: plan a collection by simulating it, in-process or against a server.

Re-exports only; see :mod:`aggregator.simulate.runner` (in-process) and
:mod:`aggregator.simulate.via` (end to end).
"""

from aggregator.simulate.metrics import Scores, score
from aggregator.simulate.populations import Population, PopulationError
from aggregator.simulate.runner import ALL_METHODS, SimulationResult, simulate
from aggregator.simulate.via import SimulationError, ViaResult, run_via_server

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
