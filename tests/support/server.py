"""A real ``ldp-aggregator serve`` process for end-to-end tests, started and stopped in one place."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
HEALTH = "/api/v1/health"
STARTUP_SECONDS = 60.0
STOP_SECONDS = 30.0
LOG_TAIL_CHARS = 20_000


@dataclass
class RunningServer:
    """A started server: where it answers, its process, its data directory and its log."""

    url: str
    port: int
    process: subprocess.Popen
    data_dir: Path
    log_path: Path

    @property
    def api(self) -> str:
        return f"{self.url}/api/v1"

    def workers(self) -> list[int]:
        """The gunicorn workers' pids (the master's children other than its redis-server)."""
        pid = self.process.pid
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return []
        workers = []
        for child in children:
            try:
                if b"redis-server" not in Path(f"/proc/{child}/cmdline").read_bytes():
                    workers.append(int(child))
            except OSError:
                continue  # exited between the two reads
        return workers

    def log(self) -> str:
        """The server's output so far (its last part when long)."""
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return ""


def server_env(data_dir: Path, env: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """This process's environment without its ``LDP_*`` settings, then ``env`` (None removes)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LDP_")}
    environment["PYTHONPATH"] = str(ROOT)
    environment["LDP_DATA_DIR"] = str(data_dir)
    for key, value in (env or {}).items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    return environment


def _wait_until_up(server: RunningServer, workers: int, deadline_s: float) -> None:
    """Wait for every worker to exist (where /proc tells) and for /api/v1/health to answer 200."""
    count_workers = Path(f"/proc/{server.process.pid}/task").is_dir()
    deadline = time.monotonic() + deadline_s
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.process.returncode}")
        if not count_workers or len(server.workers()) == workers:
            try:
                if requests.get(server.url + HEALTH, timeout=1).status_code == 200:
                    return
            except requests.RequestException:  # refused, or accepted before a worker booted
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not answer {HEALTH} within {deadline_s:g} s")
        time.sleep(0.1)


def stop_server(process: subprocess.Popen) -> None:
    """SIGTERM, as an operator stops it; SIGKILL if it has not exited within 30 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def running_server(
    data_dir: Path,
    *,
    env: Mapping[str, str | None] | None = None,
    args: Sequence[str] = (),
    workers: int = 2,
    log_path: Path | None = None,
    startup_s: float = STARTUP_SECONDS,
) -> Iterator[RunningServer]:
    """Run ``python -m aggregator.cli serve`` on a free loopback port until the block ends.

    The server gets its own embedded Redis in ``data_dir`` and the
    environment of :func:`server_env` (``env`` adds to it; a None value
    removes a variable). The block starts once every worker has booted and
    ``/api/v1/health`` answers 200; on leaving it the server is stopped with
    SIGTERM. Its output goes to ``log_path`` (default: ``server.log`` next to
    ``data_dir``, appended to): the error says it when the server cannot start,
    and it is written to stderr when the block raises.

    Parameters
    ----------
    data_dir
        The server's data directory (``LDP_DATA_DIR``); a second server on the
        same directory finds the first one's data.
    env
        Settings for this server, e.g. ``{"LDP_ADMIN_TOKEN": ...}``.
    args
        More ``serve`` options, after ``--host``, ``--port`` and ``--workers``.
    workers
        gunicorn workers to start and wait for.
    log_path
        Where the server's stdout and stderr go.
    startup_s
        How long to wait for the server to answer before failing.

    Yields
    ------
    RunningServer
        Its URL (``http://127.0.0.1:PORT``), port, process, data directory and log.
    """
    port = free_port()
    log_path = log_path or data_dir.parent / "server.log"
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    command = [
        *(sys.executable, "-m", "aggregator.cli", "serve"),
        *("--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)),
        *args,
    ]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            cwd=data_dir.parent,
            env=server_env(data_dir, env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = RunningServer(f"http://127.0.0.1:{port}", port, process, data_dir, log_path)
    try:
        try:
            _wait_until_up(server, workers, startup_s)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; its log ({log_path}):\n{server.log()}") from None
        try:
            yield server
        except BaseException:
            sys.stderr.write(f"\n--- server log ({log_path}) ---\n{server.log()}\n---\n")
            raise
    finally:
        stop_server(process)
