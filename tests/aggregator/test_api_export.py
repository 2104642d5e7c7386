"""Exports (counts and estimates as JSON and CSV, over HTTP and the CLI) and the estimate cache."""

from __future__ import annotations

import csv
import io
import json

import pytest
from aggregator_testdata import KRR_SPEC, new_id

from aggregator.cli import main
from aggregator.http import estimates
from aggregator.http.estimates import ChannelCache
from aggregator.services import EXTENSION
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

BASE = "/api/v1/campaigns"
LABELS = KRR_SPEC["domain"]


def submit(client, campaign_id, values):
    body = {"reports": [{"report_id": new_id(), "value": v} for v in values]}
    response = client.post(f"{BASE}/{campaign_id}/reports", json=body)
    assert response.status_code == 200, response.get_json()


def rows_of(text):
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture
def fruit_counts(client, krr_campaign):
    counts = dict(zip(LABELS, (5, 3, 0, 2), strict=True))
    submit(client, "fruit", [label for label, c in counts.items() for _ in range(c)])
    return counts


def test_counts_as_csv_attachment(client, analyst, fruit_counts):
    response = client.get(f"{BASE}/fruit/counts?format=csv", headers=analyst)
    assert response.status_code == 200
    assert response.mimetype == "text/csv"
    assert response.headers["Content-Disposition"] == 'attachment; filename="fruit-counts.csv"'
    text = response.get_data(as_text=True)
    assert text.splitlines()[0] == "label,count"
    assert {row["label"]: int(row["count"]) for row in rows_of(text)} == fruit_counts
    as_json = client.get(f"{BASE}/fruit/counts?format=json", headers=analyst).get_json()
    assert {row["label"]: row["count"] for row in as_json["counts"]} == fruit_counts


def test_estimate_as_csv_is_the_json_estimate(client, analyst, fruit_counts):
    url = f"{BASE}/fruit/estimate?method=inversion"
    body = client.get(url, headers=analyst).get_json()
    response = client.get(f"{url}&format=csv", headers=analyst)
    assert response.status_code == 200
    assert response.mimetype == "text/csv"
    disposition = 'attachment; filename="fruit-estimate-inversion.csv"'
    assert response.headers["Content-Disposition"] == disposition
    rows = rows_of(response.get_data(as_text=True))
    assert [row["label"] for row in rows] == LABELS
    for row, expected in zip(rows, body["estimates"], strict=True):
        for column in ("frequency", "ci_low", "ci_high"):
            # Written with repr: the CSV holds the JSON's floats exactly.
            assert float(row[column]) == expected[column]


def test_planar_csv_locates_each_cell(client, analyst, planar_campaign):
    spec, _ = CampaignSpec.from_wire(planar_campaign)
    mechanism = Mechanism.from_spec(spec)
    submit(client, "where", [mechanism.report_value(4)] * 3)
    text = client.get(f"{BASE}/where/counts?format=csv", headers=analyst).get_data(as_text=True)
    rows = rows_of(text)
    assert list(rows[0]) == ["label", "row", "col", "lat", "lon", "count"]
    assert len(rows) == spec.grid.rows * spec.grid.cols
    row, col = divmod(4, spec.grid.cols)
    centre = mechanism.report_value(4)
    assert rows[4] == {
        "label": f"r{row}c{col}",
        "row": str(row),
        "col": str(col),
        "lat": str(centre["lat"]),
        "lon": str(centre["lon"]),
        "count": "3",
    }
    assert sum(int(r["count"]) for r in rows) == 3
    estimate = client.get(f"{BASE}/where/estimate?format=csv", headers=analyst)
    assert len(rows_of(estimate.get_data(as_text=True))) == len(rows)


@pytest.mark.parametrize("path", ["counts", "estimate"])
def test_exports_need_the_analyst_role_and_a_known_format(client, analyst, krr_campaign, path):
    assert client.get(f"{BASE}/fruit/{path}?format=csv").status_code == 401
    response = client.get(f"{BASE}/fruit/{path}?format=xml", headers=analyst)
    assert response.status_code == 422
    assert response.get_json()["error"]["field"] == "format"
    unknown = client.get(f"{BASE}/fruit/{path}?fmt=csv", headers=analyst)
    assert unknown.status_code == 422
    assert unknown.get_json()["error"]["field"] == "fmt"


def test_an_id_ending_in_a_newline_is_refused(client, admin):
    response = client.post(BASE, json={**KRR_SPEC, "id": "fruit\n"}, headers=admin)
    assert response.status_code == 422
    assert response.get_json()["error"]["field"] == "id"


