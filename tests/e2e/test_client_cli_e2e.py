"""``ldp-client`` processes against the real aggregator: the CLI round trip and concurrent runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from pathlib import Path

from test_client_e2e import (
    DAY_S,
    LABELS,
    Proxy,
    cells_campaign,
    counted_n,
    counts,
    krr_campaign,
    total,
    unique_id,
)

from client import Reporter

ROOT = Path(__file__).resolve().parents[2]


def cli_env(live_server, state_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_")}
    env.update(LDP_SERVER_URL=live_server.url, LDP_CLIENT_HOME=str(state_dir), **extra)
    return env


def ldp_client(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "client.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_round_trip(live_server, tmp_path):
    campaign_id = krr_campaign(live_server)
    env = cli_env(live_server, tmp_path / "state")

    dry = ldp_client(env, "report", campaign_id, "cherry", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    dry_result = json.loads(dry.stdout)
    assert dry_result["outcome"] == "dry_run" and total(live_server, campaign_id) == 0

    sent = ldp_client(env, "report", campaign_id, "cherry", "--json")
    assert sent.returncode == 0, sent.stderr
    result = json.loads(sent.stdout)
    assert result["outcome"] == "delivered" and result["charged"] == 1.0
    assert result["payload"] == dry_result["payload"]  # the report id is the period's
    assert "cherry" not in sent.stderr

    again = ldp_client(env, "report", campaign_id, "cherry")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        f"Already reported to {campaign_id}; it takes one report per device. The server has "
        "that report, so nothing was sent again.",
        "No budget spent.",
        "Budget left: 9 of 10.",
    ]
    assert counts(live_server, campaign_id) == {result["payload"]["value"]: 1}
    assert counted_n(live_server, campaign_id) == 1

    changed = ldp_client(env, "report", campaign_id, "apple")
    assert changed.returncode == 1
    assert changed.stderr.startswith(f"Error: campaign '{campaign_id}' takes one report per")
    assert "a changed answer is not sent (nothing was spent or sent)" in changed.stderr
    assert "apple" not in changed.stderr

    bad = ldp_client(env, "report", campaign_id, "kiwi")
    assert bad.returncode == 1
    assert bad.stderr.startswith("Error: the value is not one of the campaign's labels")

    capped = ldp_client(env, "--max-epsilon", "0.5", "report", campaign_id, "apple")
    assert capped.returncode == 1 and "above your cap" in capped.stderr

    status = json.loads(ldp_client(env, "status", "--json").stdout)
    assert status["budget"]["spent"] == 1.0
    [campaign] = status["campaigns"]
    assert (campaign["campaign"], campaign["values_reported"]) == (campaign_id, 1)

    forget = ldp_client(env, "forget", campaign_id, "--yes")
    assert forget.returncode == 0, forget.stderr
    assert "weakens your longitudinal protection" in forget.stderr
    status = json.loads(ldp_client(env, "status", "--json").stdout)
    assert status["campaigns"] == [] and status["budget"]["forgotten"] == 1.0


def test_cli_reports_an_integer_to_a_geometric_campaign(live_server, tmp_path):
    campaign_id = unique_id("age")
    live_server.create_campaign(
        {"id": campaign_id, "title": "Age", "mechanism": "geometric", "epsilon": 0.25}
        | {"lo": 0, "hi": 120}
    )
    env = cli_env(live_server, tmp_path / "state")
    sent = ldp_client(env, "report", campaign_id, "42", "--json")
    assert sent.returncode == 0, sent.stderr
    result = json.loads(sent.stdout)
    # The default value radius is 2: 0.25 per unit costs 0.5.
    assert result["outcome"] == "delivered" and result["charged"] == 0.5
    noisy = result["payload"]["value"]
    assert isinstance(noisy, int) and 0 <= noisy <= 120
    assert "42" not in sent.stderr
    assert counts(live_server, campaign_id) == {str(noisy): 1}

    other = cli_env(live_server, tmp_path / "other-device")
    wider = ldp_client(other, "--value-radius", "8", "report", campaign_id, "30", "--json")
    assert wider.returncode == 0, wider.stderr
    assert json.loads(wider.stdout)["charged"] == 2.0

    for bad, message in (("121", "outside the range"), ("4.5", "must be an integer")):
        refused = ldp_client(env, "report", campaign_id, bad)
        assert refused.returncode == 1
        assert message in refused.stderr and "(range: the integers 0 to 120)" in refused.stderr
        assert bad not in refused.stderr.replace("0 to 120", "")


def test_cli_reports_to_olh_and_hadamard_campaigns(live_server, tmp_path):
    """An integer of a domain size (as typed) or a label: one integer goes on the wire."""
    env = cli_env(live_server, tmp_path / "state")
    olh_id, hr_id = unique_id("apps"), unique_id("words")
    live_server.create_campaign(
        {"id": olh_id, "title": "App", "mechanism": "olh", "epsilon": 1.0, "domain_size": 10**6}
    )
    live_server.create_campaign(
        {"id": hr_id, "title": "Word", "mechanism": "hadamard_response", "epsilon": 1.0}
        | {"domain": ["alpha", "beta", "gamma"]}
    )
    sent = ldp_client(env, "report", olh_id, "654321", "--json")
    assert sent.returncode == 0, sent.stderr
    result = json.loads(sent.stdout)
    assert result["outcome"] == "delivered" and result["charged"] == 1.0
    noisy = result["payload"]["value"]
    assert isinstance(noisy, int) and 0 <= noisy < 1024 * 4  # seed * g + bucket, g = 4
    assert counts(live_server, olh_id) == {str(noisy): 1}
    labelled = ldp_client(env, "report", hr_id, "beta", "--json")
    assert labelled.returncode == 0, labelled.stderr
    assert 0 <= json.loads(labelled.stdout)["payload"]["value"] < 4
    refused = ldp_client(env, "report", olh_id, "1000000")
    assert refused.returncode == 1
    assert "(values: the integers 0 to 999999)" in refused.stderr


def test_cli_reports_a_location_to_a_krr_campaign_over_a_regions_cells(live_server, tmp_path):
    campaign_id = cells_campaign(live_server, "krr", epsilon=1.5)["id"]
    env = cli_env(live_server, tmp_path / "state")
    sent = ldp_client(env, "report", campaign_id, "--lat", "48.1234", "--lon", "11.5678", "--json")
    assert sent.returncode == 0, sent.stderr
    result = json.loads(sent.stdout)
    assert result["outcome"] == "delivered" and result["charged"] == 1.5
    noisy = result["payload"]["value"]
    assert re.fullmatch(r"r[0-5]c[0-7]", noisy)  # one of the 6 x 8 cells, a k-RR label
    assert "48.1234" not in sent.stdout + sent.stderr
    assert counts(live_server, campaign_id) == {noisy: 1}

    outside = ldp_client(env, "report", campaign_id, "--lat", "48.2", "--lon", "11.55")
    assert outside.returncode == 1 and "outside the campaign region" in outside.stderr
    assert "(region: lat 48.1 to 48.15, lon 11.5 to 11.6)" in outside.stderr
    label = ldp_client(env, "report", campaign_id, "r1c1")
    assert label.returncode == 1 and "must be a location" in label.stderr
    assert total(live_server, campaign_id) == 1


def test_cli_queues_while_the_server_is_down_and_flush_sends(live_server, tmp_path):
    campaign_id = krr_campaign(live_server, period="day")
    proxy = Proxy(live_server.url)
    try:
        env = {**cli_env(live_server, tmp_path / "state"), "LDP_SERVER_URL": proxy.url}
        # Yesterday's report, which pins the campaign (the command line runs on today's clock).
        yesterday = time.time() - DAY_S
        with Reporter(proxy.url, state_dir=tmp_path / "state", clock=lambda: yesterday) as device:
            assert device.report(campaign_id, "apple").outcome == "delivered"
        proxy.stop()
        queued = ldp_client(env, "report", campaign_id, "banana")
        assert queued.returncode == 0, queued.stderr
        assert "Queued on this device: cannot reach the server" in queued.stdout
        assert "connection refused" in queued.stdout
        # The same answer again today: that report, still waiting, not a second one.
        waiting = ldp_client(env, "report", campaign_id, "banana")
        assert waiting.returncode == 0, waiting.stderr
        assert waiting.stdout.startswith(f"Already reported to {campaign_id} today (")
        assert "That report waits on this device (cannot reach the server" in waiting.stdout
        failed = ldp_client(env, "flush")
        assert failed.returncode == 1
        assert (
            "1 still waiting" in failed.stdout
            and "Error: 1 report(s) still waiting" in failed.stderr
        )
        assert total(live_server, campaign_id) == 1
        proxy.start()
        flushed = ldp_client(env, "flush", "--json")
        assert flushed.returncode == 0, flushed.stderr
        assert json.loads(flushed.stdout) == {
            "attempted": 1,
            "accepted": 1,
            "duplicates": 0,
            "rejected": [],
            "errors": [],
            "remaining": 0,
        }
        assert total(live_server, campaign_id) == 2
    finally:
        proxy.stop()


WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from client import Policy, Reporter
    server, state_dir, go = sys.argv[1:4]
    campaigns, labels = json.loads(sys.argv[4]), json.loads(sys.argv[5])
    while not Path(go).exists():
        time.sleep(0.005)
    out = []
    with Reporter(server, state_dir=state_dir, policy=Policy(total_budget=100)) as reporter:
        for i in range(12):
            campaign, label = campaigns[i % len(campaigns)], labels[i % len(labels)]
            result = reporter.report(campaign, label)
            out.append([campaign, result.payload, result.outcome])
    print(json.dumps(out))
    """
)


