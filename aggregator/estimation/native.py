"""Threads and locks of the operating system's, even where gevent has patched the standard ones.

Estimates run in native threads (gevent's thread pool under the gevent worker,
see ``aggregator.http.estimates.off_loop``); gevent's patched locks, queues and
threads are meant for greenlets on the worker's event loop. The originals are
looked up at call time, so a process patched after this module was imported
still gets them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def _original(module: str, name: str) -> Any:
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched(module):
        return monkey.get_original(module, name)
    return getattr(importlib.import_module(module), name)


def native_lock() -> Any:
    """A new lock of the operating system's."""
    return _original("_thread", "allocate_lock")()


def native_queue() -> Any:
    """A new unbounded FIFO queue whose ``get`` blocks a native thread."""
    return _original("queue", "SimpleQueue")()


def start_native_thread(function: Callable[[], object]) -> None:
    """Run ``function`` in a new native thread (which ends with the process)."""
    _original("_thread", "start_new_thread")(function, ())


def prepare_compiler() -> None:
    """Set numba up now, if it is installed, so that its locks are the operating system's:
    to be called before gevent patches the process (``serve`` calls it before it starts its
    workers, which inherit it).

    numba makes its locks (its compiler's, its typing context's) when it is imported and
    when its CPU target is first set up. Made after gevent has patched a worker (the
    estimation loads its compiled loops on first use, in gevent's thread pool) they are
    gevent's, and native threads loading loops at the same time could wait on one of them
    forever (numba issue 1556): under load an estimate never answered, and its pool thread
    was lost to the worker.
    """
    try:
        from numba.core.registry import cpu_target
    except ImportError:
        return
    # Both are built on first use, each with its locks.
    _ = (cpu_target.typing_context, cpu_target.target_context)