FORMULAS = ["=1+1", "+SUM(A1)", "-2+3", "@cmd", "\tTAB", "\rCR", "a\rb", "plain"]
DEFUSED = ["'=1+1", "'+SUM(A1)", "'-2+3", "'@cmd", "'\tTAB", "'\rCR", "a\rb", "plain"]


@pytest.fixture
def formula_campaign(client, admin):
    spec = {**KRR_SPEC, "id": "formula", "domain": FORMULAS}
    assert client.post(BASE, json=spec, headers=admin).status_code == 201
    # Only "plain" is reported: inversion then estimates the other labels below zero.
    submit(client, "formula", ["plain"] * 30 + ["=1+1"] * 2)
    return spec


def test_csv_text_cannot_start_a_formula_and_numbers_stay_numbers(
    client, analyst, formula_campaign
):
    counts = rows_of(
        client.get(f"{BASE}/formula/counts?format=csv", headers=analyst).get_data(as_text=True)
    )
    assert [row["label"] for row in counts] == DEFUSED
    assert [row["count"] for row in counts] == ["2", "0", "0", "0", "0", "0", "0", "30"]
    url = f"{BASE}/formula/estimate?method=inversion"
    body = client.get(url, headers=analyst).get_json()
    rows = rows_of(client.get(f"{url}&format=csv", headers=analyst).get_data(as_text=True))
    assert [row["label"] for row in rows] == DEFUSED
    assert any(row["frequency"] < 0 for row in body["estimates"])
    for row, expected in zip(rows, body["estimates"], strict=True):
        for column in ("frequency", "ci_low", "ci_high"):
            assert float(row[column]) == expected[column]  # "'-0.01" would not parse


def test_cli_csv_exports_defuse_formulas(runner, redis_url, client, analyst, formula_campaign):
    reports = rows_of(run(runner, redis_url, "export", "formula", "--format", "csv"))
    assert sorted({row["value"] for row in reports}) == ["'=1+1", "plain"]
    for data in ("counts", "estimate"):
        printed = run(runner, redis_url, "export", "formula", "--data", data, "--format", "csv")
        served = client.get(f"{BASE}/formula/{data}?format=csv", headers=analyst)
        assert printed == served.get_data(as_text=True)
        assert [row["label"] for row in rows_of(printed)] == DEFUSED


# -- the estimate cache ------------------------------------------------------------------------


def test_estimate_is_cached_until_a_new_report_arrives(client, analyst, fruit_counts):
    url = f"{BASE}/fruit/estimate?method=ibu"
    first = client.get(url, headers=analyst)
    assert first.headers["X-Estimate-Cache"] == "miss"
    second = client.get(url, headers=analyst)
    assert second.headers["X-Estimate-Cache"] == "hit"
    assert second.get_json() == first.get_json()
    # Another method or level is another entry.
    other = client.get(f"{url}&confidence=0.9", headers=analyst)
    assert other.headers["X-Estimate-Cache"] == "miss"
    # A new report changes the counts: recomputed, then cached again.
    submit(client, "fruit", ["apple"])
    third = client.get(url, headers=analyst)
    assert third.headers["X-Estimate-Cache"] == "miss"
    assert third.get_json()["n"] == first.get_json()["n"] + 1
    assert client.get(url, headers=analyst).headers["X-Estimate-Cache"] == "hit"


def test_a_cache_hit_does_not_read_the_counts(app, client, analyst, fruit_counts, monkeypatch):
    """The counts of every shard are the costly read (16 x outputs fields): a campaign that
    has accepted no report since the estimate was cached is answered without them."""
    url = f"{BASE}/fruit/estimate"
    first = client.get(url, headers=analyst)
    assert first.headers["X-Estimate-Cache"] == "miss"
    store = app.extensions[EXTENSION].get()
    reads = []
    counts = type(store).counts
    monkeypatch.setattr(
        type(store), "counts", lambda self, cid: reads.append(cid) or counts(self, cid)
    )
    second = client.get(url, headers=analyst)
    assert second.headers["X-Estimate-Cache"] == "hit" and reads == []
    assert second.get_data() == first.get_data()
    submit(client, "fruit", ["banana"])
    third = client.get(url, headers=analyst)
    assert third.headers["X-Estimate-Cache"] == "miss" and reads == ["fruit"]
    assert third.get_json()["n"] == first.get_json()["n"] + 1


