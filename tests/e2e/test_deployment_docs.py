"""docs/deployment.md's trial runs as written: a local cluster, two aggregator processes on it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import free_port, free_port_run

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
REPORT_ID = "3f2b1c4e-1111-4222-8333-944455556666"


def trial_block() -> str:
    blocks = re.findall(r"^```sh\n(.*?)^```", DOC, flags=re.M | re.S)
    return next(block for block in blocks if "redis_cluster.py start" in block)


def checks(first: int, second: int, out: Path) -> str:
    """Shell lines that stand for '... use ...': a campaign made on one process, a report
    sent to the other, and the counts read back from the first."""
    admin = '-H "Authorization: Bearer $LDP_ADMIN_TOKEN"'
    analyst = '-H "Authorization: Bearer $LDP_ANALYST_TOKEN"'
    spec = '{"id":"trial","title":"t","mechanism":"krr","epsilon":1,"domain":["a","b"]}'
    report = json.dumps({"report_id": REPORT_ID, "value": "b"})
    health = "/api/v1/health"
    return "\n".join(
        [
            f"for port in {first} {second}; do for i in $(seq 200); do "
            f"curl -sf http://127.0.0.1:$port{health} >/dev/null && break; sleep 0.3; done; done",
            f"curl -sf -X POST {admin} -H 'Content-Type: application/json' -d '{spec}' "
            f"http://127.0.0.1:{first}/api/v1/campaigns >/dev/null",
            f"curl -sf -X POST -H 'Content-Type: application/json' -d '{report}' "
            f"http://127.0.0.1:{second}/api/v1/campaigns/trial/reports >/dev/null",
            f"curl -sf {analyst} http://127.0.0.1:{first}/api/v1/campaigns/trial/counts > {out}",
        ]
    )


@pytest.mark.slow
def test_the_trial_cluster_commands_run_and_two_processes_share_one_campaign(tmp_path):
    block = trial_block()
    head, tail = block.split("# ... use", 1)
    tail = tail.split("\n", 1)[1]
    cluster_port = free_port_run(6)
    first, second = free_port(), free_port()
    counts = tmp_path / "counts.json"
    cluster_dir = tmp_path / "cluster"
    # Whatever fails, the servers the block starts in the background end with it.
    script = "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + head
    script += checks(first, second, counts) + "\n" + tail
    script = (
        script.replace("7100", str(cluster_port))
        .replace("--port 8001", f"--port {first}")
        .replace("--port 8002", f"--port {second}")
        .replace(".ldp-cluster", str(cluster_dir))
    )
    stop = f"{sys.executable} scripts/redis_cluster.py stop --dir {cluster_dir}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)
    try:
        done = subprocess.run(
            ["bash", "-e", "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        subprocess.run(["bash", "-c", stop], cwd=ROOT, env=env, capture_output=True)
    body = json.loads(counts.read_text())
    assert body["n"] == 1
    assert {row["label"]: row["count"] for row in body["counts"]} == {"a": 0, "b": 1}
    assert "stopped 6 nodes" in done.stdout
