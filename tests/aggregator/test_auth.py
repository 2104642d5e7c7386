"""Bearer tokens: 401 for unknown, 403 for the wrong role, failed attempts limited, weak refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aggregator_testdata import ADMIN_TOKEN, ANALYST_TOKEN, KRR_SPEC

from aggregator.app import create_app
from aggregator.http.auth import EXAMPLE_TOKENS, MIN_TOKEN_LENGTH
from aggregator.services import SETTINGS_EXTENSION
from aggregator.settings import SettingsError

ROOT = Path(__file__).resolve().parents[2]
COUNTS = "/api/v1/campaigns/fruit/counts"
LOGIN = "/dashboard/login"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
GUESS = {"Authorization": "Bearer " + "g" * 43}


@pytest.fixture
def limited(config):
    """An app allowing 5 failed attempts a minute per address."""
    return create_app({**config, "RATELIMIT_AUTH_FAILURES": "5 per minute"})


def sign_in(client, token: str):
    page = client.get(LOGIN).get_data(as_text=True)
    return client.post(LOGIN, data={"csrf_token": CSRF.search(page).group(1), "token": token})


def test_unknown_token_is_401_with_a_challenge_and_wrong_role_is_403(client, krr_campaign):
    unknown = client.post("/api/v1/campaigns", json=KRR_SPEC, headers=GUESS)
    assert unknown.status_code == 401
    assert unknown.headers["WWW-Authenticate"].startswith("Bearer")
    analyst = {"Authorization": f"Bearer {ANALYST_TOKEN}"}
    wrong_role = client.post("/api/v1/campaigns", json=KRR_SPEC, headers=analyst)
    assert wrong_role.status_code == 403
    assert wrong_role.get_json()["error"]["code"] == "forbidden"


def test_failed_tokens_are_limited_per_address_across_workers(limited, krr_campaign):
    worker_a = limited.test_client()
    worker_b = create_app(limited.extensions[SETTINGS_EXTENSION]).test_client()
    for attempt in range(5):
        worker = (worker_a, worker_b)[attempt % 2]
        assert worker.get(COUNTS, headers=GUESS).status_code == 401
    throttled = worker_a.get(COUNTS, headers=GUESS)
    assert throttled.status_code == 429
    assert 0 < int(throttled.headers["Retry-After"]) <= 60
    assert throttled.get_json()["error"]["code"] == "rate_limited"
    # Past the limit even the right token is refused from that address: no oracle.
    right = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert worker_b.get(COUNTS, headers=right).status_code == 429
    # Another address is not affected.
    elsewhere = {"REMOTE_ADDR": "198.51.100.7"}
    assert worker_a.get(COUNTS, headers=right, environ_base=elsewhere).status_code == 200
    # Requests without a token are not guesses and are not throttled into 429.
    assert worker_a.get(COUNTS).status_code == 401


def test_dashboard_sign_in_shares_the_failed_attempt_limit(limited, krr_campaign):
    client = limited.test_client()
    for _ in range(3):
        assert client.get(COUNTS, headers=GUESS).status_code == 401
    for _ in range(2):
        assert sign_in(client, "g" * 43).status_code == 401
    assert sign_in(client, ANALYST_TOKEN).status_code == 429
    assert client.get(COUNTS, headers=GUESS).status_code == 429


def test_no_limit_when_rate_limits_are_off(config, krr_campaign):
    client = create_app(
        {**config, "RATELIMIT_AUTH_FAILURES": "1 per minute", "RATELIMIT_ENABLED": False}
    ).test_client()
    assert [client.get(COUNTS, headers=GUESS).status_code for _ in range(3)] == [401] * 3


@pytest.mark.parametrize("setting", ["ADMIN_TOKEN", "ANALYST_TOKEN"])
@pytest.mark.parametrize(
    "token", ["tiny-token", "x" * (MIN_TOKEN_LENGTH - 1), *sorted(EXAMPLE_TOKENS)]
)
def test_weak_tokens_are_refused_unless_development_is_said(redis_url, setting, token):
    config = {"REDIS_URL": redis_url, setting: token}
    with pytest.raises(SettingsError, match=f"LDP_{setting}") as refused:
        create_app(config)
    assert token not in str(refused.value)
    create_app({**config, "ALLOW_WEAK_TOKENS": True})
    create_app({"REDIS_URL": redis_url, setting: "x" * MIN_TOKEN_LENGTH})


def test_every_token_in_the_documentation_is_refused(redis_url):
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "RELIABILITY.md"]
    literals = {
        match
        for path in texts
        for match in re.findall(
            r"LDP_(?:ADMIN|ANALYST)_TOKEN=([^\s$'\"`.]+)", path.read_text(encoding="utf-8")
        )
    }
    for token in literals | EXAMPLE_TOKENS:
        with pytest.raises(SettingsError):
            create_app({"REDIS_URL": redis_url, "ADMIN_TOKEN": token})


def test_weak_tokens_are_refused_from_the_environment(redis_url, monkeypatch):
    monkeypatch.setenv("LDP_REDIS_URL", redis_url)
    monkeypatch.setenv("LDP_ADMIN_TOKEN", "admin-secret")
    with pytest.raises(SettingsError):
        create_app()
    monkeypatch.setenv("LDP_ALLOW_WEAK_TOKENS", "1")
    assert create_app().config["ADMIN_TOKEN"] == "admin-secret"


def _sign_in_cookie(client, **request) -> str:
    page = client.get(LOGIN, **request).get_data(as_text=True)
    data = {"csrf_token": CSRF.search(page).group(1), "token": ANALYST_TOKEN}
    response = client.post(LOGIN, data=data, **request)
    assert response.status_code == 303
    return response.headers["Set-Cookie"]


def test_the_session_cookie_is_secure_over_https(app):
    assert "Secure" in _sign_in_cookie(app.test_client(), base_url="https://ldp.example")
    assert "Secure" not in _sign_in_cookie(app.test_client(), base_url="http://localhost")


def test_forwarded_headers_count_only_from_a_trusted_proxy(config, krr_campaign):
    forwarded = {"headers": {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.5"}}
    untrusted = create_app(config)
    assert "Secure" not in _sign_in_cookie(untrusted.test_client(), **forwarded)
    behind_proxy = create_app(
        {**config, "TRUSTED_PROXIES": 1, "RATELIMIT_AUTH_FAILURES": "1 per minute"}
    )
    assert "Secure" in _sign_in_cookie(behind_proxy.test_client(), **forwarded)
    # The failed-attempt limit counts the forwarded client, not the proxy's address.
    client = behind_proxy.test_client()
    guesser = {"X-Forwarded-For": "203.0.113.5", **GUESS}
    assert client.get(COUNTS, headers=guesser).status_code == 401
    assert client.get(COUNTS, headers=guesser).status_code == 429
    other = {"X-Forwarded-For": "203.0.113.6", "Authorization": f"Bearer {ANALYST_TOKEN}"}
    assert client.get(COUNTS, headers=other).status_code == 200


@pytest.mark.parametrize("proxies", [-1, "one", True])
def test_bad_trusted_proxy_settings_are_refused(config, proxies):
    with pytest.raises(ValueError, match="TRUSTED_PROXIES"):
        create_app({**config, "TRUSTED_PROXIES": proxies})


def test_reaching_the_failed_attempt_limit_is_logged_once(limited, krr_campaign, caplog):
    client = limited.test_client()
    with caplog.at_level("WARNING"):
        for _ in range(8):
            client.get(COUNTS, headers=GUESS)
    lines = [r.getMessage() for r in caplog.records if "failed authentication" in r.getMessage()]
    assert len(lines) == 1 and "5 failed authentication attempts from 127.0.0.1" in lines[0]
    assert GUESS["Authorization"].split()[1] not in caplog.text
