"""An estimate's independent pieces of work (cross-validation folds, bootstrap refits) side by side.

The compiled IBU loops (numba, ``nogil``) around FFTW's transforms release
Python's lock, so the folds of a cross-validation and the refits of a bootstrap
on a grid can run on all the CPUs one estimate may use
(:func:`aggregator.estimation.budget.threads`); callers pass ``alone`` where
the steps hold the lock (``Channel.steps_run_in_parallel``). A channel keeps
FFT buffers and plans per thread, so the helper threads live in one pool for
the life of the process rather than being started per call.

:func:`map_ordered` (and :func:`beside`) give the same results, in the same order, whatever the
number of threads: the items are drawn one at a time under a lock (a generator
that draws random numbers draws them in the same order), and the caller sums
or compares the results in their order. Each helper runs under the caller's
work budget, so the work cap and the time limit stop all of them.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from aggregator.estimation import budget
from aggregator.estimation.native import native_lock, native_queue, start_native_thread

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")

_pool_lock = native_lock()
_tasks: Any = None  # the pool's queue of callables, made with its first thread
_pool_size = 0
# Set in a thread while it works for a map_ordered call: a call made from there runs inline
# (a pool thread waiting on the pool could otherwise wait for itself).
_inside = threading.local()


def _reset_after_fork() -> None:
    """A forked child has none of its parent's pool threads: it starts its own."""
    global _pool_lock, _tasks, _pool_size
    _pool_lock, _tasks, _pool_size = native_lock(), None, 0


os.register_at_fork(after_in_child=_reset_after_fork)


def _serve(tasks: Any) -> None:
    while True:
        tasks.get()()


def _pool(size: int) -> Any:
    """The pool's queue, with at least ``size`` threads serving it."""
    global _tasks, _pool_size
    with _pool_lock:
        if _tasks is None:
            _tasks = native_queue()
        while _pool_size < size:
            start_native_thread(functools.partial(_serve, _tasks))
            _pool_size += 1
        return _tasks


def map_ordered(
    function: Callable[[_Item], _Result], items: Iterable[_Item], *, alone: bool = False
) -> list[_Result]:
    """``[function(item) for item in items]``, on up to ``budget.threads()`` threads (only
    the caller's with ``alone``: work that holds Python's lock gains nothing from more).

    The calling thread works too. The first exception raised (by ``function``
    or by drawing an item) stops the threads taking more items and is raised
    here once the others have finished theirs.
    """
    helpers = 0 if alone else budget.threads() - 1
    if isinstance(items, list | tuple):
        helpers = min(helpers, len(items) - 1)
    if helpers <= 0 or getattr(_inside, "active", False):
        return [function(item) for item in items]
    numbered = enumerate(items)
    results: dict[int, _Result] = {}
    failures: list[BaseException] = []
    taking = native_lock()  # guards numbered, failures and the counts below
    finished = native_lock()  # held until the last helper that started has finished
    finished.acquire()
    state = {"running": 0, "closed": False}
    lent = budget.current()

    def work() -> None:
        _inside.active = True
        try:
            while True:
                with taking:
                    if failures:
                        return
                    try:
                        index, item = next(numbered)
                    except StopIteration:
                        return
                    except BaseException as exc:
                        failures.append(exc)
                        return
                try:
                    results[index] = function(item)
                except BaseException as exc:
                    with taking:
                        failures.append(exc)
                    return
        finally:
            _inside.active = False

    def helper() -> None:
        with taking:
            if state["closed"]:  # the caller finished every item before this thread started
                return
            state["running"] += 1
        try:
            with budget.lent(lent):
                work()
        finally:
            with taking:
                state["running"] -= 1
                if state["closed"] and state["running"] == 0:
                    finished.release()

    tasks = _pool(helpers)
    for _ in range(helpers):
        tasks.put(helper)
    work()
    with taking:
        state["closed"] = True
        wait = state["running"] > 0
    if wait:
        finished.acquire()
    if failures:
        raise failures[0]
    return [results[index] for index in range(len(results))]


def beside(function: Callable[[], _Result], *, alone: bool = False) -> Callable[[], _Result]:
    """Start ``function`` on a pool thread, beside the caller's own work; the function
    returned waits for its result (or raises its exception).

    With one thread (or ``alone``, or from inside :func:`map_ordered`) ``function`` runs
    when its result is first asked for.
    """
    outcome: list[tuple[bool, Any]] = []
    if alone or budget.threads() <= 1 or getattr(_inside, "active", False):

        def later() -> _Result:
            if not outcome:
                outcome.append(_run(function))
            return _unwrap(outcome[0])

        return later
    finished = native_lock()
    finished.acquire()
    lent = budget.current()

    def task() -> None:
        _inside.active = True
        try:
            with budget.lent(lent):
                outcome.append(_run(function))
        finally:
            _inside.active = False
            finished.release()

    _pool(1).put(task)

    def result() -> _Result:
        with finished:  # released once the task has finished; free from then on
            return _unwrap(outcome[0])

    return result


def _run(function: Callable[[], _Result]) -> tuple[bool, Any]:
    """``(True, function())``, or ``(False, the exception it raised)``."""
    try:
        return True, function()
    except BaseException as exc:
        return False, exc


def _unwrap(outcome: tuple[bool, Any]) -> Any:
    ok, value = outcome
    if not ok:
        raise value
    return value