def test_concurrent_processes_share_the_state_without_corrupting_it(live_server, tmp_path):
    """Four processes report through one state directory at once: nothing lost or spent twice.

    Each answers four campaigns three times, always with the same answer per campaign: one
    report per campaign is made, paid for once and counted once.
    """
    campaigns = [krr_campaign(live_server) for _ in LABELS]
    state_dir, go = tmp_path / "state", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                live_server.url,
                str(state_dir),
                str(go),
                json.dumps(campaigns),
                json.dumps(LABELS),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    time.sleep(0.3)
    go.touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outputs]
    reports = [row for out, _ in outputs for row in json.loads(out)]
    assert len(reports) == 48
    outcomes = Counter(outcome for _, _, outcome in reports)
    # One delivery per campaign; a repeat that found the report being sent left it to its sender.
    assert outcomes["delivered"] == 4, outcomes
    assert set(outcomes) <= {"delivered", "duplicate", "already_reported", "queued"}, outcomes
    # Every process sent or found the same report (id and value) for the same campaign...
    by_campaign = defaultdict(set)
    for campaign, payload, _ in reports:
        by_campaign[campaign].add(json.dumps(payload, sort_keys=True))
    assert all(len(payloads) == 1 for payloads in by_campaign.values())
    # ...each was paid for once, and each arrived once.
    env = cli_env(live_server, state_dir)
    status = json.loads(ldp_client(env, "status", "--json").stdout)
    assert status["budget"]["spent"] == 4.0
    assert [c["values_reported"] for c in status["campaigns"]] == [1, 1, 1, 1]
    assert status["queue"]["pending"] == 0
    assert [total(live_server, campaign) for campaign in campaigns] == [1, 1, 1, 1]


