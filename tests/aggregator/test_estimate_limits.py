"""Bounded estimates: the confidence levels on offer, the work cap and the time limit.

An estimate that needs more work than ``ESTIMATE_MAX_WORK`` answers 422 at
once; one that runs past ``ESTIMATE_TIMEOUT_S`` is stopped and answers 503
with ``Retry-After``; in both cases nothing is cached and the computing thread
is free again.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

import gevent
import gevent.monkey
import pytest
from aggregator_testdata import ADMIN_TOKEN, ANALYST_TOKEN, KRR_SPEC, PLANAR_SPEC, new_id

from aggregator.app import create_app
from aggregator.cli import main
from aggregator.estimation import budget
from aggregator.estimation.channels import DenseChannel
from aggregator.http import estimates
from aggregator.http.openapi import document
from aggregator.storage.ingest import StoredReport
from shared.spec import CampaignSpec

KRR_URL = "/api/v1/campaigns/fruit/estimate"
# A 64 x 64 grid of 100 m cells (6.4 km a side) around San Francisco's centre.
GRID_64_SPEC = {
    **PLANAR_SPEC,
    "id": "grid64",
    "region": {"lat_min": 37.75, "lat_max": 37.8075, "lon_min": -122.45, "lon_max": -122.3775},
    "cell_size_m": 100,
}


def limited_app(config, **limits):
    return create_app({**config, **limits})


def fill(store, spec_dict, count):
    spec = CampaignSpec.from_dict(spec_dict)
    n_outputs = spec.grid.n_cells if spec.region is not None else len(spec.domain)
    store.create_campaign(spec)
    reports = [StoredReport(new_id(), i % n_outputs, None) for i in range(count)]
    store.ingest(spec.id, reports)


def charging_forever(*args, **kwargs):
    """An estimator that never converges, charging its steps as estimation loops do."""
    while True:
        budget.charge(100)
        time.sleep(0.001)


# Each product of a SlowChannel takes this long: an IBU step (two products) takes 0.1 s, as a
# 256 x 256 grid's does on a busy machine; 32 steps, the most between two checks of the budget,
# take 3.2 s.
SLOW_PRODUCT_S = 0.05
# How far past its time limit a stopped estimate may answer in these tests: about a step, and
# room for a loaded machine.
OVERRUN_BOUND_S = 1.0


class SlowChannel(DenseChannel):
    """A dense channel whose every product takes :data:`SLOW_PRODUCT_S`."""

    def forward(self, p):
        time.sleep(SLOW_PRODUCT_S)
        return super().forward(p)

    def backward(self, u):
        time.sleep(SLOW_PRODUCT_S)
        return super().backward(u)


def one_long_step(*args, **kwargs):
    """An estimator whose first step alone takes a second, and nothing can stop it."""
    time.sleep(1.0)
    budget.charge(1)


# -- confidence -----------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["0.9500001", "0.94", "0.5", "0.999"])
def test_a_confidence_outside_the_offered_levels_is_refused(client, analyst, krr_campaign, raw):
    response = client.get(f"{KRR_URL}?confidence={raw}", headers=analyst)
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["field"] == "confidence"
    assert "0.8, 0.9, 0.95, 0.99" in error["message"]


def test_the_offered_levels_are_the_documented_ones(client, analyst, krr_campaign):
    parameters = document()["paths"]["/api/v1/campaigns/{campaign_id}/estimate"]["parameters"]
    schema = next(p for p in parameters if p.get("name") == "confidence")["schema"]
    assert schema["enum"] == list(estimates.CONFIDENCE_LEVELS)
    assert schema["default"] == estimates.DEFAULT_CONFIDENCE
    for level in schema["enum"]:
        assert client.get(f"{KRR_URL}?confidence={level}", headers=analyst).status_code == 200
    # The same level written another way is the same level (and the same cache entry).
    body = client.get(f"{KRR_URL}?confidence=0.950", headers=analyst).get_json()
    assert body["confidence"] == 0.95


# -- work cap -------------------------------------------------------------------------------


def test_an_estimate_over_the_work_cap_is_refused_at_once(config, store, analyst):
    fill(store, GRID_64_SPEC, 2000)
    client = limited_app(config, ESTIMATE_MAX_WORK=1000).test_client()
    started = time.monotonic()
    response = client.get("/api/v1/campaigns/grid64/estimate", headers=analyst)
    assert time.monotonic() - started < 5
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["code"] == "estimate_too_costly"
    assert "LDP_ESTIMATE_MAX_WORK" in error["message"]
    assert "1,000" in error["message"]
    # Nothing was cached: the same request is refused again, and a larger cap computes it.
    assert client.get("/api/v1/campaigns/grid64/estimate", headers=analyst).status_code == 422
    roomy = limited_app(config, ESTIMATE_MAX_WORK=10**9).test_client()
    answer = roomy.get("/api/v1/campaigns/grid64/estimate?method=inversion", headers=analyst)
    assert answer.status_code == 200
    assert answer.headers["X-Estimate-Cache"] == "miss"


def test_the_default_limits_fit_a_64_by_64_estimate(client, store, analyst):
    fill(store, GRID_64_SPEC, 5000)
    response = client.get("/api/v1/campaigns/grid64/estimate", headers=analyst)
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["grid"]["rows"] == 64


# -- time limit ----------------------------------------------------------------------------


def test_an_estimate_past_the_time_limit_is_stopped_with_a_503(config, store, analyst, monkeypatch):
    fill(store, KRR_SPEC, 50)
    monkeypatch.setattr(estimates, "estimate", charging_forever)
    client = limited_app(config, ESTIMATE_TIMEOUT_S=0.3).test_client()
    started = time.monotonic()
    response = client.get(KRR_URL, headers=analyst)
    assert time.monotonic() - started < 3
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    error = response.get_json()["error"]
    assert error["code"] == "estimate_timed_out"
    assert "LDP_ESTIMATE_TIMEOUT_S" in error["message"]
    # The dashboard's data endpoint answers the same way.
    login = client.get("/dashboard/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', login).group(1)
    signed = client.post("/dashboard/login", data={"csrf_token": csrf, "token": ANALYST_TOKEN})
    assert signed.status_code == 303
    dashboard = client.get("/dashboard/data/campaigns/fruit/estimate")
    assert dashboard.status_code == 503
    assert dashboard.get_json()["error"]["code"] == "estimate_timed_out"


@pytest.mark.parametrize("method", ["ibu", "mle"])
def test_an_estimate_of_slow_steps_stops_soon_after_its_time_limit(
    config, store, analyst, monkeypatch, method
):
    """IBU's folds and steps check the budget about every 0.1 s, however slow a step: an
    estimate whose steps take 0.1 s each stops within about a step of its limit (checked
    every 32 steps, it ran 3 s past it)."""
    spec = CampaignSpec.from_dict(KRR_SPEC)
    store.create_campaign(spec)
    reports = [
        StoredReport(new_id(), i, None) for i, c in enumerate((40, 25, 10, 5)) for _ in range(c)
    ]
    store.ingest("fruit", reports)
    real = estimates.channel_for
    monkeypatch.setattr(estimates, "channel_for", lambda m: SlowChannel(real(m).to_dense()))
    timeout_s = 0.5
    client = limited_app(config, ESTIMATE_TIMEOUT_S=timeout_s).test_client()
    started = time.monotonic()
    response = client.get(f"{KRR_URL}?method={method}", headers=analyst)
    assert time.monotonic() - started < timeout_s + OVERRUN_BOUND_S
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "estimate_timed_out"


@pytest.mark.parametrize("busy", ["waiting for a thread", "in one long step"])
def test_a_request_answers_at_its_time_limit_whatever_its_computation_does(
    config, store, analyst, monkeypatch, busy
):
    """Under gevent the request waits for its computation until its deadline at most: the time
    it waits for a free thread counts, and a step that cannot be stopped runs on without it."""
    fill(store, KRR_SPEC, 50)
    monkeypatch.setattr(gevent.monkey, "is_module_patched", lambda name: name == "threading")
    pool = gevent.get_hub().threadpool
    monkeypatch.setattr(pool, "maxsize", 1)
    timeout_s = 0.3
    client = limited_app(config, ESTIMATE_TIMEOUT_S=timeout_s).test_client()
    # The campaign's channel is built (a first estimate), and the next one is computed.
    assert client.get(f"{KRR_URL}?confidence=0.8", headers=analyst).status_code == 200
    if busy == "waiting for a thread":
        monkeypatch.setattr(estimates, "estimate", charging_forever)
        pool.spawn(time.sleep, 1.0)
    else:
        monkeypatch.setattr(estimates, "estimate", one_long_step)
    started = time.monotonic()
    response = client.get(KRR_URL, headers=analyst)
    assert time.monotonic() - started < timeout_s + OVERRUN_BOUND_S / 2
    assert response.status_code == 503
    assert response.get_json()["error"]["code"] == "estimate_timed_out"
    # The computation left behind stops at its first check of the budget, past its deadline
    # (a thread still stuck would fail the call, not hang the test).
    with gevent.Timeout(3):
        assert pool.apply(lambda: 42) == 42


def test_numba_is_set_up_with_locks_of_the_operating_system_before_gevent_patches():
    """Made after gevent's patching, numba's compiler lock was gevent's, and estimates loading
    compiled loops in several native threads at once could wait on it forever."""
    pytest.importorskip("numba")
    program = (
        "from aggregator.estimation.native import prepare_compiler\n"
        "prepare_compiler()\n"
        "from gevent import monkey\n"
        "monkey.patch_all()\n"
        "import _thread\n"
        "from numba.core.compiler_lock import global_compiler_lock\n"
        "from numba.core.registry import cpu_target\n"
        "locks = (global_compiler_lock._lock, cpu_target.typing_context.callstack._lock)\n"
        "assert all(type(lock) is _thread.RLock for lock in locks), locks\n"
    )
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_a_stopped_estimate_frees_its_pool_thread(config, store, analyst, monkeypatch):
    """Under gevent the estimate runs in the hub's thread pool; a stopped one returns its thread."""
    fill(store, KRR_SPEC, 50)
    monkeypatch.setattr(gevent.monkey, "is_module_patched", lambda name: name == "threading")
    pool = gevent.get_hub().threadpool
    monkeypatch.setattr(pool, "maxsize", 1)
    monkeypatch.setattr(estimates, "estimate", charging_forever)
    client = limited_app(config, ESTIMATE_TIMEOUT_S=0.2).test_client()
    for _ in range(3):
        assert client.get(KRR_URL, headers=analyst).status_code == 503
    # With one thread in the pool, a thread still stuck in the loop would block this call.
    started = time.monotonic()
    with gevent.Timeout(3):
        assert pool.apply(lambda: 42) == 42
    assert time.monotonic() - started < 1
    assert pool.size <= 1


