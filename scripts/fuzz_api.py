"""Bad input at scale against a real server: schemathesis on every operation, then raw abuse.

1. Starts Redis (AOF on) and ``ldp-aggregator serve`` (2 workers), creates a
   k-RR campaign and one that requires enrollment.
2. For every operation of the published OpenAPI document, schemathesis
   generates requests (``--mode negative``: schema-violating input; or
   ``positive``/``all``) with the admin token, until ``--requests`` have been
   sent in total. Each answer must not be a 5xx, and when it is a 4xx the
   stored state (campaigns, counts, streams, tokens; not the rate-limit and
   cache keys) must be exactly as before the request.
3. Raw HTTP abuse: a header far over the limit, a body far over the limit,
   invalid UTF-8 bodies, and slow clients (connections that dribble their
   headers) while a normal request must still be served promptly.

Run from the repository root::

    python scripts/fuzz_api.py                      # 10,000 generated requests
    python scripts/fuzz_api.py --requests 500       # smoke run

Prints a markdown table, writes section ``fuzz`` of RELIABILITY.md unless
``--no-write``, exits 1 on any 5xx, crash or state change.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import redis  # noqa: E402
import requests  # noqa: E402
import schemathesis  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from load_harness import ADMIN_TOKEN, RedisProcess, ServerProcess  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

KRR = {"id": "fuzz", "title": "Fuzz", "mechanism": "krr", "epsilon": 1.0, "domain": ["a", "b"]}
ENROLLED = {**KRR, "id": "fuzz-enrolled", "enrollment_required": True}
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
VOLATILE = (b"ratelimit", b":estimate:")


def state_digest(connection: redis.Redis) -> str:
    """A digest of everything stored except rate-limit counters and cached estimates.

    Redis digests each value itself (``DEBUG DIGEST-VALUE``), so a set of
    thousands of enrollment tokens costs one round trip, not a transfer.
    """
    keys = sorted(
        k for k in connection.scan_iter("*", count=1000) if not any(part in k for part in VOLATILE)
    )
    digests = connection.execute_command("DEBUG", "DIGEST-VALUE", *keys) if keys else []
    return hashlib.sha256(repr(list(zip(keys, digests, strict=True))).encode()).hexdigest()


def generated(server_url: str, connection: redis.Redis, total: int, mode: str) -> dict:
    """Schemathesis requests on every operation; 5xx and state changes by 4xx are counted."""
    schema = schemathesis.openapi.from_url(f"{server_url}/api/v1/openapi.json")
    modes = {
        "negative": [GenerationMode.NEGATIVE],
        "positive": [GenerationMode.POSITIVE],
        "all": [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    }[mode]
    operations = [result.ok() for result in schema.get_all_operations()]
    per_operation = -(-total // len(operations))
    tally: Counter = Counter()
    failures: list[str] = []
    # Hypothesis stops early once it has tried what it finds distinct: new seeds, new rounds.
    for round_seed in range(1000):
        if tally["requests"] >= total:
            break
        for operation in operations:
            args = (per_operation, server_url, connection, tally, failures, round_seed)
            try:
                _fuzz_operation(operation, modes, *args)
            except Unsatisfiable:
                # Nothing in the operation can be made invalid (no parameters, no body).
                _fuzz_operation(operation, [GenerationMode.POSITIVE], *args)
    return {"tally": tally, "failures": failures, "operations": len(operations)}


def _fuzz_operation(
    operation, modes, examples, server_url, connection, tally, failures, round_seed
) -> None:
    strategy = st.one_of(*(operation.as_strategy(generation_mode=m) for m in modes))

    @seed(round_seed)
    @given(case=strategy)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def send(case) -> None:
        params = case.path_parameters or {}
        if "campaign_id" in params and tally["requests"] % 2 == 0:
            params["campaign_id"] = KRR["id"] if tally["requests"] % 4 else ENROLLED["id"]
        before = state_digest(connection)
        try:
            response = case.call(base_url=server_url, headers=AUTH, timeout=30)
        except requests.RequestException as exc:
            failures.append(f"{case.method} {case.formatted_path}: no answer ({exc})")
            return
        tally["requests"] += 1
        tally[f"{response.status_code // 100}xx"] += 1
        if response.status_code >= 500:
            failures.append(f"{case.method} {case.formatted_path}: {response.status_code}")
        elif response.status_code >= 400 and state_digest(connection) != before:
            failures.append(
                f"{case.method} {case.formatted_path}: {response.status_code} changed the state"
            )

    send()


def raw_request(port: int, data: bytes, *, timeout: float = 10) -> int:
    """Send bytes as they are; the status code of the answer (0 if the connection closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        # The server may answer (413, 400) and close before it has read everything.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while b"\r\n" not in answer:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                answer += chunk
    try:
        return int(answer.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def post_bytes(path: str, body: bytes, *, extra: bytes = b"") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n".encode()
        + extra
        + b"Connection: close\r\n\r\n"
        + body
    )


def abuse(server: ServerProcess, connection: redis.Redis) -> list[tuple[str, str, bool]]:
    """Oversized headers and bodies, invalid UTF-8, slow clients: (case, outcome, ok)."""
    results = []
    reports = f"/api/v1/campaigns/{KRR['id']}/reports"
    before = state_digest(connection)
    huge_header = b"X-Padding: " + b"a" * 100_000 + b"\r\n"
    status = raw_request(server.port, post_bytes(reports, b"{}", extra=huge_header))
    results.append(("100 kB header", str(status), 400 <= status < 500 or status == 0))
    big = b'{"reports": [' + b'{"report_id": "x", "value": "a"},' * 200_000 + b"{}]}"
    status = raw_request(server.port, post_bytes(reports, big))
    outcome = str(status) if status else "connection closed early, no answer"
    results.append((f"{len(big) / 1e6:.1f} MB body", outcome, status in (413, 0)))
    for name, body in (
        ("invalid UTF-8 in a string", b'{"report_id": "\xff\xfe", "value": "a"}'),
        ("lone surrogate escape", b'{"report_id": "\\ud800", "value": "a"}'),
        ("overlong UTF-8", b'{"report_id": "\xc0\xaf", "value": "a"}'),
    ):
        status = raw_request(server.port, post_bytes(reports, body))
        results.append((name, str(status), 400 <= status < 500))
    # Slow clients: 30 connections send their request line and then a byte at a time.
    slow = []
    for _ in range(30):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(b"POST " + reports.encode() + b" HTTP/1.1\r\nHost: x\r\n")
        slow.append(sock)
    started = time.monotonic()
    for _ in range(3):
        for sock in slow:
            with contextlib.suppress(OSError):
                sock.sendall(b"X")
        time.sleep(0.5)
    try:
        status = requests.get(f"{server.url}/api/v1/campaigns/{KRR['id']}", timeout=10).status_code
        outcome = f"{status} after {time.monotonic() - started:.1f} s (1.5 s of it the dribbling)"
    except requests.Timeout:
        status, outcome = 0, "no answer within 10 s: the slow clients hold every worker"
    results.append(
        ("a normal request while 30 slow clients dribble headers", outcome, status == 200)
    )
    for sock in slow:
        sock.close()
    unchanged = state_digest(connection) == before
    results.append(
        ("state after all of the above", "unchanged" if unchanged else "CHANGED", unchanged)
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--mode", choices=("negative", "positive", "all"), default="negative")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="ldp-fuzz-"))
    redis_proc = RedisProcess(base / "redis", "everysec")
    redis_proc.start()
    server = ServerProcess(redis_proc.url, 2, base / "server.log")
    try:
        for spec in (KRR, ENROLLED):
            requests.post(f"{server.url}/api/v1/campaigns", json=spec, headers=AUTH, timeout=10)
        requests.post(
            f"{server.url}/api/v1/campaigns/{KRR['id']}/reports",
            json={"report_id": str(uuid.uuid4()), "value": "a"},
            timeout=10,
        )
        connection = redis_proc.client()
        started = time.monotonic()
        fuzz = generated(server.url, connection, args.requests, args.mode)
        seconds = time.monotonic() - started
        raw = abuse(server, connection)
        alive = (
            server.process.poll() is None
            and requests.get(f"{server.url}/api/v1/health", timeout=10).ok
        )
    finally:
        server.stop()
        redis_proc.stop()
        shutil.rmtree(base, ignore_errors=True)
    tally = fuzz["tally"]
    lines = [
        "| | |",
        "|---|---|",
        f"| generated requests ({args.mode}), operations | {tally['requests']:,}, "
        f"{fuzz['operations']} |",
        f"| answers 2xx / 4xx / 5xx | {tally['2xx']:,} / {tally['4xx']:,} / **{tally['5xx']}** |",
        f"| failures (5xx, no answer, state changed by a 4xx) | **{len(fuzz['failures'])}** |",
        f"| time | {seconds:.0f} s |",
        *(f"| {case} | {outcome}{'' if ok else ' **FAIL**'} |" for case, outcome, ok in raw),
        f"| server alive and healthy afterwards | {alive} |",
    ]
    ok = not fuzz["failures"] and all(ok for _, _, ok in raw) and alive
    lines.append(f"| all checks | {'**pass**' if ok else '**FAIL**'} |")
    table = "\n".join(lines)
    print(table)
    for failure in fuzz["failures"][:20]:
        print("-", failure)
    if not args.no_write:
        from benchlib import write_section

        write_section("fuzz", f"### Bad input at scale\n\n{table}", path=ROOT / "RELIABILITY.md")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
