"""The client's state directory: the user secret, pins, the budget ledger and the queue.

Layout (the directory is ``0700``, every file ``0600``)::

    secret        32 random bytes, created once, never rewritten
    state.json    pins, ledger, queue and enrollment tokens, one JSON document
    lock          an advisory lock (``flock``) taken around every read-modify-write

Pins, ledger and queue live in one document so that spending budget and
queueing the report it paid for are one atomic step: the document is written
to a temporary file, flushed to disk and renamed over the old one, so a
process that dies at any point leaves either the old state or the new one.
Two processes that report at the same time take the lock in turn.
This module keeps the document; the rules that read and change it live in
:mod:`client.ledger` (pins and budget) and :mod:`client.outbox` (the queue).
The document never holds a true value: pins hold the campaign spec, the
ledger holds costs keyed by :func:`client.memo.value_tag` and each campaign's
report in its current period (its noisy payload and value tag), the queue holds
the noisy payloads exactly as they will be sent.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.errors import StateError
from client.memo import SECRET_BYTES

STATE_VERSION = 1
SECRET_FILE = "secret"  # noqa: S105 - a file name, not a password
STATE_FILE = "state.json"
LOCK_FILE = "lock"
DEFAULT_LOCK_TIMEOUT_S = 30.0
_LOCK_POLL_S = 0.02


def default_state_dir() -> Path:
    """The default state directory, read from the environment when called.

    ``$LDP_CLIENT_HOME``, else ``$XDG_STATE_HOME/ldp-client``, else
    ``~/.local/state/ldp-client``.
    """
    home = os.environ.get("LDP_CLIENT_HOME")
    if home:
        return Path(home).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "ldp-client"


def campaign_key(server: str, campaign_id: str) -> str:
    """Campaign ids are per server: the ledger and the pins are keyed by both."""
    return f"{campaign_id}@{server}"


@dataclass
class PeriodReport:
    """The report this device made in a campaign's period, exactly as it was sent.

    ``period`` is the period's key (:func:`shared.periods.period_key`), ``tag`` the
    :func:`client.memo.value_tag` of the answer it carries.
    """

    period: str
    tag: str
    payload: dict[str, Any]

    @property
    def report_id(self) -> str:
        return str(self.payload["report_id"])

    def to_dict(self) -> dict[str, Any]:
        return {"period": self.period, "tag": self.tag, "payload": self.payload}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PeriodReport:
        payload = _typed(data, "payload", dict)
        if not isinstance(payload.get("report_id"), str):
            raise ValueError("a period's report has no report_id")
        return cls(
            period=_typed(data, "period", str), tag=_typed(data, "tag", str), payload=payload
        )


@dataclass
class CampaignRecord:
    """A pinned campaign, what has been spent in it, and its report in the latest period."""

    server: str
    campaign_id: str
    spec: dict[str, Any]
    spec_hash: str
    pinned_at: float
    # value tag -> epsilon charged for it
    charges: dict[str, float] = field(default_factory=dict)
    # None before the first report, after a refusal of it, and in state written before periods.
    period_report: PeriodReport | None = None

    @property
    def spent(self) -> float:
        return math.fsum(self.charges.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "campaign_id": self.campaign_id,
            "spec": self.spec,
            "spec_hash": self.spec_hash,
            "pinned_at": self.pinned_at,
            "charges": self.charges,
            "period_report": None if self.period_report is None else self.period_report.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CampaignRecord:
        return cls(
            server=_typed(data, "server", str),
            campaign_id=_typed(data, "campaign_id", str),
            spec=_typed(data, "spec", dict),
            spec_hash=_typed(data, "spec_hash", str),
            pinned_at=float(_typed(data, "pinned_at", (int, float))),
            charges={
                str(tag): float(_number(cost))
                for tag, cost in _typed(data, "charges", dict).items()
            },
            period_report=(
                None
                if data.get("period_report") is None
                else PeriodReport.from_dict(_typed(data, "period_report", dict))
            ),
        )


@dataclass
class QueuedReport:
    """A perturbed report waiting to be delivered, exactly as it will be sent."""

    server: str
    campaign_id: str
    payload: dict[str, Any]
    created_at: float
    attempts: int = 0
    next_attempt_at: float = 0.0
    last_error: str | None = None

    @property
    def report_id(self) -> str:
        return str(self.payload["report_id"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "campaign_id": self.campaign_id,
            "payload": self.payload,
            "created_at": self.created_at,
            "attempts": self.attempts,
            "next_attempt_at": self.next_attempt_at,
            "last_error": self.last_error,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QueuedReport:
        payload = _typed(data, "payload", dict)
        if not isinstance(payload.get("report_id"), str):
            raise ValueError("a queued report has no report_id")
        last_error = data.get("last_error")
        return cls(
            server=_typed(data, "server", str),
            campaign_id=_typed(data, "campaign_id", str),
            payload=payload,
            created_at=float(_typed(data, "created_at", (int, float))),
            attempts=_typed(data, "attempts", int),
            next_attempt_at=float(_typed(data, "next_attempt_at", (int, float))),
            last_error=last_error if isinstance(last_error, str) else None,
        )


@dataclass
class RejectedReport:
    """A report the server refused for good (e.g. the campaign closed); kept for the record."""

    report: QueuedReport
    error: dict[str, Any]
    rejected_at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "report": self.report.to_dict(),
            "error": self.error,
            "rejected_at": self.rejected_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RejectedReport:
        return cls(
            report=QueuedReport.from_dict(_typed(data, "report", dict)),
            error=_typed(data, "error", dict),
            rejected_at=float(_typed(data, "rejected_at", (int, float))),
        )


@dataclass
class State:
    """Everything in ``state.json``."""

    campaigns: dict[str, CampaignRecord] = field(default_factory=dict)
    queue: list[QueuedReport] = field(default_factory=list)
    rejected: list[RejectedReport] = field(default_factory=list)
    # Spent in campaigns the user has since forgotten: still spent.
    forgotten_spent: float = 0.0
    # campaign key -> unused enrollment tokens, each good for one report
    enrollments: dict[str, list[str]] = field(default_factory=dict)

    @property
    def total_spent(self) -> float:
        return math.fsum([self.forgotten_spent, *(c.spent for c in self.campaigns.values())])

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "campaigns": {key: record.to_dict() for key, record in self.campaigns.items()},
            "queue": [entry.to_dict() for entry in self.queue],
            "rejected": [entry.to_dict() for entry in self.rejected],
            "forgotten_spent": self.forgotten_spent,
            "enrollments": self.enrollments,
        }

    @classmethod
    def from_dict(cls, data: Any) -> State:
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise ValueError(f"not a version {STATE_VERSION} state document")
        return cls(
            campaigns={
                str(key): CampaignRecord.from_dict(record)
                for key, record in _typed(data, "campaigns", dict).items()
            },
            queue=[QueuedReport.from_dict(entry) for entry in _typed(data, "queue", list)],
            rejected=[RejectedReport.from_dict(entry) for entry in _typed(data, "rejected", list)],
            forgotten_spent=float(_number(data.get("forgotten_spent", 0.0))),
            enrollments=_enrollments(data.get("enrollments", {})),
        )


def _enrollments(data: Any) -> dict[str, list[str]]:
    if not isinstance(data, dict) or not all(
        isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)
        for tokens in data.values()
    ):
        raise ValueError("enrollments must map campaigns to lists of tokens")
    return {str(key): list(tokens) for key, tokens in data.items()}


def _typed(data: Any, name: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(data, dict):
        raise ValueError("expected an object")
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{name} is missing or has the wrong type")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("expected a finite number")
    return float(value)


class StateStore:
    """The state directory. Every method that reads and writes holds the lock.

    Parameters
    ----------
    directory : path
        Created (``0700``) if missing; a directory others can read is tightened.
    lock_timeout : float
        Seconds to wait for another process holding the lock.
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S
    ):
        self.directory = Path(directory)
        self.lock_timeout = lock_timeout

    def _prepare(self) -> None:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            mode = stat.S_IMODE(self.directory.stat().st_mode)
            if mode & 0o077:
                os.chmod(self.directory, mode & 0o700)
        except OSError as exc:
            raise StateError(f"cannot use the state directory {self.directory}: {exc}") from exc

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory's exclusive lock (waits up to ``lock_timeout`` seconds)."""
        self._prepare()
        path = self.directory / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StateError(f"cannot open the lock file {path}: {exc}") from exc
        try:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StateError(
                            f"the state directory {self.directory} is locked by another process"
                        ) from None
                    time.sleep(_LOCK_POLL_S)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[State]:
        """Lock, load, let the caller change the state, and save it atomically unless it raised.

        The new state is flushed to disk and renamed over the old one either
        way; ``durable`` also flushes the directory, so that the rename itself
        survives a power cut. Changes whose loss is harmless (taking a
        delivered report off the queue: it is sent again and counted once)
        can skip that.
        """
        with self.locked():
            state = self._load()
            yield state
            document = json.dumps(state.to_dict(), indent=1, sort_keys=True, allow_nan=False)
            self._write(STATE_FILE, document.encode(), durable=durable)

    def read(self) -> State:
        """A consistent snapshot of the state (under the lock)."""
        with self.locked():
            return self._load()

    def secret(self) -> bytes:
        """The user secret, created from the operating system's CSPRNG on first use."""
        with self.locked():
            path = self.directory / SECRET_FILE
            try:
                secret = path.read_bytes()
            except FileNotFoundError:
                secret = os.urandom(SECRET_BYTES)
                self._write(SECRET_FILE, secret)
                return secret
            except OSError as exc:
                raise StateError(f"cannot read the user secret {path}: {exc}") from exc
            if len(secret) != SECRET_BYTES:
                # Never replace it silently: a new secret would undo memoization.
                raise StateError(
                    f"the user secret {path} is damaged ({len(secret)} bytes, expected "
                    f"{SECRET_BYTES}); restore it from a backup"
                )
            return secret

    def _load(self) -> State:
        path = self.directory / STATE_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return State()
        except OSError as exc:
            raise StateError(f"cannot read {path}: {exc}") from exc
        try:
            return State.from_dict(json.loads(raw))
        except (ValueError, TypeError, AttributeError) as exc:
            raise StateError(
                f"{path} is damaged ({exc}); move it away to start afresh (the budget already "
                "spent will then be forgotten)"
            ) from exc

    def _write(self, name: str, data: bytes, *, durable: bool = True) -> None:
        path = self.directory / name
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp")
        except OSError as exc:
            raise StateError(f"cannot write {path}: {exc}") from exc
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                # Always: a rename of unflushed data can leave an empty file after a power cut.
                os.fsync(handle.fileno())
            os.replace(tmp, path)
            if durable:
                dir_fd = os.open(self.directory, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StateError(f"cannot write {path}: {exc}") from exc
