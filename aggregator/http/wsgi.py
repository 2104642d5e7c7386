"""Running the app under gunicorn, in-process (used by ``ldp-aggregator serve``).

Each worker builds its own app with the factory it is given (``serve`` gives
:func:`aggregator.app.create_app` bound to the server's settings, which name the
Redis it opened), after the fork and after gevent has patched the worker, so no
connection or lock is shared across processes and every one the app creates is
cooperative.

The workers are gevent workers: each connection is a greenlet, so clients that
send their request slowly hold only a greenlet each while the worker goes on
serving others (a threaded worker would give each of them a thread until it
finished). CPU-bound estimates run in gevent's native thread pool
(:func:`aggregator.http.estimates.off_loop`) so that they do not stop the worker's loop.

The workers count their metrics in one fresh directory per server start
(prometheus_client's multiprocess mode, :func:`aggregator.http.metrics.enable_multiprocess`),
so that ``/metrics``, whichever worker answers it, sums every worker's counts; the
directory is removed when the server stops.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication
from prometheus_client.multiprocess import mark_process_dead

from aggregator.estimation.native import prepare_compiler
from aggregator.http.metrics import enable_multiprocess

# The master kills a worker whose loop has not checked in for this long. Estimates run off
# the loop (aggregator.http.estimates.off_loop), so even long ones do not stop its check-ins.
WORKER_TIMEOUT_S = 120
WORKER_CLASS = "gevent"
# Connections (greenlets) a worker holds at once, idle keep-alive and slow ones included;
# beyond it the worker stops accepting until one closes.
WORKER_CONNECTIONS = 1000
# Seconds an idle connection is kept open for its next request: a single-report POST on a
# kept-alive connection costs about 2 ms instead of 10 ms (scripts/bench_ingest.py). The
# gevent worker reads every request head (request line and headers) under this timeout too,
# so a client that dribbles its headers is cut off after it.
KEEPALIVE_S = 5
# gevent patches a worker after gunicorn and ``import redis`` have imported ssl, and warns
# about every module that kept a direct reference to the unpatched ssl.SSLContext. The only
# one here is redis.asyncio.connection (``import redis`` imports it): redis-py's asyncio
# client, which the app does not use. A warning that names any other module still shows.
_SSL_WARNING_NAMING_ONLY_REDIS_ASYNCIO = (
    r"Monkey-patching ssl after ssl has already been imported .*"
    r"Modules that had direct imports \(NOT patched\): "
    r"\['redis\.asyncio\.connection \([^)]*\)'\]\. $"
)


def _exit_now(signum: int, frame: Any) -> None:
    os._exit(0)


def _stop_while_booting(server: Any, worker: Any) -> None:
    """gunicorn's ``post_fork``: a stop signal that arrives before the worker is ready ends it.

    Until the worker installs its own handlers it has the master's, which only queue
    the signal in the master's (now copied) queue: a SIGTERM sent while a new worker
    still starts (gevent's patching takes about 0.1 s) would be lost, and the master
    would wait its graceful timeout (30 s) before killing the worker. The worker has
    accepted nothing yet, so exiting at once loses nothing.
    """
    for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(stop, _exit_now)


def _forget_dead_workers(metrics_dir: str) -> Callable[[Any, Any], None]:
    """gunicorn's ``child_exit``: drop a dead worker's live gauges (its counts stay summed)."""

    def child_exit(server: Any, worker: Any) -> None:
        mark_process_dead(worker.pid, metrics_dir)

    return child_exit


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


def gunicorn_options(
    *,
    host: str,
    port: int,
    workers: int,
    control_socket: str | None = None,
    metrics_dir: str | None = None,
) -> dict[str, Any]:
    """The worker setup of ``serve`` (the ingestion benchmark runs its baseline with it too).

    ``control_socket`` is the path of gunicorn's control socket; without one, the
    control socket is off (gunicorn's default path is one per user, which every
    server would share). ``metrics_dir`` is the workers' multiprocess metrics
    directory, cleaned of each worker that exits.
    """
    control = (
        {"control_socket": control_socket} if control_socket else {"control_socket_disable": True}
    )
    metrics = {} if metrics_dir is None else {"child_exit": _forget_dead_workers(metrics_dir)}
    return {
        **control,
        **metrics,
        "bind": f"{host}:{port}",
        "workers": workers,
        "worker_class": WORKER_CLASS,
        "worker_connections": WORKER_CONNECTIONS,
        "keepalive": KEEPALIVE_S,
        "post_fork": _stop_while_booting,
        "timeout": WORKER_TIMEOUT_S,
        "accesslog": "-",
        "preload_app": False,
    }


def run_gunicorn(
    *,
    host: str,
    port: int,
    workers: int,
    app_factory: Callable[[], Any],
    control_socket: str | None = None,
) -> None:
    """Serve ``app_factory()`` (built in each worker) until interrupted.

    The workers' metrics go to a new directory (``$TMPDIR/ldp-metrics-*``, any
    ``PROMETHEUS_MULTIPROC_DIR`` given is replaced), removed when the server stops.
    numba (the ``fast`` extra) is set up here, before gevent patches the workers
    (:func:`aggregator.estimation.native.prepare_compiler`).
    """
    warnings.filterwarnings("ignore", message=_SSL_WARNING_NAMING_ONLY_REDIS_ASYNCIO)
    prepare_compiler()
    metrics_dir = tempfile.mkdtemp(prefix="ldp-metrics-")
    try:
        enable_multiprocess(metrics_dir)
        options = gunicorn_options(
            host=host,
            port=port,
            workers=workers,
            control_socket=control_socket,
            metrics_dir=metrics_dir,
        )
        _Server(options, app_factory).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