def test_the_limits_come_from_the_environment(monkeypatch, redis_url):
    monkeypatch.setenv("LDP_REDIS_URL", redis_url)
    monkeypatch.setenv("LDP_ESTIMATE_MAX_WORK", "12345")
    monkeypatch.setenv("LDP_ESTIMATE_TIMEOUT_S", "2.5")
    limits = create_app().extensions[estimates.LIMITS_EXTENSION]
    assert limits == estimates.EstimateLimits(max_work=12345, timeout_s=2.5)
    monkeypatch.delenv("LDP_ESTIMATE_MAX_WORK")
    monkeypatch.delenv("LDP_ESTIMATE_TIMEOUT_S")
    defaults = create_app().extensions[estimates.LIMITS_EXTENSION]
    assert defaults == estimates.EstimateLimits(estimates.DEFAULT_MAX_WORK, 30.0, threads=0)
    monkeypatch.setenv("LDP_ESTIMATE_THREADS", "3")
    assert create_app().extensions[estimates.LIMITS_EXTENSION].threads == 3


@pytest.mark.parametrize(
    "setting",
    [
        {"ESTIMATE_MAX_WORK": 0},
        {"ESTIMATE_MAX_WORK": "lots"},
        {"ESTIMATE_MAX_WORK": 1.5},
        {"ESTIMATE_TIMEOUT_S": 0},
        {"ESTIMATE_TIMEOUT_S": float("inf")},
    ],
)
def test_a_bad_limit_stops_the_app_from_starting(config, setting):
    with pytest.raises(ValueError, match="ESTIMATE_"):
        create_app({**config, **setting})


