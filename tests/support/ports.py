"""Loopback ports for the servers the tests start."""

from __future__ import annotations

import random
import socket


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive free ports whose cluster bus ports (+10000) are free too."""
    # From a random start: processes forming clusters at once rarely try the same run.
    bases = list(range(21000, 45000, 97))
    start = random.randrange(len(bases))
    for base in bases[start:] + bases[:start]:
        ports = [*range(base, base + count), *range(base + 10000, base + 10000 + count)]
        try:
            for port in ports:
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no run of free ports")
