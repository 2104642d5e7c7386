"""The dashboards in a real headless Chromium against a real server process and Redis.

Campaigns are seeded through the HTTP API with reports perturbed by
``shared.mechanisms``; what the page draws is compared with what the estimate
API returns for the same counts. Every test ends by checking that the page
logged no console error, and leaves a screenshot in ``artifacts/screenshots/``.
"""

from __future__ import annotations

import csv
import http.server
import itertools
import random
import re
import struct
import threading
import uuid
import zlib
from pathlib import Path

import pytest
import requests
from playwright.sync_api import Browser, Page, expect, sync_playwright
from support import running_server

from aggregator.dashboard.data import decimal_text, estimate_details, share_text
from aggregator.estimation.advice import oracle_mse
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LAPTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}
HTTP_TIMEOUT_S = 30
RENDER_TIMEOUT_MS = 30_000
# A drawn bar's height may differ from the exact proportion by this many pixels.
BAR_PIXEL_TOLERANCE = 1.5
SUFFIX = uuid.uuid4().hex[:8]
# Methods computed in one step: the page says "closed form" for their iterations.
CLOSED_FORM = ("projection", "clip", "inversion")
# Reports seeded per campaign (before any test posts more).
SEEDED = {"fruit": 1500, "words": 1500, "where": 800, "live": 40, "tiny": 20000}
# The true shares of the "tiny" campaign: four of them are under 2% (the newcomer's case).
TINY_SHARES = {
    "walk": 0.55,
    "bike": 0.25,
    "bus": 0.12,
    "train": 0.05,
    "car": 0.015,
    "scooter": 0.008,
    "ferry": 0.005,
    "skate": 0.002,
}
# Two markers this many pixels apart are told apart at a glance.
DISTINCT_PX = 10


class Seeder:
    """Creates campaigns and posts perturbed reports through the server's HTTP API."""

    def __init__(self, server) -> None:
        self.api = f"{server.url}/api/v1"
        self.admin = {"Authorization": f"Bearer {server.admin_token}"}
        self.analyst = {"Authorization": f"Bearer {server.analyst_token}"}

    def create(self, spec: dict) -> dict:
        response = requests.post(
            f"{self.api}/campaigns", json=spec, headers=self.admin, timeout=HTTP_TIMEOUT_S
        )
        assert response.status_code == 201, response.text
        return spec

    def post(self, spec: dict, values: list, seed: int) -> None:
        mechanism = Mechanism.from_spec(CampaignSpec.from_dict(spec))
        rng = random.Random(seed)
        reports = [
            {
                "report_id": str(uuid.UUID(int=rng.getrandbits(128))),
                "value": mechanism.perturb(value, rng),
            }
            for value in values
        ]
        for start in range(0, len(reports), 1000):
            response = requests.post(
                f"{self.api}/campaigns/{spec['id']}/reports",
                json={"reports": reports[start : start + 1000]},
                timeout=HTTP_TIMEOUT_S,
            )
            assert response.status_code == 200, response.text

    def get(self, path: str) -> dict:
        response = requests.get(f"{self.api}{path}", headers=self.analyst, timeout=HTTP_TIMEOUT_S)
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture(scope="module")
def seeder(live_server) -> Seeder:
    return Seeder(live_server)


@pytest.fixture(scope="module")
def campaigns(seeder: Seeder) -> dict[str, dict]:
    """Four campaigns' specs: a k-RR, a large k-RR, a planar one, a live one (see SEEDED)."""
    rng = random.Random(2024)
    fruit = seeder.create(
        {
            "id": f"dash-fruit-{SUFFIX}",
            "title": "Favourite fruit (browser test)",
            "mechanism": "krr",
            "epsilon": 1.0,
            "domain": ["apple", "banana", "cherry", "damson", "elderberry"],
        }
    )
    seeder.post(fruit, rng.choices(fruit["domain"], [8, 5, 3, 2, 1], k=1500), seed=1)
    words = seeder.create(
        {
            "id": f"dash-words-{SUFFIX}",
            "title": "Favourite word (browser test)",
            "mechanism": "krr",
            "epsilon": 3.0,
            "domain": [f"w{i:02d}" for i in range(60)],
        }
    )
    weights = [1 / (i + 1) for i in range(60)]
    seeder.post(words, rng.choices(words["domain"], weights, k=1500), seed=2)
    where = seeder.create(
        {
            "id": f"dash-where-{SUFFIX}",
            "title": "Home location (browser test)",
            "mechanism": "planar_laplace",
            "epsilon": 0.01,
            "region": {"lat_min": 51.50, "lat_max": 51.52, "lon_min": -0.14, "lon_max": -0.11},
            "cell_size_m": 250,
        }
    )
    region = where["region"]
    spots = [
        {"lat": rng.uniform(51.503, 51.507), "lon": rng.uniform(-0.135, -0.13)} for _ in range(500)
    ] + [
        {
            "lat": rng.uniform(region["lat_min"], region["lat_max"]),
            "lon": rng.uniform(region["lon_min"], region["lon_max"]),
        }
        for _ in range(300)
    ]
    seeder.post(where, spots, seed=3)
    live = seeder.create(
        {
            "id": f"dash-live-{SUFFIX}",
            "title": "Live campaign (browser test)",
            "mechanism": "rr",
            "epsilon": 1.0,
        }
    )
    seeder.post(live, rng.choices(["no", "yes"], k=40), seed=4)
    tiny = seeder.create(
        {
            "id": f"dash-tiny-{SUFFIX}",
            "title": "Commute, some modes rare (browser test)",
            "mechanism": "krr",
            "epsilon": 5.0,
            "domain": list(TINY_SHARES),
        }
    )
    seeder.post(
        tiny,
        [
            label
            for label, share in TINY_SHARES.items()
            for _ in range(round(share * SEEDED["tiny"]))
        ],
        seed=9,
    )
    return {"fruit": fruit, "words": words, "where": where, "live": live, "tiny": tiny}


@pytest.fixture(scope="module")
def browser() -> Browser:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class Tab:
    """A page in its own browser context, recording console errors and taking screenshots."""

    def __init__(
        self,
        browser: Browser,
        base_url: str,
        name: str,
        viewport: dict,
        storage_state: dict | None = None,
    ) -> None:
        self.base = f"{base_url}/dashboard"
        self.name = name
        self.context = browser.new_context(
            viewport=viewport, accept_downloads=True, storage_state=storage_state
        )
        self.page: Page = self.context.new_page()
        self.page.set_default_timeout(RENDER_TIMEOUT_MS)
        self.errors: list[str] = []
        self.page.on(
            "console",
            lambda message: self.errors.append(message.text) if message.type == "error" else None,
        )
        self.page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))

    def goto(self, path: str) -> None:
        self.page.goto(self.base + path)

    def sign_in(self, token: str) -> None:
        self.goto("/login")
        self.page.fill("#token", token)
        self.page.click("form.stack button[type=submit]")
        self.page.wait_for_url(self.base + "/")

    def open_campaign(self, campaign_id: str) -> None:
        self.goto(f"/campaigns/{campaign_id}")
        self.wait_rendered()

    def wait_rendered(self, method: str | None = None, n: int | None = None) -> None:
        """Wait until the page has drawn an estimate (the page's CSP forbids eval'd waits),
        by default with the method the page selects first (the campaign's default)."""
        if method is None:
            method = self.page.get_attribute("#method option[selected]", "value")
        selector = f'main[data-rendered-method="{method}"]'
        if n is not None:
            selector += f'[data-rendered-n="{n}"]'
        self.page.wait_for_selector(selector, state="attached")

    def shot(self, label: str = "") -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        name = f"{self.name}-{label}" if label else self.name
        self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

    def assert_no_console_errors(self) -> None:
        assert self.errors == []

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab_factory(browser, live_server, request):
    tabs: list[Tab] = []

    def make(viewport: dict = LAPTOP, label: str = "", storage_state: dict | None = None) -> Tab:
        name = request.node.name.removeprefix("test_") + (f"-{label}" if label else "")
        tab = Tab(browser, live_server.url, name, viewport, storage_state)
        tabs.append(tab)
        return tab

    yield make
    for tab in tabs:
        tab.shot("end")
        tab.close()


