"""The client library against the real aggregator (a server process on loopback, real Redis).

Outages are made with a TCP proxy in front of the server that can stop
listening (connections refused) or swallow the server's answers (the report
is stored but the device never hears so).
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import threading
import time
from collections import Counter

import pytest
import redis
import requests
from support import unique_id

from client import (
    AlreadyReported,
    BudgetExceeded,
    CampaignClosed,
    EpsilonCapExceeded,
    Policy,
    Reporter,
    ServerUnavailable,
    SpecChanged,
)
from client.outbox import BACKOFF_BASE_S
from shared.errors import ReportError
from shared.mechanisms import KRR, Mechanism
from shared.spec import CampaignSpec

LABELS = ["apple", "banana", "cherry", "durian"]
DAY_S = 86_400.0


def krr_campaign(
    live_server, epsilon: float = 1.0, labels: list[str] = LABELS, period: str | None = None
) -> str:
    campaign_id = unique_id("fruit")
    spec = {"id": campaign_id, "title": "Fruit", "mechanism": "krr", "epsilon": epsilon}
    spec["domain"] = labels
    if period is not None:
        spec["period"] = period
    live_server.create_campaign(spec)
    return campaign_id


class Clock:
    """A device clock moved on by hand: the reporting period is computed from it."""

    def __init__(self) -> None:
        self.now = time.time() // DAY_S * DAY_S + 3600.0  # 01:00 UTC today: far from midnight

    def __call__(self) -> float:
        return self.now

    def next_day(self) -> None:
        self.now += DAY_S


def planar_campaign(live_server) -> str:
    campaign_id = unique_id("where")
    live_server.create_campaign(
        {
            "id": campaign_id,
            "title": "Where",
            "mechanism": "planar_laplace",
            "privacy_level": 1.0,
            "privacy_radius_m": 500.0,
            "region": {"lat_min": 48.10, "lat_max": 48.15, "lon_min": 11.50, "lon_max": 11.60},
            "cell_size_m": 250.0,
        },
    )
    return campaign_id


# Munich: 6 x 8 cells of 1 km.
CELLS_REGION = {"lat_min": 48.10, "lat_max": 48.15, "lon_min": 11.50, "lon_max": 11.60}


def cells_campaign(live_server, mechanism: str = "krr", epsilon: float = 2.0) -> dict:
    """A campaign of ``mechanism`` over the cells of a region; its served spec."""
    return live_server.create_campaign(
        {"id": unique_id("cells"), "title": "Where, by cell", "mechanism": mechanism}
        | {"epsilon": epsilon, "region": CELLS_REGION, "cell_size_m": 1000}
    )


def counts(live_server, campaign_id: str) -> dict[str, int]:
    response = requests.get(
        f"{live_server.url}/api/v1/campaigns/{campaign_id}/counts",
        headers={"Authorization": f"Bearer {live_server.analyst_token}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return {row["label"]: row["count"] for row in response.json()["counts"] if row["count"]}


def total(live_server, campaign_id: str) -> int:
    return sum(counts(live_server, campaign_id).values())


def counted_n(live_server, campaign_id: str) -> int:
    """The campaign's ``n`` as the server serves it (the number its estimates are over)."""
    response = requests.get(
        f"{live_server.url}/api/v1/campaigns/{campaign_id}/counts",
        headers={"Authorization": f"Bearer {live_server.analyst_token}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return int(response.json()["n"])


class Proxy:
    """A TCP forwarder to the server: ``forward``, ``swallow`` answers, or ``stop`` listening.

    ``stop`` also cuts the connections already open (the server keeps connections
    alive). In ``swallow`` mode the request reaches the server, and once the server
    has answered (no more bytes for a moment) the proxy hangs up without passing
    the answer on.
    """

    QUIET_S = 0.3

    def __init__(self, upstream_url: str):
        host, port = upstream_url.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.mode = "forward"
        self.port = 0
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        """Stop listening (new connections are refused) and cut the open ones."""
        if self._listener is not None:
            self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(self.upstream, timeout=10)
        swallow = self.mode == "swallow"
        with self._lock:
            self._open.update((conn, upstream))

        def hang_up() -> None:
            for s in (conn, upstream):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

        def forward_requests() -> None:
            with contextlib.suppress(OSError):
                while chunk := conn.recv(65536):
                    upstream.sendall(chunk)
            hang_up()

        thread = threading.Thread(target=forward_requests, daemon=True)
        thread.start()
        with contextlib.suppress(OSError):
            while chunk := upstream.recv(65536):
                if swallow:
                    upstream.settimeout(self.QUIET_S)  # the rest of this answer, then hang up
                else:
                    conn.sendall(chunk)
        hang_up()
        thread.join(timeout=10)
        with self._lock:
            self._open.difference_update((conn, upstream))
        conn.close()
        upstream.close()


@pytest.fixture
def proxy(live_server):
    p = Proxy(live_server.url)
    yield p
    p.stop()


@pytest.fixture
def reporter_at(tmp_path):
    made = []

    def make(
        url: str, policy: Policy | None = None, name: str = "device", clock: Clock | None = None
    ) -> Reporter:
        extra = {} if clock is None else {"clock": clock}
        reporter = Reporter(
            url, state_dir=str(tmp_path / name), policy=policy, timeout=(2, 10), **extra
        )
        made.append(reporter)
        return reporter

    yield make
    for reporter in made:
        reporter.close()


# -- tests ---------------------------------------------------------------------------------


def test_report_then_estimate(live_server, tmp_path):
    """300 devices report; the server's estimate recovers the distribution within 4.5 sd."""
    epsilon = 2.0
    campaign_id = krr_campaign(live_server, epsilon=epsilon)
    truth = [0.4, 0.3, 0.2, 0.1]
    n = 300
    answers = [LABELS[i] for i, share in enumerate(truth) for _ in range(round(share * n))]
    session = requests.Session()
    waiting = []
    for device, answer in enumerate(answers):
        with Reporter(
            live_server.url, state_dir=str(tmp_path / f"d{device}"), session=session
        ) as reporter:
            outcome = reporter.report(campaign_id, answer).outcome
            assert outcome in ("delivered", "queued")
            if outcome == "queued":  # only if the shared server rate-limits this address
                waiting.append(device)
    deadline = time.monotonic() + 120
    while waiting and time.monotonic() < deadline:
        time.sleep(1)
        for device in list(waiting):
            with Reporter(
                live_server.url, state_dir=str(tmp_path / f"d{device}"), session=session
            ) as reporter:
                if reporter.flush().remaining == 0:
                    waiting.remove(device)
    session.close()
    assert waiting == []
    assert total(live_server, campaign_id) == n
    response = requests.get(
        f"{live_server.url}/api/v1/campaigns/{campaign_id}/estimate",
        params={"method": "inversion"},
        headers={"Authorization": f"Bearer {live_server.analyst_token}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["n"] == n
    estimates = {row["label"]: row["frequency"] for row in body["estimates"]}
    mechanism = KRR(epsilon=epsilon, domain=LABELS)
    p, q = mechanism.p_keep, mechanism.p_other
    for label, share in zip(LABELS, truth, strict=True):
        observed = share * p + (1 - share) * q
        sd = math.sqrt(observed * (1 - observed) / n) / (p - q)
        assert abs(estimates[label] - share) < 4.5 * sd, (label, estimates[label], share, sd)


def test_a_location_report_is_a_grid_cell_the_server_accepts(live_server, reporter_at):
    campaign_id = planar_campaign(live_server)
    reporter = reporter_at(live_server.url)
    first = reporter.report(campaign_id, {"lat": 48.1234, "lon": 11.5678})
    again = reporter.report(campaign_id, {"lat": 48.1234, "lon": 11.5678})
    assert (first.outcome, again.outcome) == ("delivered", "already_reported")
    assert again.payload == first.payload and again.charged == 0
    assert total(live_server, campaign_id) == 1
    with pytest.raises(ReportError, match="outside the campaign region"):
        reporter.report(campaign_id, {"lat": 48.2, "lon": 11.55})
    assert total(live_server, campaign_id) == 1


@pytest.mark.parametrize("name", ["krr", "olh", "hadamard_response"])
def test_a_location_is_snapped_and_perturbed_on_the_device_and_estimated_on_the_grid(
    live_server, tmp_path, name
):
    served = cells_campaign(live_server, name)
    campaign_id = served["id"]
    spec, _ = CampaignSpec.from_wire(served)
    grid = spec.grid
    mechanism = Mechanism.from_spec(spec)
    assert (grid.rows, grid.cols) == (6, 8)
    # Three places, most people at the first.
    places = [(48.1234, 11.5678)] * 24 + [(48.1021, 11.5012)] * 8 + [(48.1489, 11.5987)] * 8
    session = requests.Session()
    for device, (lat, lon) in enumerate(places):
        with Reporter(
            live_server.url, state_dir=str(tmp_path / f"d{device}"), session=session
        ) as reporter:
            result = reporter.report(campaign_id, {"lat": lat, "lon": lon})
        assert result.outcome == "delivered"
        # The ledger charges the mechanism's epsilon, as for any categorical report.
        assert result.charged == 2.0
        # Only the noisy cell (the mechanism's usual report) leaves the device.
        assert set(result.payload) == {"report_id", "value", "spec_hash"}
        mechanism.parse_report_value(result.payload["value"])
        assert str(lat) not in json.dumps(result.payload)
    session.close()
    assert total(live_server, campaign_id) == len(places)
    with Reporter(live_server.url, state_dir=str(tmp_path / "outside")) as reporter:
        with pytest.raises(ReportError, match="outside the campaign region"):
            reporter.report(campaign_id, {"lat": 48.2, "lon": 11.55})
        assert reporter.status()["budget"]["spent"] == 0
    assert total(live_server, campaign_id) == len(places)

    response = requests.get(
        f"{live_server.url}/api/v1/campaigns/{campaign_id}/estimate",
        headers={"Authorization": f"Bearer {live_server.analyst_token}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["n"] == len(places)
    shown = body["grid"]
    assert (shown["rows"], shown["cols"], shown["cell_size_m"]) == (6, 8, 1000)
    assert shown["region"] == CELLS_REGION
    assert len(shown["cells"]) == 6 and all(len(row) == 8 for row in shown["cells"])
    assert shown["lat"] == [grid.centre(row * 8)[0] for row in range(6)]
    assert shown["lon"] == [grid.centre(col)[1] for col in range(8)]
    # The map's cells are the estimate's rows, by label.
    by_label = {row["label"]: row["frequency"] for row in body["estimates"]}
    for index, label in enumerate(grid.cell_labels()):
        assert shown["cells"][index // 8][index % 8] == pytest.approx(by_label[label])
    assert ("raw_cells" in shown) == (name == "krr")  # an oracle's reports are not cells


@pytest.mark.parametrize("period", [None, "day", "week"])
def test_the_same_answer_twice_in_a_period_counts_the_device_once(live_server, reporter_at, period):
    campaign_id = krr_campaign(live_server, period=period)
    reporter = reporter_at(live_server.url, clock=Clock())
    first = reporter.report(campaign_id, "banana")
    second = reporter.report(campaign_id, "banana")
    assert (first.outcome, second.outcome) == ("delivered", "already_reported")
    assert second.payload == first.payload
    assert (first.charged, second.charged) == (1.0, 0.0)
    assert counts(live_server, campaign_id) == {first.payload["value"]: 1}
    assert counted_n(live_server, campaign_id) == 1
    assert reporter.status()["budget"]["spent"] == 1.0
    with pytest.raises(AlreadyReported, match="nothing was spent or sent"):
        reporter.report(campaign_id, "cherry")
    assert total(live_server, campaign_id) == 1


def test_a_repeat_after_a_lost_acknowledgement_is_counted_once(live_server, proxy, reporter_at):
    """The server stored the day's report but the device never heard: the repeat re-sends it."""
    campaign_id = krr_campaign(live_server, period="day")
    clock = Clock()
    reporter = reporter_at(proxy.url, clock=clock)
    reporter.report(campaign_id, "apple")  # yesterday's: pins the campaign
    clock.next_day()
    proxy.stop()
    queued = reporter.report(campaign_id, "banana")
    assert queued.outcome == "queued"
    proxy.mode = "swallow"  # the server stores it, the device never hears back
    proxy.start()
    assert reporter.flush().remaining == 1
    assert total(live_server, campaign_id) == 2
    proxy.mode = "forward"
    clock.now += BACKOFF_BASE_S  # past the first retry's backoff, the same day
    again = reporter.report(campaign_id, "banana")
    assert (again.outcome, again.repeat, again.charged) == ("duplicate", True, 0.0)
    assert again.payload == queued.payload
    assert reporter.status()["queue"]["pending"] == 0
    assert reporter.report(campaign_id, "banana").outcome == "already_reported"
    assert total(live_server, campaign_id) == 2


def test_a_new_period_sends_a_new_report_id(live_server, reporter_at):
    campaign_id = krr_campaign(live_server, period="day")
    clock = Clock()
    reporter = reporter_at(live_server.url, clock=clock)
    today = reporter.report(campaign_id, "banana")
    clock.next_day()
    tomorrow = reporter.report(campaign_id, "banana")
    again = reporter.report(campaign_id, "banana")
    assert (today.outcome, tomorrow.outcome, again.outcome) == (
        "delivered",
        "delivered",
        "already_reported",
    )
    assert tomorrow.payload["report_id"] != today.payload["report_id"]
    assert tomorrow.payload["value"] == today.payload["value"]  # memoized across periods
    assert (today.charged, tomorrow.charged) == (1.0, 0.0)
    assert counts(live_server, campaign_id) == {today.payload["value"]: 2}
    clock.next_day()
    changed = reporter.report(campaign_id, "cherry")  # a changed answer: charged as before
    assert changed.outcome == "delivered" and changed.charged == 1.0
    assert total(live_server, campaign_id) == 3 and reporter.status()["budget"]["spent"] == 2.0


def test_over_cap_and_over_budget_are_refused(live_server, reporter_at):
    costly = krr_campaign(live_server, epsilon=3.0)
    campaigns = [krr_campaign(live_server, epsilon=1.0) for _ in range(3)]
    reporter = reporter_at(live_server.url, Policy(max_epsilon=2.0, total_budget=2.5))
    with pytest.raises(EpsilonCapExceeded):
        reporter.report(costly, "apple")
    reporter.report(campaigns[0], "apple")
    reporter.report(campaigns[1], "banana")
    with pytest.raises(BudgetExceeded):
        reporter.report(campaigns[2], "cherry")
    assert total(live_server, costly) == 0
    assert [total(live_server, c) for c in campaigns] == [1, 1, 0]
    assert reporter.status()["budget"]["spent"] == 2.0


def test_a_spec_changed_behind_the_api_is_refused(live_server, reporter_at):
    """A breached server rewrites the stored spec: the device notices and refuses."""
    campaign_id = krr_campaign(live_server, epsilon=1.0)
    reporter = reporter_at(live_server.url, Policy(max_epsilon=5.0))
    reporter.report(campaign_id, "apple")
    altered = CampaignSpec.from_dict(
        {"id": campaign_id, "title": "Fruit", "mechanism": "krr", "epsilon": 4.0, "domain": LABELS}
    )
    connection = redis.Redis.from_url(live_server.redis_url)
    try:
        connection.hset(
            f"ldp:{{c:{campaign_id}}}:campaign",
            mapping={"spec": altered.canonical_json(), "spec_hash": altered.spec_hash},
        )
        # Each shard keeps a copy of the spec hash, checked by the ingestion script.
        for shard_state in connection.scan_iter(match=f"ldp:{{c:{campaign_id}:*}}:state"):
            connection.hset(shard_state, "spec_hash", altered.spec_hash)
    finally:
        connection.close()
    served = requests.get(f"{live_server.url}/api/v1/campaigns/{campaign_id}", timeout=10).json()
    assert served["epsilon"] == 4.0 and served["spec_hash"] == altered.spec_hash
    with pytest.raises(SpecChanged):
        reporter.report(campaign_id, "banana")
    assert total(live_server, campaign_id) == 1
    assert reporter.status()["budget"]["spent"] == 1.0


def test_a_closed_campaign_is_refused(live_server, reporter_at):
    campaign_id = krr_campaign(live_server)
    response = requests.patch(
        f"{live_server.url}/api/v1/campaigns/{campaign_id}",
        json={"status": "closed"},
        headers={"Authorization": f"Bearer {live_server.admin_token}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    reporter = reporter_at(live_server.url)
    with pytest.raises(CampaignClosed):
        reporter.report(campaign_id, "apple")
    assert reporter.status()["budget"]["spent"] == 0


def test_server_down_then_flush_delivers_each_report_exactly_once(live_server, proxy, reporter_at):
    campaign_id = krr_campaign(live_server, period="day")
    clock = Clock()
    reporter = reporter_at(proxy.url, clock=clock)
    first = reporter.report(campaign_id, "apple")
    assert first.outcome == "delivered"

    proxy.stop()
    queued = []
    for value in ("banana", "apple", "banana", "cherry"):
        clock.next_day()
        queued.append(reporter.report(campaign_id, value))
    assert [r.outcome for r in queued] == ["queued"] * 4
    again = reporter.report(campaign_id, "cherry")  # the day's report, still waiting: not twice
    assert again.outcome == "queued" and again.payload == queued[-1].payload
    assert reporter.flush().remaining == 4  # still down
    assert total(live_server, campaign_id) == 1

    proxy.mode = "swallow"  # the server stores the batch, the device never hears back
    proxy.start()
    swallowed = reporter.flush()
    assert swallowed.remaining == 4 and swallowed.errors
    assert total(live_server, campaign_id) == 5

    proxy.mode = "forward"
    flushed = reporter.flush()
    assert (flushed.accepted, flushed.duplicates, flushed.remaining) == (0, 4, 0)
    assert reporter.flush().attempted == 0
    expected = Counter(r.payload["value"] for r in [first, *queued])
    assert counts(live_server, campaign_id) == dict(expected)
    assert reporter.status()["budget"]["spent"] == 3.0  # apple, banana, cherry


def test_an_unreachable_server_for_a_new_campaign_spends_nothing(live_server, proxy, reporter_at):
    campaign_id = krr_campaign(live_server)
    reporter = reporter_at(proxy.url)
    proxy.stop()
    with pytest.raises(ServerUnavailable, match="nothing was spent or sent"):
        reporter.report(campaign_id, "apple")
    assert reporter.status()["budget"]["spent"] == 0
    assert reporter.status()["queue"]["pending"] == 0


def test_the_server_refuses_a_tampered_queued_report(live_server, proxy, reporter_at):
    """A report queued under one spec is refused by the server once the spec changed."""
    campaign_id = krr_campaign(live_server, period="day")
    clock = Clock()
    reporter = reporter_at(proxy.url, clock=clock)
    reporter.report(campaign_id, "apple")
    proxy.stop()
    clock.next_day()
    reporter.report(campaign_id, "banana")
    altered = CampaignSpec.from_dict(
        {
            "id": campaign_id,
            "title": "Fruit v2",
            "mechanism": "krr",
            "epsilon": 1.0,
            "domain": LABELS,
            "period": "day",
        }
    )
    connection = redis.Redis.from_url(live_server.redis_url)
    try:
        connection.hset(
            f"ldp:{{c:{campaign_id}}}:campaign",
            mapping={"spec": altered.canonical_json(), "spec_hash": altered.spec_hash},
        )
        # Each shard keeps a copy of the spec hash, checked by the ingestion script.
        for shard_state in connection.scan_iter(match=f"ldp:{{c:{campaign_id}:*}}:state"):
            connection.hset(shard_state, "spec_hash", altered.spec_hash)
    finally:
        connection.close()
    proxy.start()
    result = reporter.flush()
    assert result.remaining == 0 and len(result.rejected) == 1
    assert result.rejected[0]["code"] == "spec_mismatch"
    assert json.loads(json.dumps(reporter.status()))["rejected"][0]["error"]["status"] == 409
    assert total(live_server, campaign_id) == 1