def test_an_entry_without_the_reports_seen_is_found_by_its_counts(
    app, client, analyst, fruit_counts
):
    """Entries cached before the reports seen were kept (or by a caller that has none) are
    still served when the counts are the same."""
    url = f"{BASE}/fruit/estimate"
    body = client.get(url, headers=analyst).get_data()
    store = app.extensions[EXTENSION].get()
    key = store.estimates.key("fruit", estimates.cache_variant("projection", 0.95))
    assert store.connection.hdel(key, "reports") == 1
    hit = client.get(url, headers=analyst)
    assert hit.headers["X-Estimate-Cache"] == "hit" and hit.get_data() == body


def test_a_retried_report_keeps_the_cache(client, analyst, krr_campaign):
    report = {"report_id": new_id(), "value": "cherry"}
    assert client.post(f"{BASE}/fruit/reports", json=report).get_json()["accepted"] == 1
    url = f"{BASE}/fruit/estimate"
    assert client.get(url, headers=analyst).headers["X-Estimate-Cache"] == "miss"
    assert client.post(f"{BASE}/fruit/reports", json=report).get_json()["duplicates"] == 1
    assert client.get(url, headers=analyst).headers["X-Estimate-Cache"] == "hit"


def test_planar_channel_is_built_once_per_process(app, client, analyst, planar_campaign):
    spec, _ = CampaignSpec.from_wire(planar_campaign)
    mechanism = Mechanism.from_spec(spec)
    channels = app.extensions[EXTENSION].channels
    url = f"{BASE}/where/estimate?method=inversion"
    for cell in (1, 2, 3):
        submit(client, "where", [mechanism.report_value(cell)])
        response = client.get(url, headers=analyst)
        assert response.headers["X-Estimate-Cache"] == "miss"
        assert response.get_json()["n"] == cell
    assert channels.builds == 1


def test_channel_cache_drops_the_least_recently_used(store):
    campaigns = []
    for epsilon in (1.0, 2.0, 3.0):
        spec = CampaignSpec.from_dict({**KRR_SPEC, "id": f"c{int(epsilon)}", "epsilon": epsilon})
        campaigns.append(store.create_campaign(spec)[0])
    cache = ChannelCache(size=2)
    first = cache.get(campaigns[0])
    cache.get(campaigns[1])
    assert cache.get(campaigns[0]) is first  # now the most recent
    cache.get(campaigns[2])  # evicts campaigns[1]
    assert cache.builds == 3
    assert cache.get(campaigns[0]) is first
    cache.get(campaigns[1])
    assert cache.builds == 4


# -- ldp-aggregator export ---------------------------------------------------------------------