@pytest.fixture(scope="module")
def signed_in_state(browser, live_server) -> dict:
    """The cookies of one sign-in, shared by the tests that do not test signing in.

    Signing in for every test would run into the sign-in rate limit (RATELIMIT_LOGIN).
    """
    tab = Tab(browser, live_server.url, "sign-in", LAPTOP)
    tab.sign_in(live_server.analyst_token)
    state = tab.context.storage_state()
    tab.close()
    return state


@pytest.fixture
def tab(tab_factory, signed_in_state) -> Tab:
    """A signed-in laptop-sized tab."""
    return tab_factory(storage_state=signed_in_state)


def chart_trace(page: Page, element_id: str) -> dict:
    return page.evaluate(
        """(id) => {
            const trace = document.getElementById(id).data[0];
            return {x: Array.from(trace.x), y: Array.from(trace.y), type: trace.type,
                    z: trace.z ? trace.z.map((row) => Array.from(row)) : null,
                    zmin: trace.zmin, zmax: trace.zmax, colorscale: trace.colorscale};
        }""",
        element_id,
    )


def bar_heights(page: Page, trace: int = 0) -> list[float]:
    """Pixel heights of one trace's drawn bars (0: the estimate), in the order plotly drew them."""
    return page.evaluate(
        """(index) => Array.from(document.querySelectorAll('#estimate-chart .barlayer .trace')
                 [index].querySelectorAll('.point path')).map((path) => path.getBBox().height)""",
        trace,
    )


# -- tests ------------------------------------------------------------------------------------


def test_signed_out_access_is_refused(tab_factory, live_server, campaigns):
    fruit = campaigns["fruit"]
    tab = tab_factory()
    tab.goto(f"/campaigns/{fruit['id']}")
    assert "/dashboard/login" in tab.page.url
    assert fruit["title"] not in tab.page.content()
    for path in ("summary", "estimate", "estimate.csv", "estimate.json"):
        response = tab.context.request.get(f"{tab.base}/data/campaigns/{fruit['id']}/{path}")
        assert response.status == 401
    tab.goto("/")
    assert "/dashboard/login" in tab.page.url
    assert "<table" not in tab.page.content()

    tab.page.fill("#token", "not-the-token")
    tab.page.press("#token", "Enter")
    tab.page.wait_for_selector("#login-error")
    assert "not valid" in tab.page.inner_text("#login-error")
    assert "/dashboard/login" in tab.page.url
    tab.shot("wrong-token")
    # The refused sign-in is a 401 document, which Chromium logs; nothing else may be.
    assert tab.errors == [
        "Failed to load resource: the server responded with a status of 401 (UNAUTHORIZED)"
    ]


def test_sign_in_lists_the_seeded_campaigns(tab, campaigns):
    tab.goto("/")
    tab.shot("list")
    for key, mechanism in (
        ("fruit", "k-ary randomized response"),
        ("words", "k-ary randomized response"),
        ("where", "Planar Laplace"),
        ("live", "Randomized response"),
    ):
        campaign = campaigns[key]
        row = tab.page.locator(f'tr[data-campaign="{campaign["id"]}"]')
        cells = row.locator("th, td").all_inner_texts()
        assert campaign["title"] in cells[0]
        assert cells[1] == mechanism
        assert cells[2].startswith(f"{campaign['epsilon']:g}")
        assert cells[3] == "open"
        assert int(cells[4].replace(",", "")) >= SEEDED[key]
        assert cells[5].endswith("UTC")
    tab.assert_no_console_errors()


def test_sign_in_then_sign_out(tab_factory, live_server, campaigns):
    fruit = campaigns["fruit"]
    tab = tab_factory()
    tab.goto(f"/campaigns/{fruit['id']}")
    tab.page.fill("#token", live_server.analyst_token)
    tab.page.press("#token", "Enter")
    tab.page.wait_for_url(f"{tab.base}/campaigns/{fruit['id']}")
    tab.wait_rendered()
    tab.page.click("text=Sign out")
    tab.page.wait_for_url(f"{tab.base}/login?signed_out=1")
    assert "You are signed out." in tab.page.inner_text("main")
    tab.goto(f"/campaigns/{fruit['id']}")
    assert "/dashboard/login" in tab.page.url
    response = tab.context.request.get(f"{tab.base}/data/campaigns/{fruit['id']}/summary")
    assert response.status == 401
    tab.assert_no_console_errors()


def test_krr_bars_match_the_estimate_api(tab, seeder, campaigns):
    fruit = campaigns["fruit"]
    tab.open_campaign(fruit["id"])
    tab.shot("default")
    api = seeder.get(f"/campaigns/{fruit['id']}/estimate")
    assert api["n"] == SEEDED["fruit"]
    trace = chart_trace(tab.page, "estimate-chart")
    assert trace["type"] == "bar"
    # All five categories are shown, largest first.
    by_label = {row["label"]: row["frequency"] for row in api["estimates"]}
    assert sorted(trace["x"]) == sorted(fruit["domain"])
    assert trace["y"] == pytest.approx([by_label[label] for label in trace["x"]], abs=1e-12)
    assert trace["y"] == sorted(trace["y"], reverse=True)
    heights = bar_heights(tab.page)
    assert len(heights) == len(fruit["domain"])
    scale = heights[0] / trace["y"][0]
    for height, frequency in zip(heights, trace["y"], strict=True):
        assert abs(height - frequency * scale) <= BAR_PIXEL_TOLERANCE
    assert tab.page.inner_text("#estimate-n") == f"{SEEDED['fruit']:,}"
    # The page names the method that ran, and counts iterations only where there were some.
    assert tab.page.get_attribute("main", "data-rendered-method") == api["method"]
    if api["n_iter"] is not None:
        assert tab.page.inner_text("#estimate-iterations").startswith(f"{api['n_iter']:,}")
    elif api["method"] in CLOSED_FORM:
        assert tab.page.inner_text("#estimate-iterations") == "closed form"
    rows = tab.page.locator("#estimate-table tbody tr").count()
    assert rows == len(fruit["domain"])
    tab.assert_no_console_errors()


def test_switching_the_method_changes_the_chart(tab, seeder, campaigns):
    fruit = campaigns["fruit"]
    tab.open_campaign(fruit["id"])
    before = chart_trace(tab.page, "estimate-chart")
    before_by_label = dict(zip(before["x"], before["y"], strict=True))
    # The default (Norm-Sub) is the inversion itself wherever that has no negative share, as
    # here: cross-validated IBU, which stops early, gives other numbers.
    tab.page.select_option("#method", "ibu")
    tab.wait_rendered("ibu")
    after = chart_trace(tab.page, "estimate-chart")
    api = seeder.get(f"/campaigns/{fruit['id']}/estimate?method=ibu")
    by_label = {row["label"]: row["frequency"] for row in api["estimates"]}
    assert after["y"] == pytest.approx([by_label[label] for label in after["x"]], abs=1e-12)
    change = max(abs(by_label[label] - before_by_label[label]) for label in fruit["domain"])
    assert change > 1e-4
    assert tab.page.inner_text("#estimate-estimator") == api["estimator"]
    tab.page.select_option("#method", "inversion")
    tab.wait_rendered("inversion")
    tab.shot("inversion")
    after = chart_trace(tab.page, "estimate-chart")
    api = seeder.get(f"/campaigns/{fruit['id']}/estimate?method=inversion")
    by_label = {row["label"]: row["frequency"] for row in api["estimates"]}
    assert after["y"] == pytest.approx([by_label[label] for label in after["x"]], abs=1e-12)
    assert tab.page.inner_text("#estimate-iterations") == "closed form"

    with tab.page.expect_download() as download:
        tab.page.click("#download-csv")
    assert download.value.suggested_filename == f"{fruit['id']}-estimate-inversion.csv"
    with open(download.value.path(), encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["label"]: float(row["frequency"]) for row in rows} == pytest.approx(by_label)
    tab.assert_no_console_errors()


