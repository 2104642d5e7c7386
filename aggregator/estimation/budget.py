"""A work budget for one estimate: a cap on its work and a time limit, checked as it runs.

Estimation loops call :func:`charge` with the work of each step they are about
to take (one IBU step over ``k`` cells costs ``k`` units; a bootstrap replicate
costs the units of its steps). Outside :func:`limited` it does nothing; inside,
it raises :class:`WorkLimitExceeded` once the estimate's work would pass the
cap, and :class:`EstimateTimedOut` once the time limit has passed, so that a
caller can answer in bounded time instead of computing for minutes. A loop of
many like steps takes them in chunks paced by the clock (:class:`Pace`), so
that the limit is checked about every :data:`CHECK_EVERY_S` however long a
step takes on a busy machine.

The budget belongs to the thread that opened it (estimates run in a worker's
thread pool, several at once) and to the threads that thread lends it to
(:mod:`aggregator.estimation.parallel`, which runs an estimate's folds and
refits side by side); it also says how many threads one estimate may use.
A part the estimate can do without (a check of its choice) runs on a
:func:`share` of it, and stops there without stopping the estimate.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aggregator.estimation.native import native_lock as _native_lock

_local = threading.local()
# Automatic thread count: the CPUs this process may run on, at most this many.
MAX_AUTO_THREADS = 4
# A loop of steps checks its budget about this often (Pace): past the time limit it stops
# within about this long plus one step. With it, on 2 cores busy with 12 estimates at once and
# a 2 s limit (scripts/bench_estimate_deadline.py), estimates answered 0.2 to 0.35 s after the
# limit at the median and 1.0 to 1.3 s at most (3.2 s and 10.6 s with a check every 32 steps
# and the limit counted from the computation's start).
CHECK_EVERY_S = 0.1


class EstimateAborted(RuntimeError):
    """An estimate stopped before it finished because it ran out of budget."""


class WorkLimitExceeded(EstimateAborted):
    """The estimate needs more work units than its cap allows."""

    def __init__(self, limit: int):
        super().__init__(f"the estimate needs more than {limit:,} units of work")
        self.limit = limit


class EstimateTimedOut(EstimateAborted):
    """The estimate ran past its time limit."""

    def __init__(self, seconds: float):
        super().__init__(f"the estimate did not finish within {seconds:g} s")
        self.seconds = seconds


class ShareExhausted(EstimateAborted):
    """A part of an estimate that it can do without ran out of its :func:`share` of the
    budget; the part catches it and the estimate goes on without it."""

    def __init__(self):
        super().__init__("a part of the estimate ran out of its share of the budget")


@dataclass
class _Budget:
    max_work: int | None
    timeout_s: float | None
    deadline: float | None
    threads: int
    spent: int = 0
    # Threads lent this budget charge it too, under a lock of the operating system's.
    lock: Any = field(default_factory=_native_lock)
    # A share for a part the estimate can do without (share()): running out of it raises
    # ShareExhausted, and its work counts in the parent budget too, if there is one.
    optional: bool = False
    parent: _Budget | None = None

    def chain(self) -> Iterator[_Budget]:
        """This budget, then the budgets it is a share of."""
        budget: _Budget | None = self
        while budget is not None:
            yield budget
            budget = budget.parent

    def check(self) -> None:
        """Raise if the cap or the time limit is passed."""
        if self.max_work is not None and self.spent > self.max_work:
            raise ShareExhausted() if self.optional else WorkLimitExceeded(self.max_work)
        if self.deadline is not None and time.monotonic() > self.deadline:
            assert self.timeout_s is not None
            raise ShareExhausted() if self.optional else EstimateTimedOut(self.timeout_s)


class _Meter:
    """The work counted by one :func:`metered` block."""

    units = 0


def automatic_threads() -> int:
    """The CPUs this process may run on, at most :data:`MAX_AUTO_THREADS`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_AUTO_THREADS, cpus))


def threads() -> int:
    """How many threads the current estimate may use (automatic outside :func:`limited`)."""
    budget: _Budget | None = getattr(_local, "budget", None)
    return automatic_threads() if budget is None else budget.threads


def charge(units: int) -> None:
    """Count ``units`` of work against the current thread's budget, if it has one (and on
    the thread's open :func:`metered` counts)."""
    for meter in getattr(_local, "meters", ()):
        meter.units += int(units)
    budget: _Budget | None = getattr(_local, "budget", None)
    if budget is None:
        return
    chain = list(budget.chain())
    for each in chain:
        with each.lock:
            each.spent += int(units)
    # A share's limits first: they lie within its parent's.
    for each in chain:
        each.check()


