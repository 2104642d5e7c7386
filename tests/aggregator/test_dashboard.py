"""Dashboard routes through Flask's test client, on a real Redis: sign-in, access, data."""

from __future__ import annotations

import calendar
import csv
import html
import io
import random
import re
import time
import uuid
from types import SimpleNamespace

import pytest
from aggregator_testdata import (
    ADMIN_TOKEN,
    ANALYST_TOKEN,
    GRID_SPEC,
    KRR_SPEC,
    OLH_SPEC,
    PLANAR_SPEC,
    short_app_of,
)

from aggregator.app import create_app
from aggregator.dashboard import data
from aggregator.estimation import METHODS
from aggregator.estimation.advice import oracle_mse
from aggregator.services import EXTENSION, get_store
from aggregator.storage.store import CampaignStore
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

LOGIN = "/dashboard/login"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
SIGNED_IN_PAGES = ["/dashboard/", "/dashboard/campaigns/fruit"]
DATA_URLS = [
    "/dashboard/data/campaigns/fruit/summary",
    "/dashboard/data/campaigns/fruit/estimate",
    "/dashboard/data/campaigns/fruit/estimate.csv",
    "/dashboard/data/campaigns/fruit/estimate.json",
]


def post_reports(client, spec: dict, values: list, seed: int) -> None:
    """Perturb ``values`` as devices would and post them through the API."""
    mechanism = Mechanism.from_spec(CampaignSpec.from_dict(spec))
    rng = random.Random(seed)
    reports = [
        {"report_id": str(uuid.UUID(int=rng.getrandbits(128))), "value": mechanism.perturb(v, rng)}
        for v in values
    ]
    response = client.post(f"/api/v1/campaigns/{spec['id']}/reports", json={"reports": reports})
    assert response.get_json()["accepted"] == len(values)


def csrf_of(client) -> str:
    return CSRF.search(client.get(LOGIN).get_data(as_text=True)).group(1)


def sign_in(client, token: str = ANALYST_TOKEN, **extra):
    return client.post(LOGIN, data={"csrf_token": csrf_of(client), "token": token, **extra})


def session_cookie(client) -> str:
    cookie = client.get_cookie("ldp_session")
    assert cookie is not None
    return cookie.value


@pytest.fixture
def fruit_reports(client, krr_campaign):
    rng = random.Random(11)
    values = rng.choices(KRR_SPEC["domain"], weights=[5, 3, 1, 1], k=400)
    post_reports(client, KRR_SPEC, values, seed=12)
    return values


@pytest.fixture
def signed_in(client):
    assert sign_in(client).status_code == 303
    return client


# -- sign-in, sessions, CSRF -----------------------------------------------------------------


def test_sign_in_opens_a_lax_httponly_session(client, krr_campaign):
    response = sign_in(client)
    assert response.status_code == 303
    assert response.headers["Location"] == "/dashboard/"
    cookie = response.headers["Set-Cookie"]
    assert cookie.startswith("ldp_session=")
    assert "HttpOnly" in cookie
    assert "SameSite=Lax" in cookie
    page = client.get("/dashboard/")
    assert page.status_code == 200
    assert "Favourite fruit" in page.get_data(as_text=True)
    # The token never reaches a page.
    assert ANALYST_TOKEN not in page.get_data(as_text=True)


def test_the_admin_token_also_signs_in(client, krr_campaign):
    assert sign_in(client, ADMIN_TOKEN).status_code == 303
    assert client.get("/dashboard/").status_code == 200


def notice_of(client, url: str = "/dashboard/") -> str | None:
    """The text of the page's notice of reports held on fewer copies (None: no notice)."""
    page = client.get(url).get_data(as_text=True)
    found = re.search(r'<p[^>]*id="replication-notice"[^>]*>(.*?)</p>', page, re.S)
    return None if found is None else " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split())


def test_an_admin_sees_a_notice_while_a_master_holding_shards_has_no_replica(config, admin):
    app = short_app_of(config)
    client = app.test_client()
    assert client.post("/api/v1/campaigns", json=KRR_SPEC, headers=admin).status_code == 201
    post_reports(client, KRR_SPEC, ["apple", "banana", "cherry"], seed=5)
    assert notice_of(client, LOGIN) is None  # anonymous: the sign-in page only
    assert sign_in(client).status_code == 303
    assert notice_of(client) is None  # an analyst's session
    admin_client = app.test_client()
    assert sign_in(admin_client, ADMIN_TOKEN).status_code == 303
    for url in SIGNED_IN_PAGES:
        notice = notice_of(admin_client, url)
        assert notice is not None, url
        assert "1 Redis master holding 16 campaign shards has no replica" in notice
        assert "3 reports in all were acknowledged that way" in notice


def test_no_notice_while_writes_wait_for_no_replica(client, krr_campaign):
    # The test server is a master without replicas, but its store waits for none.
    assert sign_in(client, ADMIN_TOKEN).status_code == 303
    assert notice_of(client) is None


def test_a_wrong_token_is_refused(client, krr_campaign):
    response = sign_in(client, "not-the-token")
    assert response.status_code == 401
    assert "That token is not valid." in response.get_data(as_text=True)
    assert client.get("/dashboard/").status_code == 302


