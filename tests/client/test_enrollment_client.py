"""The client with enrollment tokens, against a real aggregator (live_server: gunicorn, Redis)."""

from __future__ import annotations

import pytest
import requests
from click.testing import CliRunner

from client import AlreadyReported, ClientError, Policy, Reporter, ServerRejected
from client.cli import cli

SPEC = {
    "id": "enrolled-fruit",
    "title": "Fruit, enrolled devices only",
    "mechanism": "krr",
    "epsilon": 1.0,
    "domain": ["apple", "banana", "cherry"],
    "enrollment_required": True,
}
DAILY = {**SPEC, "id": "enrolled-daily", "title": "Fruit today, enrolled", "period": "day"}
DAY_S = 86_400.0


@pytest.fixture(scope="module")
def campaign(live_server):
    live_server.create_campaign(SPEC)
    live_server.create_campaign(DAILY)
    return live_server


def issue(server, count: int, campaign_id: str = SPEC["id"]) -> list[str]:
    response = requests.post(
        f"{server.api}/campaigns/{campaign_id}/enrollment-tokens",
        json={"count": count},
        headers={"Authorization": f"Bearer {server.admin_token}"},
        timeout=10,
    )
    assert response.status_code == 201
    return response.json()["tokens"]


def server_count(server, campaign_id: str = SPEC["id"]) -> int:
    response = requests.get(
        f"{server.api}/campaigns/{campaign_id}/counts",
        headers={"Authorization": f"Bearer {server.analyst_token}"},
        timeout=10,
    )
    return response.json()["n"]


def reporter(server, state_dir, clock=None) -> Reporter:
    extra = {} if clock is None else {"clock": clock}
    return Reporter(server.url, state_dir=state_dir, policy=Policy(total_budget=10), **extra)


def test_without_a_token_nothing_is_spent_or_sent(campaign, tmp_path):
    before = server_count(campaign)
    with reporter(campaign, tmp_path) as rep:
        with pytest.raises(ClientError, match="ldp-client enroll enrolled-fruit") as info:
            rep.report(SPEC["id"], "apple")
        assert info.value.code == "enrollment_needed"
        assert rep.status()["budget"]["spent"] == 0
    assert server_count(campaign) == before


def test_each_token_admits_one_report(campaign, tmp_path):
    """One report per period, each with its own token; a repeat in the period needs none."""
    tokens = issue(campaign, 2, DAILY["id"])
    before = server_count(campaign, DAILY["id"])
    now = [1_736_899_200.0]
    with reporter(campaign, tmp_path, clock=lambda: now[0]) as rep:
        assert rep.enroll(DAILY["id"], tokens[0]) == 1
        assert rep.enroll(DAILY["id"], tokens[1]) == 2
        first = rep.report(DAILY["id"], "apple")
        assert first.outcome == "delivered" and first.payload["enrollment_token"] == tokens[0]
        again = rep.report(DAILY["id"], "apple")  # the day's report again: no token spent
        assert again.outcome == "already_reported" and again.payload == first.payload
        with pytest.raises(AlreadyReported, match="from 2025-01-16 00:00 UTC"):
            rep.report(DAILY["id"], "banana")
        now[0] += DAY_S
        second = rep.report(DAILY["id"], "apple")  # memoized value, next token
        assert second.payload["enrollment_token"] == tokens[1] and second.charged == 0
        now[0] += DAY_S
        with pytest.raises(ClientError, match="none is left"):
            rep.report(DAILY["id"], "banana")
        assert rep.store.read().enrollments == {}
    assert server_count(campaign, DAILY["id"]) == before + 2


def test_a_token_spent_elsewhere_is_a_clear_error(campaign, tmp_path):
    (token,) = issue(campaign, 1)
    with reporter(campaign, tmp_path / "one") as rep:
        rep.enroll(SPEC["id"], token)
        assert rep.report(SPEC["id"], "cherry").outcome == "delivered"
    with reporter(campaign, tmp_path / "two") as rep:
        rep.enroll(SPEC["id"], token)
        with pytest.raises(ServerRejected, match="enroll enrolled-fruit TOKEN") as info:
            rep.report(SPEC["id"], "cherry")
        assert info.value.code == "enrollment_refused" and info.value.status == 403
        assert [r["error"]["code"] for r in rep.status()["rejected"]] == ["enrollment_refused"]


def test_the_command_line(campaign, tmp_path):
    (token,) = issue(campaign, 1)
    base = ["--server", campaign.url, "--state-dir", str(tmp_path)]
    runner = CliRunner()
    bad = runner.invoke(cli, [*base, "enroll", SPEC["id"], "not a token"])
    assert bad.exit_code == 1 and "Error: an enrollment token" in bad.output
    # "--": a token may begin with "-" (URL-safe base64), which click would read as an option.
    enrolled = runner.invoke(cli, [*base, "enroll", "--", SPEC["id"], token])
    assert enrolled.exit_code == 0 and "1 unused token" in enrolled.output
    sent = runner.invoke(cli, [*base, "report", SPEC["id"], "banana"])
    assert sent.exit_code == 0, sent.output
    again = runner.invoke(cli, [*base, "report", SPEC["id"], "banana"])
    assert again.exit_code == 0 and "nothing was sent again" in again.output
    changed = runner.invoke(cli, [*base, "report", SPEC["id"], "cherry"])
    assert changed.exit_code == 1 and "a changed answer is not sent" in changed.output
    assert isinstance(changed.exception, SystemExit)
    other = ["--server", campaign.url, "--state-dir", str(tmp_path / "other")]
    refused = runner.invoke(cli, [*other, "report", SPEC["id"], "banana"])
    assert refused.exit_code == 1 and "ldp-client enroll" in refused.output
