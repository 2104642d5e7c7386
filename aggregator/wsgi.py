"""Running the app under gunicorn, in-process (used by ``ldp-aggregator serve``).

Each worker builds its own app with :func:`aggregator.app.create_app` from
the environment, after the fork, so no connection is shared across processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication

from aggregator.app import create_app

# Estimates of large grids take seconds; a worker is not killed for that.
WORKER_TIMEOUT_S = 120
# Threaded workers keep client connections alive: a single-report POST then costs about
# 2 ms instead of 10 ms with a new connection each time (scripts/bench_ingest.py).
THREADS_PER_WORKER = 4


class _Server(BaseApplication):
    def __init__(self, options: dict[str, Any], app_factory: Callable[[], Any]) -> None:
        self.options = options
        self.app_factory = app_factory
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return self.app_factory()


def gunicorn_options(*, host: str, port: int, workers: int) -> dict[str, Any]:
    """The worker setup of ``serve`` (the ingestion benchmark runs its baseline with it too)."""
    return {
        "bind": f"{host}:{port}",
        "workers": workers,
        "worker_class": "gthread",
        "threads": THREADS_PER_WORKER,
        "timeout": WORKER_TIMEOUT_S,
        "accesslog": "-",
        "preload_app": False,
    }


def run_gunicorn(
    *, host: str, port: int, workers: int, app_factory: Callable[[], Any] = create_app
) -> None:
    """Serve ``app_factory()`` (built in each worker) until interrupted."""
    _Server(gunicorn_options(host=host, port=port, workers=workers), app_factory).run()