# -- the command line ------------------------------------------------------------------------


def test_the_cli_estimate_honours_the_limits(runner, redis_url, store, monkeypatch):
    fill(store, KRR_SPEC, 60)
    args = ["--redis-url", redis_url, "estimate", "fruit", "--json"]
    refused = runner.invoke(main, [*args, "--max-work", "2"])
    assert refused.exit_code == 1
    assert "LDP_ESTIMATE_MAX_WORK" in refused.stderr
    monkeypatch.setenv("LDP_ESTIMATE_MAX_WORK", "2")
    assert runner.invoke(main, args).exit_code == 1
    lifted = runner.invoke(main, [*args, "--no-limits"])
    assert lifted.exit_code == 0, lifted.output
    assert json.loads(lifted.stdout)["n"] == 60
    assert runner.invoke(main, [*args, "--confidence", "0.9500001"]).exit_code == 2
    assert runner.invoke(main, [*args, "--threads", "1"]).exit_code == 0
    refused = runner.invoke(main, [*args, "--threads", "-1"])
    assert refused.exit_code == 2 and "LDP_ESTIMATE_THREADS" in refused.stderr


# -- raw shares ------------------------------------------------------------------------------


def test_categorical_rows_carry_the_raw_share_of_reports(client, store, analyst):
    spec = CampaignSpec.from_dict(KRR_SPEC)
    store.create_campaign(spec)
    counts = [40, 25, 10, 5]
    reports = [StoredReport(new_id(), i, None) for i, c in enumerate(counts) for _ in range(c)]
    store.ingest("fruit", reports)
    body = client.get(KRR_URL, headers=analyst).get_json()
    assert [row["raw_frequency"] for row in body["estimates"]] == [c / 80 for c in counts]


