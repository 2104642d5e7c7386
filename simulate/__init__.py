"""``ldp-simulate``: plan a collection by simulating it, in-process or against a server.

Re-exports only; see :mod:`simulate.runner` (in-process) and
:mod:`simulate.via` (end to end).
"""

from simulate.metrics import Scores, score
from simulate.populations import Population, PopulationError
from simulate.runner import ALL_METHODS, SimulationResult, simulate
from simulate.via import SimulationError, ViaResult, run_via_server

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