def check() -> None:
    """Raise if the current thread's budget, if it has one, is past its cap or time limit
    (charging nothing)."""
    charge(0)


class Pace:
    """The chunks of a loop's steps between two checks of the budget.

    A chunk is charged (:func:`charge`) before it runs; its size follows the wall
    time of the last one: a chunk is sized to take about :data:`CHECK_EVERY_S`
    (and at most twice as many steps as the last), so the time limit is checked
    that often however slow a step is and however busy the machine, while fast
    steps run many at a time. The first chunk is one step.
    """

    def __init__(self) -> None:
        self._size = 1

    def chunks(self, steps: int, units_per_step: int) -> Iterator[int]:
        """The sizes of the chunks of ``steps`` steps, each charged ``units_per_step`` a step
        before it is yielded; the caller takes the chunk's steps before asking for the next,
        and may stop early."""
        done = 0
        while done < steps:
            chunk = min(self._size, steps - done)
            charge(chunk * units_per_step)
            started = time.monotonic()
            yield chunk
            done += chunk
            took = time.monotonic() - started
            paced = int(chunk * CHECK_EVERY_S / took) if took > 0 else 2 * chunk
            self._size = max(1, min(2 * chunk, paced))


def spent() -> int:
    """The work charged so far in the current thread's budget (0 without one)."""
    budget: _Budget | None = getattr(_local, "budget", None)
    return 0 if budget is None else budget.spent


def remaining() -> int | None:
    """The work the current thread's budget has left, the least of it and of the budgets it is
    a share of (None: no cap)."""
    budget: _Budget | None = getattr(_local, "budget", None)
    if budget is None:
        return None
    caps = [each.max_work - each.spent for each in budget.chain() if each.max_work is not None]
    return max(min(caps), 0) if caps else None


@contextmanager
def metered() -> Iterator[Callable[[], int]]:
    """Count the work the calling thread charges inside the block, with or without a budget:
    ``with metered() as work: ...`` then ``work()`` (threads the block lends its budget to
    are not counted)."""
    meter = _Meter()
    meters = getattr(_local, "meters", None)
    if meters is None:
        meters = _local.meters = []
    meters.append(meter)
    try:
        yield lambda: meter.units
    finally:
        meters.remove(meter)  # by identity: meters compare as objects


@contextmanager
def limited(
    *,
    max_work: int | None = None,
    timeout_s: float | None = None,
    threads: int = 0,
    deadline: float | None = None,
) -> Iterator[None]:
    """Run the block under a work cap and a time limit (``None``: no limit of that kind),
    on at most ``threads`` threads (0: :func:`automatic_threads`).

    The time limit runs out ``timeout_s`` from now, or at ``deadline`` (a
    :func:`time.monotonic` instant) where the caller's time started earlier (a
    request that read and waited before computing): a block entered past it
    raises :class:`EstimateTimedOut` at once."""
    if max_work is not None and max_work < 1:
        raise ValueError(f"max_work must be >= 1, got {max_work!r}")
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads!r}")
    if deadline is not None and timeout_s is None:
        raise ValueError("a deadline needs the timeout_s it ends")
    if deadline is None and timeout_s is not None:
        deadline = time.monotonic() + timeout_s
    opened = _Budget(max_work, timeout_s, deadline, threads or automatic_threads())
    opened.check()
    with lent(opened):
        yield


@contextmanager
def share(max_work: int | None) -> Iterator[None]:
    """Run a part of the estimate that it can do without (a check of its choice) on at most
    ``max_work`` units (None: any) and half the time the budget has left; past either the
    part raises :class:`ShareExhausted`, for it to catch, so that the estimate keeps the rest
    of its budget. Its work counts in the budget too. Outside :func:`limited`, only
    ``max_work`` binds."""
    parent: _Budget | None = getattr(_local, "budget", None)
    if max_work is None and parent is None:
        yield
        return
    deadline = timeout_s = None
    if parent is not None and parent.deadline is not None:
        timeout_s = max(parent.deadline - time.monotonic(), 0.0) / 2
        deadline = time.monotonic() + timeout_s
    threads = automatic_threads() if parent is None else parent.threads
    with lent(_Budget(max_work, timeout_s, deadline, threads, optional=True, parent=parent)):
        yield


def current() -> _Budget | None:
    """The current thread's budget, to lend to a thread that works for the same estimate."""
    return getattr(_local, "budget", None)


@contextmanager
def lent(budget: _Budget | None) -> Iterator[None]:
    """Run the block under ``budget`` (another thread's, from :func:`current`)."""
    previous = getattr(_local, "budget", None)
    _local.budget = budget
    try:
        yield
    finally:
        _local.budget = previous