def test_large_domain_top_n_and_sorting(tab, seeder, campaigns):
    words = campaigns["words"]
    tab.open_campaign(words["id"])
    # Bars, which this test counts: all 60 shares span more than the automatic scale draws
    # as bars.
    tab.page.select_option("#scale", "linear")
    api = seeder.get(f"/campaigns/{words['id']}/estimate")
    ranked = sorted(api["estimates"], key=lambda row: -row["frequency"])
    trace = chart_trace(tab.page, "estimate-chart")
    assert tab.page.input_value("#top") == "20"
    assert len(bar_heights(tab.page)) == 20
    assert trace["x"] == [row["label"] for row in ranked[:20]]

    tab.page.select_option("#sort", "domain")
    trace = chart_trace(tab.page, "estimate-chart")
    top = {row["label"] for row in ranked[:20]}
    assert trace["x"] == [label for label in words["domain"] if label in top]

    tab.page.select_option("#top", "all")
    expect(
        tab.page.locator("#estimate-chart .barlayer .trace").first.locator(".point")
    ).to_have_count(60)
    assert chart_trace(tab.page, "estimate-chart")["x"] == words["domain"]
    assert len(bar_heights(tab.page)) == 60
    tab.shot("all")
    tab.assert_no_console_errors()


def test_planar_campaign_renders_both_heatmaps(tab, seeder, campaigns):
    where = campaigns["where"]
    spec = CampaignSpec.from_dict(where)
    grid = spec.grid
    tab.open_campaign(where["id"])
    tab.shot("heatmaps")
    raw = chart_trace(tab.page, "heatmap-raw")
    estimate = chart_trace(tab.page, "heatmap-estimate")
    for trace in (raw, estimate):
        assert trace["type"] == "heatmap"
        assert len(trace["z"]) == grid.rows
        assert all(len(row) == grid.cols for row in trace["z"])
        assert trace["y"] == pytest.approx(
            [grid.centre(r * grid.cols)[0] for r in range(grid.rows)]
        )
        assert trace["x"] == pytest.approx([grid.centre(c)[1] for c in range(grid.cols)])
    # One colour scale for both.
    assert (raw["zmin"], raw["zmax"], raw["colorscale"]) == (
        estimate["zmin"],
        estimate["zmax"],
        estimate["colorscale"],
    )
    assert raw["zmax"] == pytest.approx(max(max(row) for row in raw["z"] + estimate["z"]))
    counts = seeder.get(f"/campaigns/{where['id']}/counts")
    api = seeder.get(f"/campaigns/{where['id']}/estimate")
    for index in range(grid.n_cells):
        row, col = divmod(index, grid.cols)
        assert raw["z"][row][col] == pytest.approx(
            counts["counts"][index]["count"] / SEEDED["where"]
        )
        assert estimate["z"][row][col] == pytest.approx(api["estimates"][index]["frequency"])
    for element_id in ("heatmap-raw", "heatmap-estimate"):
        assert tab.page.locator(f"#{element_id} .hm image").count() == 1
    tab.assert_no_console_errors()


def test_the_headline_and_interval_method_show_and_the_details_open_on_request(
    tab, seeder, campaigns
):
    where = campaigns["where"]
    tab.open_campaign(where["id"])
    api = seeder.get(f"/campaigns/{where['id']}/estimate")
    assert tab.page.inner_text("#estimate-estimator") == api["estimator"]
    intervals = tab.page.inner_text("#estimate-intervals")
    assert intervals.startswith("95%, ") and len(intervals) < len(api["interval_method"]) + 6
    assert api["interval_method"].startswith(intervals.removeprefix("95%, ").rstrip("…"))
    # Closed at first: the details are there to be opened.
    disclosure = tab.page.locator("#estimate-details")
    assert disclosure.get_attribute("open") is None
    expect(tab.page.locator("#estimate-details-list")).to_be_hidden()
    tab.page.click("#estimate-details summary")
    expect(tab.page.locator("#estimate-details-list")).to_be_visible()
    tab.shot("details")
    names = tab.page.locator("#estimate-details-list dt").all_inner_texts()
    values = tab.page.locator("#estimate-details-list dd").all_inner_texts()
    shown = dict(zip(names, values, strict=True))
    details = estimate_details(api)
    assert details, "the default estimate of a map gives its details"
    for key in details:
        assert key.replace("_", " ") in shown
    assert shown["method"] == api["method"]
    # The whole interval sentence is behind the disclosure when the line above shortened it.
    if intervals != f"95%, {api['interval_method']}":
        assert shown["interval method"] == api["interval_method"]
    tab.assert_no_console_errors()


def test_geometric_campaign_draws_its_range_as_a_line_with_a_band(tab, seeder):
    age = seeder.create(
        {
            "id": f"dash-age-{SUFFIX}",
            "title": "Age (browser test)",
            "mechanism": "geometric",
            "epsilon": 0.3,
            "lo": 10,
            "hi": 89,
        }
    )
    rng = random.Random(5)
    seeder.post(age, [min(89, max(10, round(rng.gauss(42, 9)))) for _ in range(1200)], seed=5)
    tab.open_campaign(age["id"])
    tab.shot("line")
    api = seeder.get(f"/campaigns/{age['id']}/estimate")
    traces = tab.page.evaluate(
        """() => document.getElementById('estimate-chart').data.map((trace) => ({
            name: trace.name, type: trace.type, fill: trace.fill || null,
            x: Array.from(trace.x), y: Array.from(trace.y)}))"""
    )
    low, high, line, raw = traces
    values = list(range(10, 90))
    assert all(trace["type"] == "scatter" and trace["x"] == values for trace in traces)
    assert line["name"] == "estimate"
    assert line["y"] == pytest.approx([row["frequency"] for row in api["estimates"]], abs=1e-12)
    assert low["y"] == pytest.approx([row["ci_low"] for row in api["estimates"]], abs=1e-12)
    assert (high["fill"], high["y"]) == (
        "tonexty",
        pytest.approx([row["ci_high"] for row in api["estimates"]], abs=1e-12),
    )
    assert raw["y"] == pytest.approx([row["raw_frequency"] for row in api["estimates"]])
    assert tab.page.inner_text("#value-range") == "10 to 89 (80 values)"
    assert tab.page.locator("#sort").count() == 0 and tab.page.locator("#top").count() == 0
    # The table lists the 20 most likely values, most likely first.
    ranked = sorted(api["estimates"], key=lambda row: -row["frequency"])[:20]
    shown = tab.page.locator("#estimate-table tbody th").all_inner_texts()
    assert shown == [row["label"] for row in ranked]
    tab.page.select_option("#method", "inversion")
    tab.wait_rendered("inversion")
    assert tab.page.inner_text("#estimate-iterations") == "closed form"
    tab.assert_no_console_errors()


