"""The estimate endpoint: parameters, auth, wiring of counts to the estimators, response shape."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from aggregator_testdata import GEOMETRIC_SPEC, KRR_SPEC, PLANAR_SPEC, submit

from aggregator.estimation import DEFAULT_METHODS
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

URL = "/api/v1/campaigns/fruit/estimate"


def test_estimate_needs_the_analyst_role(client, admin, analyst, krr_campaign):
    assert client.get(URL).status_code == 401
    assert client.get(URL, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get(URL, headers=analyst).status_code == 200
    assert client.get(URL, headers=admin).status_code == 200


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("method=median", "method"),
        ("confidence=1", "confidence"),
        ("confidence=0", "confidence"),
        ("confidence=nan", "confidence"),
        ("confidence=high", "confidence"),
        ("methd=ibu", "methd"),
    ],
)
def test_bad_parameters_are_422(client, analyst, krr_campaign, query, field):
    response = client.get(f"{URL}?{query}", headers=analyst)
    assert response.status_code == 422
    assert response.get_json()["error"]["field"] == field


def test_no_reports_yet(client, analyst, krr_campaign):
    body = client.get(URL, headers=analyst).get_json()
    assert body["n"] == 0
    assert body["estimates"] == []
    assert body["spec_hash"] == krr_campaign["spec_hash"]


def test_inversion_is_the_closed_form_on_the_stored_counts(client, analyst, krr_campaign):
    labels = KRR_SPEC["domain"]
    counts = [40, 25, 10, 5]
    submit(
        client, "fruit", [label for label, c in zip(labels, counts, strict=True) for _ in range(c)]
    )
    body = client.get(f"{URL}?method=inversion", headers=analyst).get_json()
    assert body["n"] == sum(counts)
    assert [row["label"] for row in body["estimates"]] == labels
    mechanism = Mechanism.from_spec(CampaignSpec.from_dict(KRR_SPEC))
    p, q = mechanism.p_keep, mechanism.p_other
    for row, count in zip(body["estimates"], counts, strict=True):
        expected = (count / sum(counts) - q) / (p - q)
        assert math.isclose(row["frequency"], expected, rel_tol=1e-9, abs_tol=1e-12)
        # Bounds lie in [0, 1] and hold the estimate clipped into it (inversion can be < 0).
        inside = min(max(row["frequency"], 0.0), 1.0)
        assert 0.0 <= row["ci_low"] <= inside < row["ci_high"] <= 1.0


def test_confidence_widens_the_interval(client, analyst, krr_campaign):
    submit(client, "fruit", ["apple"] * 30 + ["banana"] * 20)
    widths = []
    for level in ("0.8", "0.99"):
        body = client.get(f"{URL}?method=inversion&confidence={level}", headers=analyst).get_json()
        assert body["confidence"] == float(level)
        widths.append(body["estimates"][0]["ci_high"] - body["estimates"][0]["ci_low"])
    assert widths[0] < widths[1]


def test_ibu_recovers_a_population_sent_over_http(client, analyst, krr_campaign):
    """3000 users perturbed on the 'device' with a seeded source; tolerance 0.08 (about 4 sd)."""
    spec = CampaignSpec.from_dict(KRR_SPEC)
    mechanism = Mechanism.from_spec(spec)
    truth = np.array([0.5, 0.3, 0.15, 0.05])
    rng = random.Random(20240601)
    n = 3000
    true_values = [spec.domain[i] for i, c in enumerate((truth * n).astype(int)) for _ in range(c)]
    submit(client, "fruit", [mechanism.perturb(v, rng) for v in true_values])
    for method in ("ibu", "mle", "inversion", "clip", "projection"):
        body = client.get(f"{URL}?method={method}", headers=analyst).get_json()
        assert body["method"] == method
        estimate = np.array([row["frequency"] for row in body["estimates"]])
        assert np.max(np.abs(estimate - truth)) < 0.08, (method, estimate)
        if method != "inversion":
            assert math.isclose(estimate.sum(), 1.0, rel_tol=1e-9)
            assert estimate.min() >= 0
    default = client.get(URL, headers=analyst).get_json()
    # k-RR's default is Norm-Sub, named in the response; it runs no IBU iterations.
    assert default["method"] == "projection" and default["estimator"].startswith("Norm-Sub")
    assert default["n_iter"] is None


def test_planar_estimate_comes_with_its_grid(client, analyst, planar_campaign):
    spec, _ = CampaignSpec.from_wire(planar_campaign)
    mechanism = Mechanism.from_spec(spec)
    grid = spec.grid
    rng = random.Random(7)
    centre = grid.n_cells // 2
    values = [mechanism.report_value(mechanism.perturb_index(centre, rng)) for _ in range(400)]
    submit(client, "where", values)
    body = client.get("/api/v1/campaigns/where/estimate", headers=analyst).get_json()
    assert body["n"] == 400
    assert body["grid"]["rows"] == grid.rows
    assert body["grid"]["cols"] == grid.cols
    assert body["grid"]["region"] == planar_campaign["region"]
    cells = np.array(body["grid"]["cells"])
    flat = np.array([row["frequency"] for row in body["estimates"]])
    assert cells.shape == (grid.rows, grid.cols)
    np.testing.assert_allclose(cells.ravel(), flat)
    assert math.isclose(flat.sum(), 1.0, rel_tol=1e-9)
    row, col = divmod(centre, grid.cols)
    assert body["estimates"][centre]["label"] == f"r{row}c{col}"
    # Everyone was in one cell: the reconstruction puts its mode there.
    assert int(np.argmax(flat)) == centre
    counts = client.get("/api/v1/campaigns/where/counts", headers=analyst).get_json()["counts"]
    raw = np.array(body["grid"]["raw_cells"])
    assert raw.shape == (grid.rows, grid.cols)
    np.testing.assert_allclose(raw.ravel(), [row["count"] / 400 for row in counts], rtol=1e-12)


def test_a_method_the_channel_cannot_support_is_422(client, admin, analyst):
    # epsilon so small that k-RR's float probabilities are equal: the channel is singular.
    spec = {**KRR_SPEC, "id": "flat", "epsilon": 1e-18}
    assert client.post("/api/v1/campaigns", json=spec, headers=admin).status_code == 201
    submit(client, "flat", ["apple", "banana"])
    response = client.get("/api/v1/campaigns/flat/estimate?method=inversion", headers=analyst)
    assert response.status_code == 422
    assert response.get_json()["error"]["code"] == "method_not_applicable"
    # The default does not try: it is the maximum-likelihood estimate, equal shares, whose
    # intervals say that nothing is known.
    default = client.get("/api/v1/campaigns/flat/estimate", headers=analyst)
    assert default.status_code == 200
    body = default.get_json()
    assert body["method"] == "mle"
    for row in body["estimates"]:
        assert row["frequency"] == pytest.approx(1 / len(body["estimates"]))
        assert (row["ci_low"], row["ci_high"]) == (0.0, 1.0)


def test_each_campaign_defaults_to_its_row_of_the_decision_table(client, admin, analyst):
    """The estimate without a method runs the mechanism's default, and the OpenAPI document
    says which (it served ``ibu`` as the default for every mechanism)."""
    spec = {"id": "vote", "title": "Voted", "mechanism": "rr", "epsilon": 1.0}
    for campaign, values in (
        (spec, ["yes"] * 30 + ["no"] * 70),
        (KRR_SPEC, ["apple", "banana"] * 20),
        (GEOMETRIC_SPEC, [30, 40] * 10),
        (PLANAR_SPEC, [Mechanism.from_spec(CampaignSpec.from_dict(PLANAR_SPEC)).report_value(0)]),
    ):
        assert client.post("/api/v1/campaigns", json=campaign, headers=admin).status_code == 201
        submit(client, campaign["id"], values)
        url = f"/api/v1/campaigns/{campaign['id']}/estimate"
        body = client.get(url, headers=analyst).get_json()
        assert body["method"] == DEFAULT_METHODS[campaign["mechanism"]]
        named = client.get(f"{url}?method={body['method']}", headers=analyst).get_json()
        assert named["estimates"] == body["estimates"]
    document = client.get("/api/v1/openapi.json").get_json()
    parameters = document["paths"]["/api/v1/campaigns/{campaign_id}/estimate"]["parameters"]
    method = next(p for p in parameters if p["name"] == "method")
    assert "default" not in method["schema"]
    assert method["x-default-by-mechanism"] == DEFAULT_METHODS
    assert "projection for rr, krr" in method["description"]
    # Methods that no longer exist are refused by name.
    response = client.get(f"{URL}?method=empirical_bayes", headers=analyst)
    assert response.status_code in (400, 422)