def test_concurrent_processes_cannot_overspend_the_budget(live_server, tmp_path):
    """Room for one new answer, four processes racing with answers to four campaigns: one wins."""
    campaigns = [krr_campaign(live_server) for _ in LABELS]
    env = cli_env(live_server, tmp_path / "state", LDP_BUDGET="1.5")
    commands = [["report", c, label] for c, label in zip(campaigns, LABELS, strict=True)]
    outputs, codes = race(env, commands)
    assert sorted(codes) == [0, 1, 1, 1], outputs
    refused = [err for (_, err), code in zip(outputs, codes, strict=True) if code]
    assert all("budget" in err and "nothing was spent or sent" in err for err in refused)
    assert sum(total(live_server, campaign) for campaign in campaigns) == 1
    status = json.loads(ldp_client(env, "status", "--json").stdout)
    assert status["budget"]["spent"] == 1.0


def test_concurrent_processes_make_one_report_per_period(live_server, tmp_path):
    """Four processes race with different answers to one campaign: one report, one charge."""
    campaign_id = krr_campaign(live_server)
    env = cli_env(live_server, tmp_path / "state")
    outputs, codes = race(env, [["report", campaign_id, label] for label in LABELS])
    assert sorted(codes) == [0, 1, 1, 1], outputs
    refused = [err for (_, err), code in zip(outputs, codes, strict=True) if code]
    assert all("a changed answer is not sent" in err for err in refused), refused
    assert total(live_server, campaign_id) == 1
    status = json.loads(ldp_client(env, "status", "--json").stdout)
    assert status["budget"]["spent"] == 1.0


def race(env: dict[str, str], commands: list[list[str]]) -> tuple[list[tuple[str, str]], list]:
    """Run ``ldp-client`` commands at once; their outputs and exit statuses."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "client.cli", *command],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    return outputs, [p.returncode for p in procs]


def test_cli_reports_a_location_to_an_exponential_grid_campaign(live_server, tmp_path):
    campaign_id = unique_id("block")
    region = {"lat_min": 37.77, "lat_max": 37.78, "lon_min": -122.42, "lon_max": -122.41}
    live_server.create_campaign(
        {"id": campaign_id, "title": "Block", "mechanism": "exponential_grid", "epsilon": 0.002}
        | {"metric": "manhattan", "region": region, "cell_size_m": 100}
    )
    env = cli_env(live_server, tmp_path / "state")
    sent = ldp_client(
        env, "report", campaign_id, "--lat", "37.7751", "--lon", "-122.4152", "--json"
    )
    assert sent.returncode == 0, sent.stderr
    result = json.loads(sent.stdout)
    # The default radius is 200 m: one row and three columns of 100 m cells, 400 Manhattan metres.
    assert result["outcome"] == "delivered" and result["charged"] == 0.8
    noisy = result["payload"]["value"]
    assert set(noisy) == {"lat", "lon"} and 37.77 <= noisy["lat"] <= 37.781
    assert "37.7751" not in sent.stderr and "37.7751" not in sent.stdout
    assert total(live_server, campaign_id) == 1

    outside = ldp_client(env, "report", campaign_id, "--lat", "38.5", "--lon", "-122.4152")
    assert outside.returncode == 1 and "outside the campaign region" in outside.stderr