def test_exponential_grid_campaign_renders_the_map_of_its_cells(tab, seeder):
    block = seeder.create(
        {
            "id": f"dash-block-{SUFFIX}",
            "title": "Block (browser test)",
            "mechanism": "exponential_grid",
            "metric": "euclidean",
            "epsilon": 0.004,
            "region": {"lat_min": 37.77, "lat_max": 37.78, "lon_min": -122.42, "lon_max": -122.41},
            "cell_size_m": 200,
        }
    )
    grid = CampaignSpec.from_dict(block).grid
    centre = grid.to_latlon(*grid.centre_xy(grid.n_cells // 2))
    seeder.post(block, [{"lat": centre[0], "lon": centre[1]}] * 400, seed=6)
    tab.open_campaign(block["id"])
    tab.shot("grid-heatmaps")
    api = seeder.get(f"/campaigns/{block['id']}/estimate?method=ibu")
    estimate = chart_trace(tab.page, "heatmap-estimate")
    assert estimate["type"] == "heatmap" and len(estimate["z"]) == grid.rows
    for index in range(grid.n_cells):
        row, col = divmod(index, grid.cols)
        assert estimate["z"][row][col] == pytest.approx(api["estimates"][index]["frequency"])
    assert "per m of euclidean distance" in tab.page.inner_text("dl.facts")
    tab.assert_no_console_errors()


# -- maps of region campaigns, and the basemap over local tiles ----------------------------

MAP_SHOTS = Path("/tmp/shots")
DOWNTOWN = {"lat_min": 37.775, "lat_max": 37.785, "lon_min": -122.42, "lon_max": -122.405}
TILE_PATH = re.compile(r"^/(\d+)/(\d+)/(\d+)\.png$")
TILE_TOKEN = "tiles-admin-token-0123456789abcdefghij"
TILE_ANALYST_TOKEN = "tiles-analyst-token-0123456789abcdefghij"


def region_krr_spec(campaign_id: str) -> dict:
    return {
        "id": campaign_id,
        "title": "Which cell downtown (browser test)",
        "mechanism": "krr",
        "epsilon": 4.0,
        "region": DOWNTOWN,
        "cell_size_m": 150,
    }


def downtown_spots(seed: int, n: int = 1500) -> list[dict]:
    """Most reporters near one corner, the rest anywhere downtown."""
    rng = random.Random(seed)
    near = [
        {"lat": rng.uniform(37.776, 37.778), "lon": rng.uniform(-122.418, -122.415)}
        for _ in range(n * 2 // 3)
    ]
    anywhere = [
        {
            "lat": rng.uniform(DOWNTOWN["lat_min"], DOWNTOWN["lat_max"]),
            "lon": rng.uniform(DOWNTOWN["lon_min"], DOWNTOWN["lon_max"]),
        }
        for _ in range(n - len(near))
    ]
    return near + anywhere


def street_tile_png(size: int = 256, block: int = 32) -> bytes:
    """A pale tile crossed by darker "streets" every ``block`` pixels, as a PNG."""
    rows = []
    for y in range(size):
        line = bytearray([0])  # filter: none
        for x in range(size):
            street = x % block < 3 or y % block < 3
            line += bytes((200, 200, 205) if street else (242, 239, 233))
        rows.append(bytes(line))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


@pytest.fixture(scope="module")
def tile_server():
    """A tile server on 127.0.0.1: one PNG for every /{z}/{x}/{y}.png, each path recorded."""
    png = street_tile_png()
    requested: list[str] = []

    class Tiles(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requested.append(self.path)
            if TILE_PATH.match(self.path) is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Tiles)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {"url": f"http://127.0.0.1:{server.server_port}", "requested": requested}
    server.shutdown()
    server.server_close()


def test_a_region_krr_campaign_is_drawn_as_maps_not_a_bar_chart(tab, seeder, tile_server):
    cells = seeder.create(region_krr_spec(f"dash-cells-{SUFFIX}"))
    grid = CampaignSpec.from_dict(cells).grid
    seeder.post(cells, downtown_spots(seed=44), seed=45)
    before = len(tile_server["requested"])
    tab.open_campaign(cells["id"])
    assert tab.page.locator("#estimate-chart").count() == 0
    api = seeder.get(f"/campaigns/{cells['id']}/estimate")
    raw = chart_trace(tab.page, "heatmap-raw")
    estimate = chart_trace(tab.page, "heatmap-estimate")
    for trace in (raw, estimate):
        assert trace["type"] == "heatmap"
        assert (len(trace["z"]), len(trace["z"][0])) == (grid.rows, grid.cols)

    def flat(z: list[list[float]]) -> list[float]:
        return [share for line in z for share in line]

    assert flat(estimate["z"]) == pytest.approx(flat(api["grid"]["cells"]))
    assert flat(raw["z"]) == pytest.approx(flat(api["grid"]["raw_cells"]))
    assert "cells of 150 m" in tab.page.inner_text("dl.facts")
    # The basemap is off by default: no map library, no tile fetched.
    assert tab.page.locator("#basemap").count() == 0
    assert tab.page.evaluate("() => typeof window.L") == "undefined"
    assert len(tile_server["requested"]) == before
    MAP_SHOTS.mkdir(parents=True, exist_ok=True)
    tab.page.locator("#estimate-section").screenshot(path=str(MAP_SHOTS / "region-krr-map.png"))
    tab.assert_no_console_errors()


def test_the_basemap_draws_the_cells_over_tiles_from_the_configured_server(
    browser, tile_server, tmp_path
):
    tiles_url = tile_server["url"] + "/{z}/{x}/{y}.png"
    settings = {
        "LDP_ADMIN_TOKEN": TILE_TOKEN,
        "LDP_ANALYST_TOKEN": TILE_ANALYST_TOKEN,
        "LDP_RATELIMIT_REPORTS": "100000 per minute",
        "LDP_REPORT_BUDGET": "10000000 per hour",
        "LDP_MAP_TILES_URL": tiles_url,
        "LDP_MAP_TILES_ATTRIBUTION": "Local test tiles <not html>",
    }
    with running_server(tmp_path / "data", env=settings, workers=1) as server:
        seeder = Seeder(
            type(
                "Server",
                (),
                {"url": server.url, "admin_token": TILE_TOKEN, "analyst_token": TILE_ANALYST_TOKEN},
            )
        )
        cells = seeder.create(region_krr_spec(f"dash-tiles-{SUFFIX}"))
        grid = CampaignSpec.from_dict(cells).grid
        seeder.post(cells, downtown_spots(seed=46), seed=47)
        tab = Tab(browser, server.url, "basemap-local-tiles", LAPTOP)
        try:
            tab.sign_in(TILE_ANALYST_TOKEN)
            before = len(tile_server["requested"])
            response = tab.page.goto(f"{tab.base}/campaigns/{cells['id']}")
            policy = response.headers["content-security-policy"]
            assert f"img-src 'self' data: blob: {tile_server['url']};" in policy
            tab.wait_rendered()
            tab.page.wait_for_selector(
                f'main[data-basemap-cells="{grid.n_cells}"]', state="attached"
            )
            tab.page.wait_for_selector("#basemap img.leaflet-tile-loaded")
            asked = tile_server["requested"][before:]
            assert asked and all(TILE_PATH.match(path) for path in asked)
            # The cells are drawn over the tiles: one rectangle per cell, in the overlay pane.
            cells_drawn = tab.page.locator("#basemap .leaflet-overlay-pane path.basemap-cell")
            assert cells_drawn.count() == grid.n_cells
            # Coloured on the heatmaps' scale: the cell with the largest estimate is the top
            # of Viridis.
            api = seeder.get(f"/campaigns/{cells['id']}/estimate")
            flat = [share for line in api["grid"]["cells"] for share in line]
            layers = tab.page.evaluate(
                """() => Array.from(document.querySelectorAll(
                    '#basemap .leaflet-overlay-pane path.basemap-cell')).map(
                    (p) => p.getAttribute('fill'))"""
            )
            assert layers[flat.index(max(flat))] == "rgb(253, 231, 37)"
            # Hovering a cell gives its values as the heatmap does.
            cells_drawn.nth(flat.index(max(flat))).hover(force=True)
            tooltip = tab.page.locator(".leaflet-tooltip")
            expect(tooltip).to_contain_text("estimated share " + share_text(max(flat)))
            # The attribution is the setting's text, shown as text.
            expect(tab.page.locator(".leaflet-control-attribution")).to_contain_text(
                "Local test tiles <not html>"
            )
            # The raw report shares are a second layer, on the same scale.
            expect(tab.page.locator(".leaflet-control-layers")).to_contain_text("Raw report shares")
            MAP_SHOTS.mkdir(parents=True, exist_ok=True)
            tab.page.locator(".basemap-figure").screenshot(
                path=str(MAP_SHOTS / "basemap-local-tiles.png")
            )
            tab.shot()
            tab.assert_no_console_errors()
        finally:
            tab.close()


def test_a_report_posted_while_the_page_is_open_shows_up(tab, seeder, campaigns):
    live = campaigns["live"]
    tab.open_campaign(live["id"])
    start = seeder.get(f"/campaigns/{live['id']}/estimate")["n"]
    tab.wait_rendered(n=start)
    tab.page.evaluate("window.loadedOnce = true")
    requests_made: list[str] = []
    tab.page.on("request", lambda request: requests_made.append(request.url))
    # Polls with no new report fetch the summary only, never the estimate again.
    for _ in range(2):
        with tab.page.expect_response(lambda response: "/summary" in response.url):
            tab.page.click("#refresh-now")
    assert sum("/summary" in url for url in requests_made) == 2
    assert not any("/estimate" in url for url in requests_made)
    seeder.post(live, ["yes"] * 5, seed=start)
    expect(tab.page.locator("#n-reports")).to_have_text(f"{start + 5:,}", timeout=RENDER_TIMEOUT_MS)
    tab.wait_rendered(n=start + 5)
    assert tab.page.evaluate("window.loadedOnce") is True  # refreshed in place, not reloaded
    # The advisor's expected error follows the count: rr's closed form at the new n.
    expected = oracle_mse("rr", 2, live["epsilon"], start + 5)
    shown = tab.page.inner_text("#expected-error")
    assert shown.startswith(f"squared error {decimal_text(expected)} summed over the 2 values")
    assert shown.endswith(f"at {start + 5:,} reports")
    assert tab.page.inner_text("#estimate-n") == f"{start + 5:,}"
    api = seeder.get(f"/campaigns/{live['id']}/estimate")
    trace = chart_trace(tab.page, "estimate-chart")
    by_label = {row["label"]: row["frequency"] for row in api["estimates"]}
    assert trace["y"] == pytest.approx([by_label[label] for label in trace["x"]], abs=1e-12)
    tab.assert_no_console_errors()


def test_phone_width_with_the_keyboard_only(tab_factory, live_server, campaigns):
    fruit = campaigns["fruit"]
    tab = tab_factory(PHONE)
    page = tab.page
    tab.goto("/login")
    # autofocus lands when the browser gets to it, not always by the time goto returns.
    expect(page.locator("#token")).to_be_focused(timeout=RENDER_TIMEOUT_MS)
    page.keyboard.type(live_server.analyst_token)
    page.keyboard.press("Enter")
    page.wait_for_url(tab.base + "/")
    link = f"{tab.base}/campaigns/{fruit['id']}"
    # Every campaign the suite's live server holds is listed before the page's end.
    for _ in range(400):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.href") == link:
            break
    else:
        pytest.fail("the campaign link cannot be reached with Tab")
    page.keyboard.press("Enter")
    page.wait_for_url(link)
    tab.wait_rendered()
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "method":
            break
    else:
        pytest.fail("the method selector cannot be reached with Tab")
    methods = page.eval_on_selector_all(
        "#method option", "(options) => options.map((o) => o.value)"
    )
    chosen = methods.index(page.input_value("#method"))
    # The next method in the menu, or the one before if the default is the last.
    key, step = ("ArrowDown", 1) if chosen + 1 < len(methods) else ("ArrowUp", -1)
    page.keyboard.press(key)
    tab.wait_rendered(methods[chosen + step])
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0
    tab.shot("phone")
    tab.assert_no_console_errors()


def plotted_intervals(page: Page) -> list[list[float]]:
    """The [top, bottom] of each drawn whisker of the estimate trace, in data units."""
    return page.evaluate(
        """() => {
            const chart = document.getElementById('estimate-chart');
            const axis = chart._fullLayout.yaxis;
            const trace = chart.querySelectorAll('.barlayer .trace')[0];
            return Array.from(trace.querySelectorAll('.errorbar path')).map((path) => {
                const d = path.getAttribute('d');
                const top = Number(d.match(/^M[-\\d.e]+,([-\\d.e]+)/)[1]);
                const bottom = Number(d.match(/V([-\\d.e]+)/)[1]);
                return [axis.p2l(top), axis.p2l(bottom)];
            });
        }"""
    )


def y_tick_labels(page: Page, element_id: str = "estimate-chart") -> list[str]:
    return page.evaluate(
        "(id) => Array.from(document.querySelectorAll(`#${id} .ytick text`), (t) => t.textContent)",
        element_id,
    )


def test_whiskers_estimator_and_warnings_come_from_the_estimate(tab, campaigns):
    """The bounds drawn are the interval's, even one that lies above its estimate."""
    fruit = campaigns["fruit"]
    served: dict = {}

    def shifted(route):
        response = route.fetch()
        body = response.json()
        top = max(body["estimates"], key=lambda row: row["frequency"])
        # An interval entirely above its estimate, as a biased estimator can give.
        top["ci_low"] = top["frequency"] + 0.03
        top["ci_high"] = top["frequency"] + 0.08
        body["estimator"] = "IBU, stopped by cross-validation at 12 iterations"
        body["warnings"] = ["Few reports: the intervals are approximate."]
        served.update(body)
        route.fulfill(response=response, json=body)

    tab.page.route(f"**/data/campaigns/{fruit['id']}/estimate?*", shifted)
    tab.open_campaign(fruit["id"])
    tab.shot("shifted-interval")
    trace = chart_trace(tab.page, "estimate-chart")
    by_label = {row["label"]: row for row in served["estimates"]}
    drawn = plotted_intervals(tab.page)
    assert len(drawn) == len(trace["x"])
    for label, (top, bottom) in zip(trace["x"], drawn, strict=True):
        row = by_label[label]
        assert top == pytest.approx(row["ci_high"], abs=2e-3)
        assert bottom == pytest.approx(row["ci_low"], abs=2e-3)
    assert tab.page.inner_text("#estimate-estimator") == served["estimator"]
    assert tab.page.locator("#estimate-warnings li").all_inner_texts() == served["warnings"]
    assert tab.page.is_visible("#estimate-warnings-box")
    tab.assert_no_console_errors()


def test_raw_shares_are_drawn_beside_the_estimate(tab, seeder, campaigns):
    fruit = campaigns["fruit"]
    tab.open_campaign(fruit["id"])
    counts = seeder.get(f"/campaigns/{fruit['id']}/counts")
    n = sum(row["count"] for row in counts["counts"])
    share = {row["label"]: row["count"] / n for row in counts["counts"]}
    raw = tab.page.evaluate(
        """() => { const t = document.getElementById('estimate-chart').data[1];
                   return {name: t.name, x: Array.from(t.x), y: Array.from(t.y)}; }"""
    )
    assert raw["name"] == "raw report shares (reference)"
    assert raw["y"] == pytest.approx([share[label] for label in raw["x"]], abs=1e-12)
    assert len(bar_heights(tab.page, trace=1)) == len(fruit["domain"])
    legend = tab.page.evaluate(
        "() => Array.from(document.querySelectorAll('#estimate-chart .legendtext'),"
        " (t) => t.textContent)"
    )
    assert legend == ["estimate, 95% interval", "raw report shares (reference)"]
    # The estimator is named even by a response that does not name it.
    assert tab.page.inner_text("#estimate-estimator")
    tab.assert_no_console_errors()


def test_shares_below_one_percent_get_tick_labels_that_differ(tab, seeder):
    """Every share drawn below 1% (a flat k-RR over 300 categories, its shares scaled to
    at most 0.6% in the browser so that the case does not hang on the estimator's
    interval widths): the axis must not label every tick "0%"."""
    flat = seeder.create(
        {
            "id": f"dash-flat-{SUFFIX}",
            "title": "Flat, many categories (browser test)",
            "mechanism": "krr",
            "epsilon": 4.0,
            "domain": [f"c{i:03d}" for i in range(300)],
        }
    )
    seeder.post(flat, [flat["domain"][i % 300] for i in range(6000)], seed=5)
    keys = ("frequency", "ci_low", "ci_high", "raw_frequency")

    def scaled(route):
        response = route.fetch()
        body = response.json()
        top = max(row[key] for row in body["estimates"] for key in keys)
        for row in body["estimates"]:
            for key in keys:
                row[key] *= 0.006 / top
        route.fulfill(response=response, json=body)

    tab.page.route(f"**/data/campaigns/{flat['id']}/estimate?*", scaled)
    tab.open_campaign(flat["id"])
    tab.page.select_option("#scale", "linear")  # the linear axis' ticks (the log's: below)
    tab.shot("small-shares")
    labels = y_tick_labels(tab.page)
    assert len(labels) >= 3
    assert len(set(labels)) == len(labels), labels
    assert any(label not in ("0%", "1%") for label in labels), labels
    assert all(label.endswith("%") for label in labels)
    tab.assert_no_console_errors()


def test_a_campaign_without_reports_draws_no_estimate(tab, seeder):
    empty = seeder.create(
        {
            "id": f"dash-empty-{SUFFIX}",
            "title": "No reports yet (browser test)",
            "mechanism": "krr",
            "epsilon": 1.0,
            "domain": ["a", "b", "c"],
        }
    )
    tab.goto(f"/campaigns/{empty['id']}")
    tab.wait_rendered(n=0)
    tab.shot("empty")
    assert "No reports yet" in tab.page.inner_text("#estimate-message")
    assert tab.page.locator("#estimate-chart .barlayer .point").count() == 0
    assert tab.page.locator("#estimate-table tbody tr").count() == 0
    assert "No reports yet" in tab.page.inner_text("#series-chart")
    tab.assert_no_console_errors()


def test_a_stopped_estimate_is_reported_and_not_asked_for_again_too_soon(tab, campaigns):
    """A 503 from the server's time limit shows its message; the page waits Retry-After."""
    fruit = campaigns["fruit"]
    message = "the estimate did not finish within 30 s (the server's LDP_ESTIMATE_TIMEOUT_S)"
    asked: list[str] = []

    def stopped(route):
        asked.append(route.request.url)
        route.fulfill(
            status=503,
            headers={"Retry-After": "600"},
            json={"error": {"code": "estimate_timed_out", "message": message, "field": None}},
        )

    tab.page.route(f"**/data/campaigns/{fruit['id']}/estimate?*", stopped)
    tab.goto(f"/campaigns/{fruit['id']}")
    expect(tab.page.locator("#estimate-message")).to_have_text(message)
    tab.shot("stopped")
    for _ in range(2):
        with tab.page.expect_response(lambda response: "/summary" in response.url):
            tab.page.click("#refresh-now")
    assert len(asked) == 1
    assert tab.page.is_hidden("#estimate-busy")
    # Chromium logs the one 503 it was answered; nothing else may be logged.
    assert len(tab.errors) == 1
    assert "responded with a status of 503" in tab.errors[0]


def test_an_olh_campaign_charts_its_top_values(tab, seeder):
    apps = seeder.create(
        {
            "id": f"dash-apps-{SUFFIX}",
            "title": "Apps (browser test)",
            "mechanism": "olh",
            "epsilon": 2.0,
            "domain_size": 200_000,
        }
    )
    rng = random.Random(8)
    values = [4242] * 900 + [17] * 500 + [rng.randrange(200_000) for _ in range(600)]
    seeder.post(apps, values, seed=8)
    tab.goto(f"/campaigns/{apps['id']}")
    tab.wait_rendered("projection")
    tab.shot("olh")
    api = seeder.get(f"/campaigns/{apps['id']}/estimate")
    assert api["method"] == "projection" and len(api["estimates"]) == 1000
    trace = chart_trace(tab.page, "estimate-chart")
    assert tab.page.input_value("#top") == "20"
    assert trace["x"][:2] == ["4242", "17"]
    assert trace["x"] == [row["label"] for row in api["estimates"][:20]]
    assert "200,000" in tab.page.inner_text("main")
    assert tab.page.inner_text("#estimate-caption").startswith("Top 20 of 200,000 categories")
    tab.assert_no_console_errors()


def marker_centres(page: Page, trace: int = 0) -> list[float]:
    """The vertical pixel centres of one scatter trace's markers (0: the estimate), in the
    order plotly drew them."""
    return page.evaluate(
        """(index) => Array.from(document.querySelectorAll('#estimate-chart .scatterlayer .trace')
                 [index].querySelectorAll('.point'), (point) => {
                     const box = point.getBoundingClientRect();
                     return box.top + box.height / 2;
                 })""",
        trace,
    )


def test_tiny_shares_are_drawn_on_a_log_axis_that_tells_them_apart(tab, seeder, campaigns):
    """True shares of 1.5%, 0.8%, 0.5% and 0.2% beside 55%: as bars from 0 the four were a
    few pixels tall; the page picks a log axis for them, says so, and their markers stand
    apart. Linear bars stay a choice away."""
    tiny = campaigns["tiny"]
    tab.open_campaign(tiny["id"])
    tab.page.locator("#estimate-section").screenshot(path=str(SCREENSHOTS / "tiny-shares-log.png"))
    api = seeder.get(f"/campaigns/{tiny['id']}/estimate")
    by_label = {row["label"]: row for row in api["estimates"]}
    chart = tab.page.locator("#estimate-chart")
    assert chart.get_attribute("data-scale") == "log"
    assert "log scale" in tab.page.text_content("#estimate-chart .g-ytitle")
    assert tab.page.inner_text("#scale-note").startswith("Logarithmic scale, chosen because")
    assert tab.page.input_value("#scale") == "auto"
    assert tab.page.inner_text('#scale option[value="auto"]') == "Automatic (logarithmic here)"
    labels = y_tick_labels(tab.page)
    assert len(labels) >= 4 and len(set(labels)) == len(labels), labels
    trace = chart_trace(tab.page, "estimate-chart")
    assert trace["type"] == "scatter"
    assert trace["y"] == pytest.approx([by_label[label]["frequency"] for label in trace["x"]])
    centres = dict(zip(trace["x"], marker_centres(tab.page), strict=True))
    smallest = sorted(TINY_SHARES, key=lambda label: by_label[label]["frequency"])[:4]
    assert set(smallest) == {"car", "scooter", "ferry", "skate"}
    # Lower shares lower on the screen (larger y), each clearly apart from the next.
    heights = [centres[label] for label in smallest]
    gaps = [lower - higher for lower, higher in itertools.pairwise(heights)]
    assert all(gap >= DISTINCT_PX for gap in gaps), dict(zip(smallest, heights, strict=True))

    tab.page.select_option("#scale", "linear")
    assert chart.get_attribute("data-scale") == "linear"
    assert tab.page.inner_text("#scale-note").startswith("Linear scale")
    bars = dict(
        zip(chart_trace(tab.page, "estimate-chart")["x"], bar_heights(tab.page), strict=True)
    )
    # What the log axis is for: as bars, the four are slivers hardly told apart.
    assert max(bars[label] for label in smallest) < DISTINCT_PX
    tab.assert_no_console_errors()


def test_the_values_table_fits_a_phone_with_its_caption_in_view(
    tab_factory, signed_in_state, campaigns
):
    """At 390 px the table was cut at "Interval high" and its caption scrolled away: every
    column must be in view or within reach of the table's own sideways scroll, with the page
    itself not scrolling sideways and the caption in view throughout."""
    tab = tab_factory(PHONE, storage_state=signed_in_state)
    page = tab.page
    for key in ("tiny", "where"):
        tab.open_campaign(campaigns[key]["id"])
        page.locator("#estimate-caption").scroll_into_view_if_needed()
        if key == "tiny":
            page.locator("#estimate-caption").screenshot(
                path=str(SCREENSHOTS / "phone-caption.png")
            )
            tab.page.screenshot(
                path=str(SCREENSHOTS / "phone-table.png"),
                full_page=True,
                clip=page.evaluate(
                    """() => { const top = document.getElementById('estimate-caption')
                                   .getBoundingClientRect().top + window.scrollY - 8;
                               const end = document.querySelector('.table-wrap')
                                   .getBoundingClientRect().bottom + window.scrollY + 8;
                               return {x: 0, y: top, width: window.innerWidth,
                                       height: end - top}; }"""
                ),
            )
        assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
        geometry = """() => {
            const wrap = document.querySelector('.table-wrap');
            const box = (element) => {
                const r = element.getBoundingClientRect();
                return {left: r.left, right: r.right, width: r.width};
            };
            return {
                wrap: box(wrap),
                scrolls: ['auto', 'scroll'].includes(getComputedStyle(wrap).overflowX),
                fits: wrap.scrollWidth <= wrap.clientWidth,
                heads: Array.from(document.querySelectorAll('#estimate-table thead th'), box),
                caption: box(document.getElementById('estimate-caption')),
                viewport: window.innerWidth,
            };
        }"""
        before = page.evaluate(geometry)
        assert before["fits"] or before["scrolls"], before
        assert before["wrap"]["left"] >= 0 and before["wrap"]["right"] <= before["viewport"]
        page.evaluate(
            "() => { const w = document.querySelector('.table-wrap');"
            " w.scrollLeft = w.scrollWidth; }"
        )
        after = page.evaluate(geometry)
        for state in (before, after):
            caption = state["caption"]
            assert caption["width"] > 0 and caption["left"] >= 0, state
            assert caption["right"] <= state["viewport"], state
        # Scrolled to its end, the last column is whole within the table's box, and the
        # label column (which stays put) too.
        for head in (after["heads"][0], after["heads"][-1]):
            assert after["wrap"]["left"] - 0.5 <= head["left"], after
            assert head["right"] <= after["wrap"]["right"] + 0.5, after
        assert page.is_visible("#estimate-caption")
        assert page.inner_text("#estimate-caption")
    tab.assert_no_console_errors()


def tick_label_overlaps(page: Page, element_id: str) -> list[tuple[str, str]]:
    """Pairs of the chart's axis tick labels whose drawn boxes overlap."""
    boxes = page.evaluate(
        """(id) => Array.from(document.querySelectorAll(`#${id} .xtick text, #${id} .ytick text`),
              (text) => { const r = text.getBoundingClientRect();
                          return [text.textContent, r.left, r.top, r.right, r.bottom]; })""",
        element_id,
    )
    return [
        (a[0], b[0])
        for i, a in enumerate(boxes)
        for b in boxes[i + 1 :]
        if a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]
    ]


def test_the_time_axis_labels_never_overlap(tab_factory, signed_in_state, campaigns):
    """The count axis' "0" was drawn over the first date label, in the corner both share."""
    for viewport in (LAPTOP, PHONE):
        tab = tab_factory(viewport, label=str(viewport["width"]), storage_state=signed_in_state)
        tab.open_campaign(campaigns["fruit"]["id"])
        tab.page.wait_for_selector("#series-chart .xtick text")
        assert "0" in [text for text in y_tick_labels(tab.page, "series-chart")]
        assert tick_label_overlaps(tab.page, "series-chart") == []
        tab.assert_no_console_errors()


EXPONENT = re.compile(r"\d[eE][-+]?\d")
# A zero written with decimals ("0.00%"): what a share that is not zero must never read.
ZERO_WITH_DECIMALS = re.compile(r"(?<![\d.])-?0\.0+%")


def test_every_share_is_written_one_way(tab, seeder, campaigns):
    """One format for every share shown (before: "0.070%", "0.00%" and "6e-05" side by side):
    the table, the hovers, the map's hovers and colour bars, the expected error and the
    captions, as the server writes shares too (data.share_text)."""
    for key in ("tiny", "where"):
        campaign = campaigns[key]
        tab.open_campaign(campaign["id"])
        api = seeder.get(f"/campaigns/{campaign['id']}/estimate")
        # The campaign's id (a random hex suffix, "d3e9ab80") is no number.
        text = tab.page.inner_text("main").replace(campaign["id"], "")
        assert not EXPONENT.search(text), EXPONENT.findall(text)
        assert not ZERO_WITH_DECIMALS.search(text), ZERO_WITH_DECIMALS.findall(text)
        by_label = {row["label"]: row for row in api["estimates"]}
        rows = tab.page.locator("#estimate-table tbody tr")
        for index in range(rows.count()):
            cells = rows.nth(index).locator("th, td").all_inner_texts()
            row = by_label[cells[0].split(" ")[0]]
            keys = ("frequency", "ci_low", "ci_high") + (
                ("raw_frequency",) if key == "tiny" else ()
            )
            assert cells[1:] == [share_text(row[name]) for name in keys]
        if key == "tiny":
            hovers = tab.page.evaluate(
                "() => Array.from(document.getElementById('estimate-chart').data[0].customdata)"
            )
            labels = chart_trace(tab.page, "estimate-chart")["x"]
            for label, hover in zip(labels, hovers, strict=True):
                row = by_label[label]
                assert hover == [
                    share_text(row[name]) for name in ("frequency", "ci_low", "ci_high")
                ]
        else:
            heatmap = tab.page.evaluate(
                """() => { const t = document.getElementById('heatmap-estimate').data[0];
                           return {z: t.z.map((r) => Array.from(r)),
                                   text: t.text.map((r) => Array.from(r)),
                                   ticks: Array.from(t.colorbar.ticktext)}; }"""
            )
            for z_row, text_row in zip(heatmap["z"], heatmap["text"], strict=True):
                assert text_row == [share_text(z) for z in z_row]
            shown = [t for row in heatmap["text"] for t in row] + heatmap["ticks"]
            assert all(t.endswith("%") and not EXPONENT.search(t) for t in shown)
    tab.assert_no_console_errors()


# -- time: the window picker, the trend and the comparison -----------------------------------

DAY_S = 86400
# Days of reports of the "drift" campaign, the reports per day, and how its banana share rises.
DRIFT_DAYS = 14
DRIFT_PER_DAY = 300
SHOTS = Path("/tmp/shots")


def drift_shares(day: int) -> dict[str, float]:
    """The drift campaign's true shares on day ``day`` (0 is the first): banana rises."""
    banana = 0.10 + 0.04 * day
    rest = (1 - banana) / 3
    return {"apple": rest, "banana": banana, "cherry": rest, "damson": rest}


@pytest.fixture(scope="module")
def drift(live_server) -> dict:
    """A k-RR campaign counted by day, with DRIFT_DAYS days of reports ending today.

    The reports are placed in their days through the store's clock (the time a report is
    received at), on the live server's Redis: no waiting for days to pass.
    """
    import datetime

    import redis

    from aggregator.storage.ingest import StoredReport
    from aggregator.storage.store import CampaignStore

    today = datetime.datetime.now(datetime.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    first = today.timestamp() - (DRIFT_DAYS - 1) * DAY_S
    moment = {"now": first}
    connection = redis.Redis.from_url(live_server.redis_url)
    store = CampaignStore(connection, clock=lambda: moment["now"])
    spec = CampaignSpec.from_dict(
        {
            "id": f"dash-drift-{SUFFIX}",
            "title": "Favourite fruit, day by day (browser test)",
            "mechanism": "krr",
            "epsilon": 2.0,
            "domain": ["apple", "banana", "cherry", "damson"],
            "period": "day",
        }
    )
    store.create_campaign(spec)
    mechanism = Mechanism.from_spec(spec)
    rng = random.Random(45)
    per_day = []
    for day in range(DRIFT_DAYS):
        moment["now"] = first + day * DAY_S + 3600
        shares = drift_shares(day)
        values = rng.choices(list(shares), list(shares.values()), k=DRIFT_PER_DAY)
        reports = []
        for value in values:
            output = mechanism.parse_report_value(mechanism.perturb(value, rng), field="value")
            reports.append(
                StoredReport(
                    str(uuid.UUID(int=rng.getrandbits(128))), output, mechanism.report_value(output)
                )
            )
        store.ingest(spec.id, reports)
        per_day.append(DRIFT_PER_DAY)
    connection.close()
    SHOTS.mkdir(parents=True, exist_ok=True)
    days = [
        (today - datetime.timedelta(days=DRIFT_DAYS - 1 - d)).date().isoformat()
        for d in range(DRIFT_DAYS)
    ]
    return {"id": spec.id, "days": days, "per_day": per_day}


def window_tab(tab_factory, signed_in_state, viewport: dict = LAPTOP, label: str = "") -> Tab:
    tab = tab_factory(viewport=viewport, label=label, storage_state=signed_in_state)
    return tab


def pick(tab: Tab, choice: str, n: int) -> None:
    tab.page.select_option("#window", choice)
    tab.page.wait_for_selector(
        f'main[data-window="{choice}"][data-rendered-n="{n}"]', state="attached"
    )


def test_the_window_picker_changes_n_and_the_chart_to_the_windows(
    tab_factory, signed_in_state, seeder, drift
):
    tab = window_tab(tab_factory, signed_in_state)
    tab.open_campaign(drift["id"])
    total = sum(drift["per_day"])
    tab.wait_rendered(n=total)
    everything = chart_trace(tab.page, "estimate-chart")["y"]
    today = drift["days"][-1]
    pick(tab, "latest", drift["per_day"][-1])
    assert tab.page.text_content("#estimate-n") == f"{drift['per_day'][-1]:,}"
    latest = seeder.get(f"/campaigns/{drift['id']}/estimate?since={today}&until={today}")
    drawn = chart_trace(tab.page, "estimate-chart")
    by_label = {row["label"]: row["frequency"] for row in latest["estimates"]}
    assert drawn["y"] == pytest.approx([by_label[x] for x in drawn["x"]], abs=1e-12)
    assert drawn["y"] != everything
    # The downloads follow the window.
    assert f"since={today}" in tab.page.get_attribute("#download-csv", "href")
    pick(tab, "recent", sum(drift["per_day"][-7:]))
    # Custom ends: the first two days.
    tab.page.select_option("#window", "custom")
    tab.page.fill("#window-since", drift["days"][0])
    tab.page.fill("#window-until", drift["days"][1])
    tab.page.click("#window-apply")
    tab.page.wait_for_selector(
        f'main[data-window="custom"][data-rendered-n="{sum(drift["per_day"][:2])}"]',
        state="attached",
    )
    tab.page.locator("#window-picker").screenshot(
        path=str(SHOTS / "window-picker-custom-laptop.png")
    )
    tab.assert_no_console_errors()


def trend_traces(page: Page) -> list[dict]:
    return page.evaluate(
        """() => document.getElementById('trend-chart').data.map((t) => ({
            name: t.name, mode: t.mode, fill: t.fill || null,
            x: Array.from(t.x), y: Array.from(t.y)}))"""
    )


def test_the_trend_draws_one_line_per_top_category_with_bands(
    tab_factory, signed_in_state, seeder, drift
):
    tab = window_tab(tab_factory, signed_in_state)
    tab.open_campaign(drift["id"])
    tab.page.wait_for_selector("main[data-trend-lines]", state="attached")
    traces = trend_traces(tab.page)
    lines = [t for t in traces if t["mode"] == "lines+markers"]
    bands = [t for t in traces if t["fill"] == "tonexty"]
    trend = seeder.get(f"/campaigns/{drift['id']}/trend?periods={DRIFT_DAYS}&top=5")
    assert [t["name"] for t in lines] == [s["label"] for s in trend["series"]]
    assert len(lines) == len(bands) == 4
    for line, series in zip(lines, trend["series"], strict=True):
        assert line["x"] == drift["days"]
        assert line["y"] == pytest.approx(series["frequency"], abs=1e-12)
    banana = next(s for s in trend["series"] if s["label"] == "banana")
    assert banana["frequency"][-1] > banana["frequency"][0] + 0.2
    tab.page.locator("#trend-section").screenshot(path=str(SHOTS / "trend-laptop.png"))
    tab.assert_no_console_errors()


def test_the_comparison_lists_differences_and_marks_the_clearly_non_zero(
    tab_factory, signed_in_state, seeder, drift
):
    for viewport, label in ((LAPTOP, "laptop"), (PHONE, "phone")):
        tab = window_tab(tab_factory, signed_in_state, viewport, label)
        tab.open_campaign(drift["id"])
        pick(tab, "recent", sum(drift["per_day"][-7:]))
        tab.page.wait_for_selector("main[data-compare-marked]", state="attached")
        days = drift["days"]
        body = seeder.get(
            f"/campaigns/{drift['id']}/compare?a_since={days[0]}&a_until={days[6]}"
            f"&b_since={days[7]}&b_until={days[13]}"
        )
        rows = tab.page.locator("#compare-table tbody tr")
        assert rows.count() == len(body["differences"]) == 4
        marked = {r["label"] for r in body["differences"] if r["excludes_zero"]}
        assert "banana" in marked
        for i in range(rows.count()):
            row = rows.nth(i)
            category = row.locator("th").text_content()
            expected = next(r for r in body["differences"] if r["label"] == category)
            assert row.get_attribute("data-excludes-zero") == str(category in marked).lower()
            change = row.locator("td").nth(1).text_content()
            assert change.startswith(
                ("+" if expected["difference"] > 0 else "") + share_text(expected["difference"])
            )
            assert ("▲" in change or "▼" in change) == (category in marked)
        assert tab.page.get_attribute("main", "data-compare-marked") == str(len(marked))
        if label == "phone":
            width = tab.page.evaluate("() => document.documentElement.scrollWidth")
            assert width <= PHONE["width"]
        tab.page.locator("#window-picker").screenshot(
            path=str(SHOTS / f"window-picker-{label}.png")
        )
        tab.page.locator("#trend-section").screenshot(path=str(SHOTS / f"trend-{label}.png"))
        tab.page.locator("#compare-section").screenshot(path=str(SHOTS / f"compare-{label}.png"))
        tab.assert_no_console_errors()