def test_planar_rows_have_no_raw_share(client, store, analyst):
    fill(store, PLANAR_SPEC, 100)
    body = client.get("/api/v1/campaigns/where/estimate", headers=analyst).get_json()
    assert "raw_frequency" not in body["estimates"][0]


def test_the_csv_download_is_bounded_too(config, store):
    fill(store, GRID_64_SPEC, 100)
    client = limited_app(config, ESTIMATE_MAX_WORK=10).test_client()
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    csv = client.get("/api/v1/campaigns/grid64/estimate?format=csv", headers=headers)
    assert csv.status_code == 422
    assert csv.get_json()["error"]["code"] == "estimate_too_costly"


# -- one computation per estimate --------------------------------------------------------------


def lock_keys(store) -> list[bytes]:
    return list(store.connection.scan_iter(match="ldp:*estimate-lock*"))


def test_concurrent_requests_compute_an_estimate_once(app, store, analyst, monkeypatch):
    fill(store, KRR_SPEC, 80)
    calls = []
    real = estimates.estimate

    def slow(*args, **kwargs):
        calls.append(1)
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(estimates, "estimate", slow)
    answers = []

    def ask():
        answers.append(app.test_client().get(KRR_URL, headers=analyst))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert sorted(answer.headers["X-Estimate-Cache"] for answer in answers) == [
        "hit",
        "hit",
        "miss",
    ]
    assert len({answer.get_data() for answer in answers}) == 1
    assert lock_keys(store) == []


def test_an_estimate_cached_between_a_miss_and_the_lock_is_not_computed_again(
    app, store, analyst, monkeypatch
):
    """The race behind a rare failure of the test above: a request misses the cache, another
    computes, caches and releases the lock, and then the first one takes the lock."""
    fill(store, KRR_SPEC, 80)
    calls, locks = [], []
    real_estimate, real_lock = estimates.estimate, estimates.compute_lock

    def counted(*args, **kwargs):
        calls.append(1)
        return real_estimate(*args, **kwargs)

    def lock_after_another_request(*args, **kwargs):
        locks.append(1)
        if len(locks) == 1:  # the first request, after its cache miss: the other one runs now
            other = app.test_client().get(KRR_URL, headers=analyst)
            assert other.status_code == 200 and other.headers["X-Estimate-Cache"] == "miss"
        return real_lock(*args, **kwargs)

    monkeypatch.setattr(estimates, "estimate", counted)
    monkeypatch.setattr(estimates, "compute_lock", lock_after_another_request)
    answer = app.test_client().get(KRR_URL, headers=analyst)
    assert answer.status_code == 200
    assert answer.headers["X-Estimate-Cache"] == "hit"
    assert len(calls) == 1
    assert lock_keys(store) == []


def test_a_request_waiting_for_another_computation_stops_at_its_time_limit(config, store, analyst):
    fill(store, KRR_SPEC, 80)
    campaign = store.get_campaign("fruit")
    digest = estimates.counts_digest(campaign, store.counts("fruit"))
    key = estimates.cache_variant(estimates.default_method(campaign.mechanism), 0.95)
    held = estimates.compute_lock(store, "fruit", key, digest, None)
    assert held.acquire()
    client = limited_app(config, ESTIMATE_TIMEOUT_S=0.3).test_client()
    started = time.monotonic()
    response = client.get(KRR_URL, headers=analyst)
    assert time.monotonic() - started < 2
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert response.get_json()["error"]["code"] == "estimate_pending"
    # The holder gave up without a result: the next request computes it.
    held.release()
    assert client.get(KRR_URL, headers=analyst).status_code == 200


def test_a_stopped_computation_releases_its_lock(config, store, analyst, monkeypatch):
    fill(store, KRR_SPEC, 50)
    monkeypatch.setattr(estimates, "estimate", charging_forever)
    client = limited_app(config, ESTIMATE_TIMEOUT_S=0.2).test_client()
    assert client.get(KRR_URL, headers=analyst).status_code == 503
    assert lock_keys(store) == []