def test_sign_in_needs_the_csrf_token(client, krr_campaign):
    client.get(LOGIN)
    response = client.post(LOGIN, data={"csrf_token": "forged", "token": ANALYST_TOKEN})
    assert response.status_code == 400
    response = client.post(LOGIN, data={"token": ANALYST_TOKEN})
    assert response.status_code == 400
    assert client.get("/dashboard/").status_code == 302


@pytest.mark.parametrize("url", SIGNED_IN_PAGES)
def test_pages_redirect_to_sign_in_when_signed_out(client, krr_campaign, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response.headers["Location"].startswith(LOGIN + "?next=")
    assert "Favourite fruit" not in response.get_data(as_text=True)


@pytest.mark.parametrize("url", DATA_URLS)
def test_data_is_refused_when_signed_out(client, fruit_reports, url):
    response = client.get(url)
    assert response.status_code == 401
    assert response.get_json()["error"]["code"] == "unauthorized"


@pytest.mark.parametrize("url", DATA_URLS)
def test_a_bearer_token_does_not_open_the_dashboard(client, fruit_reports, analyst, url):
    assert client.get(url, headers=analyst).status_code == 401


def test_sign_in_returns_to_the_page_asked_for(client, krr_campaign):
    target = client.get("/dashboard/campaigns/fruit").headers["Location"]
    assert target == "/dashboard/login?next=/dashboard/campaigns/fruit"
    response = sign_in(client, next="/dashboard/campaigns/fruit")
    assert response.headers["Location"] == "/dashboard/campaigns/fruit"


@pytest.mark.parametrize(
    "next_url",
    ["https://evil.example/", "//evil.example/dashboard/", "/api/v1/campaigns", "/\\evil.example"],
)
def test_sign_in_never_redirects_off_the_dashboard(client, krr_campaign, next_url):
    response = sign_in(client, next=next_url)
    assert response.headers["Location"] == "/dashboard/"


def test_logout_ends_the_session_even_for_a_copied_cookie(signed_in):
    copied = session_cookie(signed_in)
    page = signed_in.get("/dashboard/").get_data(as_text=True)
    response = signed_in.post("/dashboard/logout", data={"csrf_token": CSRF.search(page).group(1)})
    assert response.status_code == 303
    assert response.headers["Location"] == "/dashboard/login?signed_out=1"
    assert signed_in.get("/dashboard/").status_code == 302
    signed_in.set_cookie("ldp_session", copied)
    assert signed_in.get("/dashboard/").status_code == 302
    assert signed_in.get(DATA_URLS[0]).status_code == 401


def test_logout_needs_the_csrf_token(signed_in):
    assert signed_in.post("/dashboard/logout", data={"csrf_token": "forged"}).status_code == 400
    assert signed_in.get("/dashboard/logout").status_code == 405
    assert signed_in.get("/dashboard/").status_code == 200


def test_sessions_work_across_workers_without_a_configured_key(config, signed_in):
    """Two app instances (two gunicorn workers) derive the same cookie key from the tokens."""
    other = create_app(config).test_client()
    other.set_cookie("ldp_session", session_cookie(signed_in))
    assert other.get("/dashboard/").status_code == 200


def test_a_new_analyst_token_ends_old_sessions(config, signed_in):
    cookie = session_cookie(signed_in)
    # The operator keeps the cookie key but rotates the token.
    key = signed_in.application.config["SECRET_KEY"]
    rotated = create_app(
        {**config, "ANALYST_TOKEN": "rotated-analyst-token-0123456789abcdef", "SECRET_KEY": key}
    ).test_client()
    rotated.set_cookie("ldp_session", cookie)
    assert rotated.get("/dashboard/").status_code == 302


def test_a_configured_secret_key_is_kept(config):
    app = create_app({**config, "SECRET_KEY": "operator-chosen"})
    assert app.config["SECRET_KEY"] == "operator-chosen"
    assert app.config["SESSION_COOKIE_SAMESITE"] == "Lax"


def test_pages_carry_a_strict_content_security_policy(signed_in, krr_campaign):
    response = signed_in.get("/dashboard/campaigns/fruit")
    policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self';" in policy
    assert "frame-ancestors 'none'" in policy
    assert response.headers["Cache-Control"] == "no-store"
    assert "<script>" not in response.get_data(as_text=True)  # no inline script


# -- pages -----------------------------------------------------------------------------------


def test_campaign_list_shows_each_campaign(signed_in, fruit_reports, planar_campaign):
    page = signed_in.get("/dashboard/").get_data(as_text=True)
    fruit = page[page.index('data-campaign="fruit"') :]
    fruit = fruit[: fruit.index("</tr>")]
    for text in ("Favourite fruit", "k-ary randomized response", ">1.5<", "open", ">400<", "UTC"):
        assert text in fruit
    where = page[page.index('data-campaign="where"') :]
    where = where[: where.index("</tr>")]
    for text in ("Where are you", "Planar Laplace", "0.01 per m", ">0<", "never"):
        assert text in where


def test_titles_and_labels_are_escaped(signed_in, admin):
    spec = {**KRR_SPEC, "id": "xss", "title": "<script>alert(1)</script>"}
    assert signed_in.post("/api/v1/campaigns", json=spec, headers=admin).status_code == 201
    for url in ("/dashboard/", "/dashboard/campaigns/xss"):
        page = signed_in.get(url).get_data(as_text=True)
        assert "<script>alert(1)" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_unknown_campaign_page_is_a_404(signed_in):
    response = signed_in.get("/dashboard/campaigns/nope")
    assert response.status_code == 404
    assert "There is no campaign" in response.get_data(as_text=True)
    assert signed_in.get("/dashboard/data/campaigns/nope/summary").status_code == 404


def test_plotly_is_served_locally_without_sign_in(client):
    response = client.get("/dashboard/vendor/plotly.min.js")
    assert response.status_code == 200
    assert response.mimetype == "text/javascript"
    assert b"plotly.js" in response.data[:2000]
    assert "max-age" in response.headers["Cache-Control"]


# -- data ------------------------------------------------------------------------------------


def test_summary_counts_and_times(signed_in, fruit_reports):
    before = time.time()
    body = signed_in.get(DATA_URLS[0]).get_json()
    assert body["n_reports"] == len(fruit_reports)
    assert body["series"]["points"][-1]["total"] == len(fruit_reports)
    assert sum(p["count"] for p in body["series"]["points"]) == len(fruit_reports)
    assert body["last_report_at"].endswith("Z")
    stamp = calendar.timegm(time.strptime(body["last_report_at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert before - 120 < stamp <= time.time()


def test_summary_and_page_give_the_advisors_expected_error_at_the_current_n(
    signed_in, fruit_reports
):
    spec = CampaignSpec.from_dict(KRR_SPEC)
    n = len(fruit_reports)
    body = signed_in.get(DATA_URLS[0]).get_json()["expected_error"]
    assert body["expected_mse"] == pytest.approx(
        oracle_mse("krr", len(spec.domain), spec.epsilon, n)
    )
    assert body["basis"] == "closed form"
    assert body["text"].endswith(f"at {n:,} reports")
    page = signed_in.get("/dashboard/campaigns/fruit").get_data(as_text=True)
    assert body["text"] in html.unescape(page)


def test_a_planar_page_gives_the_displacement_proxy(signed_in, planar_campaign):
    page = signed_in.get(f"/dashboard/campaigns/{PLANAR_SPEC['id']}").get_data(as_text=True)
    metres = 2 / PLANAR_SPEC["epsilon"]
    assert f"each report moved {metres:,.0f} m on average (proxy" in page


def test_a_maps_expected_error_follows_the_number_of_reports(signed_in, planar_campaign):
    # Before, a map's line was the displacement proxy alone: the same at 40 and 3,000 reports.
    spec = CampaignSpec.from_dict(PLANAR_SPEC)
    cells = spec.grid.n_cells
    texts = {}
    for n in (40, 3000):
        body = data.expected_error_at(SimpleNamespace(spec=spec, n_reports=n, mechanism=None))
        assert body["report_noise_mse"] == pytest.approx(1 / n)
        assert body["mean_displacement_m"] == pytest.approx(2 / PLANAR_SPEC["epsilon"])
        texts[n] = body["text"]
        assert f"at {n:,} reports the report map's sampling error is at most" in body["text"]
        assert f"±{data.share_text((1 / n / cells) ** 0.5)} per cell" in body["text"]
    assert texts[40] != texts[3000]
    post_reports(signed_in, PLANAR_SPEC, [{"lat": 37.775, "lon": -122.415}] * 40, seed=3)
    summary = signed_in.get("/dashboard/data/campaigns/where/summary").get_json()
    assert summary["expected_error"]["text"] == texts[40]


def test_a_categorical_oracle_over_cells_gets_its_closed_form_over_the_cells():
    spec = CampaignSpec.from_dict({**PLANAR_SPEC, "mechanism": "krr", "epsilon": 2.0})
    body = data.expected_error_at(
        SimpleNamespace(spec=spec, n_reports=500, mechanism=Mechanism.from_spec(spec))
    )
    expected = oracle_mse("krr", spec.grid.n_cells, 2.0, 500)
    assert body["expected_mse"] == pytest.approx(expected)
    assert body["text"].startswith(f"squared error {data.decimal_text(expected)} summed over")


@pytest.mark.parametrize(
    ("share", "text"),
    [
        (0.55, "55.0%"),
        (0.015, "1.50%"),
        (0.0007, "0.0700%"),
        (6e-05, "0.00600%"),
        (4e-07, "<0.0001%"),
        (-4e-07, ">-0.0001%"),
        (0.0, "0%"),
        (-0.58, "-58.0%"),
        (2.75, "275%"),
        (12.5, "1250%"),
        (0.99996, "100%"),
        (None, "–"),
    ],
)
def test_shares_are_written_one_way(share, text):
    """Percent with three significant digits: no exponent, no 0.00% for a share that is not
    zero (before, the page mixed "0.070%", "0.00%" and "6e-05")."""
    assert data.share_text(share) == text


def test_squared_errors_are_written_without_exponents():
    assert data.decimal_text(9.36e-06) == "0.00000936"
    assert data.decimal_text(0.025) == "0.0250"
    assert data.decimal_text(12.34) == "12.3"


def test_an_exponential_grid_page_gives_the_lattice_displacement_proxy(signed_in, admin):
    assert signed_in.post("/api/v1/campaigns", json=GRID_SPEC, headers=admin).status_code == 201
    page = signed_in.get(f"/dashboard/campaigns/{GRID_SPEC['id']}").get_data(as_text=True)
    # Euclidean, 0.005 per metre on 200 m cells (1 per cell): a report moves 1.90 cells.
    assert "each report moved 380 m on average (proxy" in page


@pytest.mark.parametrize("method", METHODS)
def test_estimate_is_the_api_estimate(signed_in, fruit_reports, analyst, method):
    ours = signed_in.get(f"/dashboard/data/campaigns/fruit/estimate?method={method}")
    api = signed_in.get(f"/api/v1/campaigns/fruit/estimate?method={method}", headers=analyst)
    # A method this k-RR campaign cannot take is refused by both alike.
    assert ours.status_code == api.status_code
    if api.status_code == 422:
        assert ours.get_json() == api.get_json()
        return
    ours, api = ours.get_json(), api.get_json()
    assert ours["method"] == method
    assert ours["n"] == len(fruit_reports)
    strip = ("seconds",)
    assert {k: v for k, v in ours.items() if k not in (*strip, "display")} == {
        k: v for k, v in api.items() if k not in strip
    }


def test_the_method_picker_offers_the_api_methods_with_the_campaigns_default_selected(
    signed_in, fruit_reports, analyst
):
    page = signed_in.get("/dashboard/campaigns/fruit").get_data(as_text=True)
    start = page.index('<select id="method"')
    picker = page[start : page.index("</select>", start)]
    options = re.findall(r'<option value="([^"]+)"( selected)?>([^<]*)</option>', picker)
    assert options and {value for value, _, _ in options} <= set(METHODS)
    default = signed_in.get("/api/v1/campaigns/fruit/estimate", headers=analyst).get_json()
    assert [value for value, selected, _ in options if selected] == [default["method"]]
    # The choices are labelled from the decision table; what ran is named by the estimate
    # itself, never by the page.
    assert all(html.unescape(label) == data.METHOD_NAMES[value] for value, _, label in options)
    assert "IBU (cross-validated)" not in page
    # The column's head, whose "(reference)" narrow screens leave to the caption.
    assert "Raw report share (reference)" in re.sub(r"<[^>]+>", "", page)


def test_the_page_shows_the_headline_intervals_and_details_of_the_estimate(
    signed_in, fruit_reports, analyst
):
    for method in ("ibu", "inversion"):
        ours = signed_in.get(f"/dashboard/data/campaigns/fruit/estimate?method={method}")
        api = signed_in.get(f"/api/v1/campaigns/fruit/estimate?method={method}", headers=analyst)
        display, api = ours.get_json()["display"], api.get_json()
        summary = display["intervals"].removeprefix("95%, ")
        assert summary != display["intervals"] and summary
        assert api["interval_method"].startswith(summary.rstrip("…"))
        rows = dict(display["details"])
        assert rows["method"] == api["method"]
        for key in data.estimate_details(api):
            assert key.replace("_", " ") in rows
        # The whole sentence is behind the disclosure whenever the page shortened it.
        if summary != api["interval_method"]:
            assert rows["interval method"] == api["interval_method"]
        else:
            assert "interval method" not in rows


def test_a_long_interval_method_is_cut_to_its_first_clause():
    short = "analytic normal interval (multinomial covariance through the inverse)"
    assert data.interval_summary(short) == short
    assert data.interval_summary(short + "; where the reports bound a cell's share best") == short
    long = (
        "parametric bootstrap of the estimator's error (16 replicates drawn from a 10x less "
        "regularised IBU fit) and its distance to that fit, less that distance's noise"
    )
    assert data.interval_summary(long) == "parametric bootstrap of the estimator's error"
    words = " ".join(["word"] * 40)
    cut = data.interval_summary(words)
    assert cut.endswith("word…") and len(cut) <= data.INTERVAL_SUMMARY_CHARS + 1


def test_details_come_from_the_body_or_beside_its_fields():
    body = {"method": "ibu", "n": 10, "confidence": 0.95, "estimates": [], "warnings": []}
    assert data.estimate_details({**body, "details": {"folds": 10}}) == {"folds": 10}
    assert data.estimate_details({**body, "details": {}, "stopping": "x"}) == {}
    assert data.estimate_details({**body, "stopping": "x"}) == {"stopping": "x"}
    rows = data.estimate_display(
        {
            **body,
            "interval_method": "bootstrap",
            "details": {
                "chosen_iterations": 35000,
                "converged_early": True,
                "share": 0.123456,
                "starts": [1, 2],
            },
        }
    )["details"]
    assert rows == [
        ["method", "ibu"],
        ["chosen iterations", "35,000"],
        ["converged early", "yes"],
        ["share", "0.1235"],
        ["starts", "[1, 2]"],
    ]


def test_bad_estimate_parameters_are_refused(signed_in, fruit_reports):
    base = "/dashboard/data/campaigns/fruit/estimate"
    for query, field in (("?method=median", "method"), ("?colour=red", "colour")):
        response = signed_in.get(base + query)
        assert response.status_code == 422
        assert response.get_json()["error"]["field"] == field


def test_planar_heatmap_layers(signed_in, planar_campaign, analyst):
    spec = CampaignSpec.from_dict(PLANAR_SPEC)
    grid = spec.grid
    rng = random.Random(3)
    region = spec.region
    values = [
        {
            "lat": rng.uniform(region.lat_min, region.lat_max),
            "lon": rng.uniform(region.lon_min, region.lon_max),
        }
        for _ in range(300)
    ]
    post_reports(signed_in, PLANAR_SPEC, values, seed=4)
    body = signed_in.get("/dashboard/data/campaigns/where/estimate").get_json()
    layers = body["heatmap"]
    assert (layers["rows"], layers["cols"]) == (grid.rows, grid.cols)
    counts = signed_in.get("/api/v1/campaigns/where/counts", headers=analyst).get_json()
    for row in range(grid.rows):
        assert layers["lat"][row] == pytest.approx(grid.centre(row * grid.cols)[0])
        for col in range(grid.cols):
            index = row * grid.cols + col
            assert counts["counts"][index]["label"] == f"r{row}c{col}"
            assert layers["raw"][row][col] == pytest.approx(counts["counts"][index]["count"] / 300)
            assert layers["estimate"][row][col] == body["estimates"][index]["frequency"]
    assert layers["lon"] == pytest.approx([grid.centre(col)[1] for col in range(grid.cols)])
    peak = max(max(line) for line in layers["raw"] + layers["estimate"])
    assert layers["zmax"] == peak


def test_a_heatmap_reads_the_counts_once_per_new_report_and_not_at_all_on_a_poll(
    signed_in, planar_campaign, analyst, monkeypatch
):
    """The page polls every few seconds: with no new report the estimate and both layers come
    from the cache, and after one the counts are read once, for the estimate, whose body carries
    the raw layer too."""
    spec = CampaignSpec.from_dict(PLANAR_SPEC)
    centre = {"lat": spec.region.lat_min + 1e-4, "lon": spec.region.lon_min + 1e-4}
    post_reports(signed_in, PLANAR_SPEC, [centre] * 20, seed=5)
    url = "/dashboard/data/campaigns/where/estimate"
    first = signed_in.get(url).get_json()["heatmap"]["raw"]
    reads = []
    counts = CampaignStore.counts
    monkeypatch.setattr(
        CampaignStore, "counts", lambda self, cid: reads.append(cid) or counts(self, cid)
    )
    assert signed_in.get(url).get_json()["heatmap"]["raw"] == first and reads == []
    post_reports(signed_in, PLANAR_SPEC, [centre] * 20, seed=6)
    again = signed_in.get(url).get_json()["heatmap"]["raw"]
    assert reads == ["where"]
    counts = signed_in.get("/api/v1/campaigns/where/counts", headers=analyst).get_json()
    assert [share for line in again for share in line] == pytest.approx(
        [row["count"] / 40 for row in counts["counts"]]
    )
    assert again != first


def test_an_exponential_grid_campaign_gets_the_map_page_and_heatmaps(signed_in, admin):
    assert signed_in.post("/api/v1/campaigns", json=GRID_SPEC, headers=admin).status_code == 201
    spec = CampaignSpec.from_dict(GRID_SPEC)
    grid = spec.grid
    centre = grid.to_latlon(*grid.centre_xy(5))
    post_reports(signed_in, GRID_SPEC, [{"lat": centre[0], "lon": centre[1]}] * 200, seed=5)
    page = signed_in.get(f"/dashboard/campaigns/{spec.id}").get_data(as_text=True)
    assert 'data-mechanism="exponential_grid"' in page
    assert "Exponential mechanism on a grid" in page
    assert "0.005 per m of euclidean distance" in page
    assert f"{grid.rows} × {grid.cols} cells of 200 m" in page
    assert 'id="heatmap-raw"' in page
    body = signed_in.get(f"/dashboard/data/campaigns/{spec.id}/estimate").get_json()
    layers = body["heatmap"]
    assert (layers["rows"], layers["cols"]) == (grid.rows, grid.cols)
    assert sum(map(sum, layers["raw"])) == pytest.approx(1.0)
    row, col = divmod(5, grid.cols)
    assert layers["estimate"][row][col] == body["estimates"][5]["frequency"]


# -- region campaigns of categorical mechanisms, and the basemap ---------------------------

REGION_KRR_SPEC = {
    "id": "cells",
    "title": "Which cell are you in",
    "mechanism": "krr",
    "epsilon": 2.0,
    "region": PLANAR_SPEC["region"],
    "cell_size_m": 200,
}
REGION_OLH_SPEC = {**REGION_KRR_SPEC, "id": "hashed-cells", "mechanism": "olh"}
TILES = "https://tile.example:8443/{z}/{x}/{y}.png"


def test_a_region_krr_campaign_gets_the_map_page_and_both_heatmaps(signed_in, admin):
    assert (
        signed_in.post("/api/v1/campaigns", json=REGION_KRR_SPEC, headers=admin).status_code == 201
    )
    grid = CampaignSpec.from_dict(REGION_KRR_SPEC).grid
    centre = grid.centre(5)
    post_reports(signed_in, REGION_KRR_SPEC, [{"lat": centre[0], "lon": centre[1]}] * 200, seed=6)
    page = signed_in.get("/dashboard/campaigns/cells").get_data(as_text=True)
    assert "data-grid" in page and 'id="estimate-chart"' not in page
    assert 'id="heatmap-raw"' in page and 'id="heatmap-estimate"' in page
    assert f"{grid.rows} × {grid.cols} cells of 200 m" in page
    assert 'id="sort"' not in page  # no bar chart's controls
    body = signed_in.get("/dashboard/data/campaigns/cells/estimate").get_json()
    layers = body["heatmap"]
    assert (layers["rows"], layers["cols"]) == (grid.rows, grid.cols)
    assert layers["raw"] == body["grid"]["raw_cells"]
    assert sum(map(sum, layers["raw"])) == pytest.approx(1.0)
    row, col = divmod(5, grid.cols)
    assert layers["estimate"][row][col] == body["estimates"][5]["frequency"]
    assert layers["region"] == REGION_KRR_SPEC["region"]


def test_an_olh_campaign_over_cells_gets_a_map_and_says_why_there_is_no_raw_map(signed_in, admin):
    assert (
        signed_in.post("/api/v1/campaigns", json=REGION_OLH_SPEC, headers=admin).status_code == 201
    )
    grid = CampaignSpec.from_dict(REGION_OLH_SPEC).grid
    centre = grid.centre(3)
    post_reports(signed_in, REGION_OLH_SPEC, [{"lat": centre[0], "lon": centre[1]}] * 100, seed=7)
    page = signed_in.get("/dashboard/campaigns/hashed-cells").get_data(as_text=True)
    assert 'id="heatmap-estimate"' in page and 'id="heatmap-raw"' not in page
    assert 'id="no-raw-map"' in page and "is a hash of the reporter" in page
    body = signed_in.get("/dashboard/data/campaigns/hashed-cells/estimate").get_json()
    assert "raw_cells" not in body["grid"]
    assert body["heatmap"]["raw"] is None
    assert body["heatmap"]["zmax"] == max(map(max, body["heatmap"]["estimate"]))


def test_the_map_rule_is_having_a_grid(signed_in, admin, planar_campaign):
    for spec in (REGION_KRR_SPEC, REGION_OLH_SPEC, GRID_SPEC, KRR_SPEC, OLH_SPEC):
        assert signed_in.post("/api/v1/campaigns", json=spec, headers=admin).status_code == 201
    specs = (REGION_KRR_SPEC, REGION_OLH_SPEC, GRID_SPEC, PLANAR_SPEC, KRR_SPEC, OLH_SPEC)
    with signed_in.application.app_context():
        store = get_store()
        maps = {spec["id"]: data.has_map(store.get_campaign(spec["id"])) for spec in specs}
    assert maps == {
        "cells": True,
        "hashed-cells": True,
        "block": True,
        "where": True,
        "fruit": False,
        "apps": False,
    }


def test_no_basemap_by_default_and_no_tile_host_in_the_policy(signed_in, planar_campaign):
    response = signed_in.get("/dashboard/campaigns/where")
    page = response.get_data(as_text=True)
    assert 'id="basemap"' not in page and "leaflet" not in page
    assert "img-src 'self' data: blob:;" in response.headers["Content-Security-Policy"]


def test_a_tile_url_draws_the_basemap_and_opens_the_policy_to_its_host(config):
    app = create_app({**config, "MAP_TILES_URL": TILES, "MAP_TILES_ATTRIBUTION": "<b>Tiles</b>"})
    client = app.test_client()
    assert sign_in(client).status_code == 303
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert client.post("/api/v1/campaigns", json=REGION_KRR_SPEC, headers=admin).status_code == 201
    response = client.get("/dashboard/campaigns/cells")
    page = response.get_data(as_text=True)
    assert f'data-tiles-url="{TILES}"' in page
    assert 'data-attribution="&lt;b&gt;Tiles&lt;/b&gt;"' in page
    assert "vendor/leaflet/leaflet.js" in page and "vendor/leaflet/leaflet.css" in page
    policy = response.headers["Content-Security-Policy"]
    assert "img-src 'self' data: blob: https://tile.example:8443;" in policy
    assert "script-src 'self';" in policy and "connect-src 'self';" in policy
    # Pages without a map load no map library.
    assert "leaflet" not in client.get("/dashboard/campaigns/fruit").get_data(as_text=True)
    for name in ("leaflet.js", "leaflet.css", "images/layers.png", "LICENSE"):
        assert client.get(f"/dashboard/static/vendor/leaflet/{name}").status_code == 200


@pytest.mark.parametrize(
    ("tiles_url", "source"),
    [
        ("https://tile.example/{z}/{x}/{y}.png", "https://tile.example"),
        ("http://127.0.0.1:8080/{z}/{x}/{y}.png", "http://127.0.0.1:8080"),
        ("https://{s}.tile.example/{z}/{x}/{-y}.png", "https://*.tile.example"),
    ],
)
def test_the_policy_allows_the_tile_host_only(tiles_url, source):
    from aggregator.dashboard.views import content_security_policy

    policy = content_security_policy(tiles_url)
    assert f"img-src 'self' data: blob: {source};" in policy
    assert policy.count(source) == 1


def test_csv_download_matches_the_estimate(signed_in, fruit_reports):
    response = signed_in.get("/dashboard/data/campaigns/fruit/estimate.csv?method=inversion")
    assert response.status_code == 200
    assert response.mimetype == "text/csv"
    assert 'filename="fruit-estimate-inversion.csv"' in response.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.get_data(as_text=True))))
    estimate = signed_in.get("/dashboard/data/campaigns/fruit/estimate?method=inversion")
    expected = estimate.get_json()["estimates"]
    assert [row["label"] for row in rows] == KRR_SPEC["domain"]
    for row, want in zip(rows, expected, strict=True):
        for key in ("frequency", "ci_low", "ci_high"):
            assert float(row[key]) == want[key]


def test_json_download_is_the_api_body(signed_in, fruit_reports, analyst):
    response = signed_in.get("/dashboard/data/campaigns/fruit/estimate.json?method=clip")
    assert 'filename="fruit-estimate-clip.json"' in response.headers["Content-Disposition"]
    api = signed_in.get("/api/v1/campaigns/fruit/estimate?method=clip", headers=analyst)
    ours, theirs = response.get_json(), api.get_json()
    ours.pop("seconds")
    theirs.pop("seconds")
    assert ours == theirs


def test_csv_defuses_spreadsheet_formulas(signed_in, admin):
    spec = {**KRR_SPEC, "id": "formula", "domain": ["=1+1", "@cmd", "plain", "-5"]}
    assert signed_in.post("/api/v1/campaigns", json=spec, headers=admin).status_code == 201
    post_reports(signed_in, spec, ["plain"] * 20, seed=5)
    text = signed_in.get("/dashboard/data/campaigns/formula/estimate.csv").get_data(as_text=True)
    labels = [row["label"] for row in csv.DictReader(io.StringIO(text))]
    assert labels == ["'=1+1", "'@cmd", "plain", "'-5"]


def test_csv_download_is_the_api_file(signed_in, planar_campaign, analyst):
    spec = CampaignSpec.from_dict(PLANAR_SPEC)
    centre = spec.grid.centre(3)
    post_reports(signed_in, PLANAR_SPEC, [{"lat": centre[0], "lon": centre[1]}] * 30, seed=7)
    ours = signed_in.get("/dashboard/data/campaigns/where/estimate.csv?method=inversion")
    api = signed_in.get(
        "/api/v1/campaigns/where/estimate?method=inversion&format=csv", headers=analyst
    )
    assert ours.get_data(as_text=True) == api.get_data(as_text=True)


def test_planar_csv_gives_cells_and_centres(signed_in, planar_campaign):
    spec = CampaignSpec.from_dict(PLANAR_SPEC)
    centre = spec.grid.centre(0)
    post_reports(signed_in, PLANAR_SPEC, [{"lat": centre[0], "lon": centre[1]}] * 30, seed=6)
    text = signed_in.get("/dashboard/data/campaigns/where/estimate.csv").get_data(as_text=True)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == spec.grid.n_cells
    last = rows[-1]
    row, col = divmod(spec.grid.n_cells - 1, spec.grid.cols)
    assert (last["label"], int(last["row"]), int(last["col"])) == (f"r{row}c{col}", row, col)
    assert (float(last["lat"]), float(last["lon"])) == spec.grid.centre(spec.grid.n_cells - 1)


def test_empty_campaign_estimate(signed_in, krr_campaign):
    body = signed_in.get("/dashboard/data/campaigns/fruit/estimate").get_json()
    assert (body["n"], body["estimates"]) == (0, [])


def test_settings_come_from_the_environment(monkeypatch, redis_url):
    monkeypatch.setenv("LDP_REDIS_URL", redis_url)
    monkeypatch.setenv("LDP_ANALYST_TOKEN", "from-env")
    monkeypatch.setenv("LDP_ALLOW_WEAK_TOKENS", "1")  # a short token, for development
    monkeypatch.setenv("LDP_SECRET_KEY", "12345678901234567890")
    monkeypatch.setenv("LDP_DASHBOARD_REFRESH_S", "2")
    monkeypatch.setenv("LDP_SESSION_COOKIE_SECURE", "true")
    app = create_app()
    assert app.config["SECRET_KEY"] == "12345678901234567890"
    assert app.config["DASHBOARD_REFRESH_S"] == 2
    client = app.test_client()
    response = sign_in(client, "from-env")
    assert response.status_code == 303
    assert "Secure" in response.headers["Set-Cookie"]


def test_an_olh_campaign_page_and_its_top_values(signed_in, admin, analyst):
    spec = {**OLH_SPEC, "domain_size": 50_000}
    assert signed_in.post("/api/v1/campaigns", json=spec, headers=admin).status_code == 201
    page = signed_in.get("/dashboard/campaigns/apps").get_data(as_text=True)
    assert "Optimized local hashing (OLH)" in page and "50,000" in page
    assert 'value="projection" selected' in page
    assert "Top 1,000 (of 50,000)" in page
    post_reports(signed_in, spec, [123] * 300 + list(range(300)), seed=5)
    ours = signed_in.get("/dashboard/data/campaigns/apps/estimate").get_json()
    api = signed_in.get("/api/v1/campaigns/apps/estimate", headers=analyst).get_json()
    assert ours["method"] == api["method"] == "projection"
    assert ours["estimates"] == api["estimates"] and len(ours["estimates"]) == 1000
    assert ours["estimates"][0]["value"] == 123
    csv = signed_in.get("/dashboard/data/campaigns/apps/estimate.csv").get_data(as_text=True)
    assert csv.splitlines()[1].startswith("123,")


def test_the_expected_error_of_a_campaign_given_by_its_domain_size_counts_every_value(
    signed_in, admin
):
    # The page read the domain's size from its labels or range: 1 value for domain_size.
    spec = {**OLH_SPEC, "domain_size": 5_000}
    assert signed_in.post("/api/v1/campaigns", json=spec, headers=admin).status_code == 201
    post_reports(signed_in, spec, list(range(100)), seed=7)
    page = signed_in.get("/dashboard/campaigns/apps").get_data(as_text=True)
    assert "summed over the 5,000 values" in page


# -- time: windows, the trend and the comparison ---------------------------------------------


def test_the_dashboards_data_follow_the_window_through_the_apis_code(client, admin, app):
    """The estimate, downloads, trend and comparison of the page take the API's window and
    answer what the API answers for it (the store's clock places the reports in days)."""
    import datetime

    from test_windows import DAILY, Clock, send

    monday = datetime.datetime(2026, 11, 2, tzinfo=datetime.UTC).timestamp()
    day = 86400.0
    clock = Clock(monday - day)
    with app.app_context():
        app.extensions[EXTENSION].get().clock = clock
    assert client.post("/api/v1/campaigns", json=DAILY, headers=admin).status_code == 201
    send(client, "fruit", ["apple"] * 30 + ["banana"] * 10, monday, clock)
    send(client, "fruit", ["apple"] * 10 + ["banana"] * 50, monday + day, clock)
    clock.now = monday + day + 60
    assert sign_in(client).status_code == 303
    api = {"Authorization": f"Bearer {ANALYST_TOKEN}"}
    tuesday = {"since": "2026-11-03", "until": "2026-11-03"}
    ours = client.get("/dashboard/data/campaigns/fruit/estimate", query_string=tuesday).get_json()
    theirs = client.get("/api/v1/campaigns/fruit/estimate", query_string=tuesday, headers=api)
    assert ours["n"] == theirs.get_json()["n"] == 60
    assert ours["estimates"] == theirs.get_json()["estimates"]
    everything = client.get("/dashboard/data/campaigns/fruit/estimate").get_json()
    assert everything["n"] == 100
    download = client.get("/dashboard/data/campaigns/fruit/estimate.csv", query_string=tuesday)
    assert "fruit-estimate-" in download.headers["Content-Disposition"]
    assert "-2026-11-03-2026-11-03.csv" in download.headers["Content-Disposition"]
    # The trend: at least a week of days up to the window's last, top categories first.
    trend = client.get("/dashboard/data/campaigns/fruit/trend", query_string=tuesday).get_json()
    assert [p["period"] for p in trend["periods"]][-2:] == ["2026-11-02", "2026-11-03"]
    assert len(trend["periods"]) == 7
    assert [p["n"] for p in trend["periods"]][-2:] == [40, 60]
    api_trend = client.get(
        "/api/v1/campaigns/fruit/trend",
        query_string={"periods": 7, "until": "2026-11-03", "top": 5},
        headers=api,
    ).get_json()
    assert trend["series"] == api_trend["series"]
    # The comparison: the window against as many periods just before it.
    compare = client.get("/dashboard/data/campaigns/fruit/compare", query_string=tuesday)
    body = compare.get_json()
    assert body["a"]["window"]["since"] == "2026-11-02" and body["b"]["n"] == 60
    api_compare = client.get(
        "/api/v1/campaigns/fruit/compare",
        query_string={
            "a_since": "2026-11-02",
            "a_until": "2026-11-02",
            **{"b_since": "2026-11-03", "b_until": "2026-11-03"},
        },
        headers=api,
    ).get_json()
    assert body["differences"] == api_compare["differences"]
    assert any(row["excludes_zero"] for row in body["differences"])
    # The page offers the latest day, the latest 7, all time and custom ends.
    page = client.get("/dashboard/campaigns/fruit").get_data(as_text=True)
    assert 'data-since="2026-11-03" data-until="2026-11-03"' in page
    assert 'data-since="2026-10-28" data-until="2026-11-03"' in page
    assert 'type="date" id="window-since"' in page