def run(runner, redis_url, *args):
    result = runner.invoke(main, ["--redis-url", redis_url, *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_cli_exports_the_files_the_api_serves(runner, redis_url, client, analyst, fruit_counts):
    for query, args in [
        ("counts?format=csv", ["--data", "counts", "--format", "csv"]),
        (
            "estimate?format=csv&method=clip",
            ["--data", "estimate", "--format", "csv", "--method", "clip"],
        ),
    ]:
        served = client.get(f"{BASE}/fruit/{query}", headers=analyst).get_data(as_text=True)
        assert run(runner, redis_url, "export", "fruit", *args) == served
    counts = json.loads(run(runner, redis_url, "export", "fruit", "--data", "counts"))
    served = client.get(f"{BASE}/fruit/counts", headers=analyst).get_json()
    assert counts == served
    estimate = json.loads(run(runner, redis_url, "export", "fruit", "--data", "estimate"))
    assert estimate == client.get(f"{BASE}/fruit/estimate", headers=analyst).get_json()


def test_cli_exports_reports_as_csv(runner, redis_url, fruit_counts):
    rows = rows_of(run(runner, redis_url, "export", "fruit", "--format", "csv"))
    assert list(rows[0]) == ["report_id", "value", "received_at"]
    assert len(rows) == sum(fruit_counts.values())
    assert {label: sum(r["value"] == label for r in rows) for label in LABELS} == fruit_counts


def test_cli_export_of_an_unknown_campaign_fails(runner, redis_url):
    result = runner.invoke(main, ["--redis-url", redis_url, "export", "nope", "--data", "counts"])
    assert result.exit_code == 1
    assert result.stderr.endswith("\nError: no campaign 'nope'\n")


def test_the_cli_shares_the_estimate_cache(runner, redis_url, client, analyst, fruit_counts):
    # The cache lives in Redis: an estimate the CLI computed is a hit for the API.
    printed = json.loads(run(runner, redis_url, "estimate", "fruit", "--json"))
    response = client.get(f"{BASE}/fruit/estimate", headers=analyst)
    assert response.headers["X-Estimate-Cache"] == "hit"
    assert response.get_json() == printed


CELLS_REGION = {"lat_min": 37.77, "lat_max": 37.78, "lon_min": -122.42, "lon_max": -122.41}


def cells_campaign(client, admin, mechanism: str) -> tuple[CampaignSpec, Mechanism]:
    spec = {"id": f"cells-{mechanism}", "title": "Where, by cell", "mechanism": mechanism}
    spec |= {"epsilon": 2.0, "region": CELLS_REGION, "cell_size_m": 200}
    assert client.post(BASE, json=spec, headers=admin).status_code == 201
    parsed = CampaignSpec.from_dict(spec)
    return parsed, Mechanism.from_spec(parsed)


def located(grid, label: str) -> dict:
    """The cell columns an export gives the cell named ``label``."""
    index = grid.cell_labels().index(label)
    row, col = divmod(index, grid.cols)
    lat, lon = grid.centre(index)
    return {"row": row, "col": col, "lat": lat, "lon": lon}


def test_a_krr_campaign_over_cells_exports_each_cells_centre(client, admin, analyst):
    spec, mechanism = cells_campaign(client, admin, "krr")
    grid = spec.grid
    reports = [mechanism.perturb({"lat": 37.7712, "lon": -122.4185}) for _ in range(40)]
    submit(client, spec.id, reports)
    url = f"{BASE}/{spec.id}"
    text = client.get(f"{url}/counts?format=csv", headers=analyst).get_data(as_text=True)
    rows = rows_of(text)
    assert text.splitlines()[0] == "label,row,col,lat,lon,count"
    assert [row["label"] for row in rows] == list(grid.cell_labels())
    for row in rows:
        cell = located(grid, row["label"])
        assert {k: float(row[k]) for k in cell} == cell
    as_json = client.get(f"{url}/counts", headers=analyst).get_json()["counts"]
    for row in as_json:
        assert {k: row[k] for k in ("row", "col", "lat", "lon")} == located(grid, row["label"])
    assert sum(row["count"] for row in as_json) == 40

    estimate = client.get(f"{url}/estimate?format=csv", headers=analyst).get_data(as_text=True)
    assert estimate.splitlines()[0] == "label,row,col,lat,lon,frequency,ci_low,ci_high"
    for row in rows_of(estimate):
        cell = located(grid, row["label"])
        assert {k: float(row[k]) for k in cell} == cell
    body = client.get(f"{url}/estimate", headers=analyst).get_json()
    assert body["grid"]["lat"] == [grid.centre(r * grid.cols)[0] for r in range(grid.rows)]
    assert body["grid"]["lon"] == [grid.centre(c)[1] for c in range(grid.cols)]


def test_an_oracle_over_cells_exports_centres_by_label_not_by_position(client, admin, analyst):
    spec, mechanism = cells_campaign(client, admin, "olh")
    submit(client, spec.id, [mechanism.perturb({"lat": 37.7712, "lon": -122.4185})] * 30)
    url = f"{BASE}/{spec.id}"
    estimate = client.get(f"{url}/estimate?format=csv", headers=analyst).get_data(as_text=True)
    rows = rows_of(estimate)
    assert len(rows) == spec.grid.n_cells
    # Rows come largest estimate first; each still carries its own cell's centre.
    assert [row["label"] for row in rows] != list(spec.grid.cell_labels())
    for row in rows:
        cell = located(spec.grid, row["label"])
        assert {k: float(row[k]) for k in cell} == cell
    # Its counts are per seed and bucket, not per cell: no cell columns.
    counts = client.get(f"{url}/counts?format=csv", headers=analyst).get_data(as_text=True)
    assert counts.splitlines()[0] == "label,count"
    assert "row" not in client.get(f"{url}/counts", headers=analyst).get_json()["counts"][0]


def test_planar_json_counts_locate_each_cell(client, analyst, planar_campaign):
    spec, _ = CampaignSpec.from_wire(planar_campaign)
    rows = client.get(f"{BASE}/where/counts", headers=analyst).get_json()["counts"]
    assert len(rows) == spec.grid.n_cells
    for row in rows:
        assert {k: row[k] for k in ("row", "col", "lat", "lon")} == located(spec.grid, row["label"])
