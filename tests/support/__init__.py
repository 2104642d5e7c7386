"""Helpers the tests share (importable as ``support``: ``tests/`` is on the path of every test).

* :func:`free_port`: a loopback port nothing listens on; :func:`free_port_run`, a run of
  them for a Redis Cluster;
* :func:`unique_id`: a campaign id no other test uses (tests share ``live_server``);
* :func:`running_server`: a real ``ldp-aggregator serve`` process for the
  length of a ``with`` block (:class:`RunningServer`), and :func:`stop_server`.
"""

from support.ids import unique_id
from support.ports import free_port, free_port_run
from support.server import RunningServer, running_server, server_env, stop_server

__all__ = [
    "RunningServer",
    "free_port",
    "free_port_run",
    "running_server",
    "server_env",
    "stop_server",
    "unique_id",
]
