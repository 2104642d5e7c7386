"""Creating a campaign without a mechanism: the server chooses one and says why (real Redis)."""

from __future__ import annotations

import json
import math
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.estimation.advice import oracle_mse
from aggregator.estimation.region_advice import rank_grid
from shared.geo import Grid, Region
from shared.spec import (
    ADVISED_SCHEMA,
    DEFAULT_EXPECTED_USERS,
    MAX_EPSILON,
    MAX_GEOMETRIC_EPSILON,
    MAX_RANGE_VALUES,
    CampaignSpec,
)

LABELS = ["apple", "banana", "cherry", "damson"]
REGION = {"lat_min": 37.77, "lat_max": 37.78, "lon_min": -122.42, "lon_max": -122.41}


def create(client, admin, **body):
    return client.post(
        "/api/v1/campaigns", json={"id": "planned", "title": "T", **body}, headers=admin
    )


def test_labels_get_krr_with_the_advice_and_the_same_request_again_is_200(client, admin):
    response = create(client, admin, epsilon=1.5, domain=LABELS)
    assert response.status_code == 201, response.get_json()
    body = response.get_json()
    assert body["mechanism"] == "krr" and body["domain"] == LABELS
    advice = body["advice"]
    assert advice["chosen"] == "krr"
    assert advice["expected_users"] == DEFAULT_EXPECTED_USERS
    assert advice["why"].startswith("krr: ")
    ranking = advice["ranking"]
    assert ranking[0]["mechanism"] == "krr"
    assert ranking[0]["expected_mse"] == pytest.approx(
        oracle_mse("krr", 4, 1.5, DEFAULT_EXPECTED_USERS)
    )
    assert {o["mechanism"]: o["hosted"] for o in ranking}["oue"] is False
    # The campaign is an ordinary krr campaign: its spec parses and pins as any other.
    served = client.get("/api/v1/campaigns/planned").get_json()
    assert "advice" not in served
    spec, _ = CampaignSpec.from_wire(served)
    assert spec.mechanism == "krr"
    again = create(client, admin, epsilon=1.5, domain=LABELS)
    assert again.status_code == 200
    assert again.get_json()["advice"]["chosen"] == "krr"


def test_two_labels_get_binary_randomized_response(client, admin):
    body = create(client, admin, epsilon=1, domain=["no", "yes"]).get_json()
    assert body["mechanism"] == "rr" and body["advice"]["chosen"] == "rr"


def test_a_large_domain_gets_the_best_hosted_mechanism_and_says_what_would_be_better(client, admin):
    labels = [f"item{i}" for i in range(200)]
    body = create(client, admin, epsilon=1, domain=labels, expected_users=10**6).get_json()
    # OLH is hosted: it is taken; OUE (same error, k bits a report) is not.
    assert body["mechanism"] == "olh"
    advice = body["advice"]
    assert advice["expected_users"] == 10**6
    ranked = [option["mechanism"] for option in advice["ranking"]]
    assert set(ranked[:2]) == {"oue", "olh"} and ranked.index("krr") > ranked.index("olh")
    if ranked[0] == "oue":
        assert "oue would be better but this service does not host it yet" in advice["why"]


def test_a_range_gets_geometric_when_it_is_wide_and_krr_over_its_values_when_it_is_small(
    client, admin
):
    wide = create(client, admin, epsilon=0.5, lo=0, hi=120).get_json()
    assert wide["mechanism"] == "geometric" and (wide["lo"], wide["hi"]) == (0, 120)
    assert wide["advice"]["ranking"][0]["mechanism"] == "geometric"
    small = client.post(
        "/api/v1/campaigns",
        json={"id": "rating", "title": "Rating", "epsilon": 2, "lo": 1, "hi": 4},
        headers=admin,
    ).get_json()
    assert small["mechanism"] == "krr" and small["domain"] == ["1", "2", "3", "4"]


def test_a_region_is_ranked_by_the_simulation_ldp_simulate_advise_runs(client, admin):
    """At 0.01 per metre over 200 m cells every mechanism for a region is simulated, k-RR and
    OLH over the cells at 2 per cell among them; the ranking is the one
    ``ldp-simulate advise --region`` prints, figure for figure, and the best is created."""
    response = create(
        client, admin, region=REGION, cell_size_m=200, privacy_level=2, privacy_radius_m=200
    )
    assert response.status_code == 201, response.get_json()
    body = response.get_json()
    ranking = body["advice"]["ranking"]
    grid = Grid(Region(**REGION), 200.0)
    expected = [o.to_dict() for o in rank_grid(grid, 0.01, DEFAULT_EXPECTED_USERS)]
    assert ranking == json.loads(json.dumps(expected))
    assert sorted((o["mechanism"], o.get("metric") or "") for o in ranking) == [
        ("exponential_grid", "euclidean"),
        ("exponential_grid", "manhattan"),
        ("krr", ""),
        ("olh", ""),
        ("planar_laplace", ""),
    ]
    assert all(o["hosted"] for o in ranking)
    assert all(o["basis"].startswith("simulation, 2 trials of 10,000 users") for o in ranking)
    emd = [o["expected_emd_m"] for o in ranking]
    assert emd == sorted(emd)
    best = ranking[0]
    assert body["mechanism"] == best["mechanism"]
    assert body.get("metric") == best.get("metric")
    assert body["epsilon"] == pytest.approx(best["epsilon"])
    cells = {o["mechanism"]: o for o in ranking if o.get("as_cells")}
    assert cells["krr"]["epsilon"] == pytest.approx(2.0) == cells["olh"]["epsilon"]
    # The same request again gives the same advice (the simulation is seeded).
    again = create(
        client, admin, region=REGION, cell_size_m=200, privacy_level=2, privacy_radius_m=200
    )
    assert again.status_code == 200 and again.get_json()["advice"] == body["advice"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"epsilon": 1}, "domain"),
        ({"epsilon": 1, "domain": LABELS, "lo": 0, "hi": 3}, "domain"),
        ({"domain": LABELS}, "epsilon"),
        ({"epsilon": 1, "lo": 0}, "hi"),
        ({"epsilon": 1, "lo": 5, "hi": 5}, "lo"),
        ({"epsilon": 1, "lo": 0, "hi": 10**6}, "hi"),
        ({"epsilon": 51, "domain": LABELS}, "epsilon"),
        ({"epsilon": 1, "domain": LABELS, "expected_users": 0}, "expected_users"),
        ({"epsilon": 1, "domain": LABELS, "privacy_level": 1}, "privacy_level"),
        ({"region": REGION, "cell_size_m": 200}, "epsilon"),
        ({"epsilon": 1, "domain": LABELS, "colour": "red"}, "colour"),
    ],
)
def test_an_incomplete_or_contradictory_request_is_refused_naming_the_field(
    client, admin, body, field
):
    response = create(client, admin, **body)
    assert response.status_code == 422, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "invalid_spec"
    assert error["field"] == field
    assert client.get("/api/v1/campaigns").get_json() == {"campaigns": []}


def test_expected_users_with_a_mechanism_is_refused(client, admin):
    response = create(client, admin, mechanism="krr", epsilon=1, domain=LABELS, expected_users=5)
    assert response.status_code == 422
    assert response.get_json()["error"]["field"] == "expected_users"


def test_a_region_where_reports_hardly_move_gets_krr_over_its_cells(client, admin):
    """At 0.1 per metre over 200 m cells the exponential mechanism's spec refuses the step
    (20 per cell), OLH is not simulated (its closed form loses to k-RR's over 30 cells at
    20), and k-RR at 20 keeps every report in its cell where planar Laplace moves some 20 m
    over a cell's edge: k-RR is chosen, as a region campaign."""
    response = create(client, admin, region=REGION, cell_size_m=200, epsilon=0.1)
    assert response.status_code == 201, response.get_json()
    body = response.get_json()
    assert (body["mechanism"], body["epsilon"]) == ("krr", pytest.approx(20.0))
    assert body["region"] == REGION and body["cell_size_m"] == 200
    assert [o["mechanism"] for o in body["advice"]["ranking"]] == ["krr", "planar_laplace"]


def test_a_region_ranks_only_the_grid_steps_a_spec_takes():
    """Below 0.01 per cell the exponential_grid spec is refused, and its lattice sum (whose
    cost grows as 1 / step^2) would run for minutes: it is not ranked."""
    grid = Grid(Region(**REGION), 200.0)
    ranking = rank_grid(grid, 1e-7, 1_000)
    assert "exponential_grid" not in [option.mechanism for option in ranking]
    steps = {
        o.details["metric"]: o.epsilon * 200
        for o in rank_grid(grid, 0.01, 1_000)
        if o.details.get("metric")
    }
    assert steps == pytest.approx({"euclidean": 2.0, "manhattan": 2.0 / math.sqrt(2)})


def _strict_json(response) -> dict:
    """The body as JSON that any parser reads alike: NaN and Infinity are refused."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the body: {response.get_data(as_text=True)[:300]}")

    return json.loads(response.get_data(as_text=True), parse_constant=refuse)


@pytest.mark.parametrize(
    ("body", "mechanism", "field"),
    [
        # Below 2**-63 no categorical mechanism's weights exist (it was a 500 from 1e-16 down).
        ({"epsilon": 1e-20, "domain": LABELS}, "krr", "epsilon"),
        # level / radius overflows to inf, or underflows to 0 (the first was a 500).
        (
            {"region": REGION, "cell_size_m": 200, "privacy_level": 1, "privacy_radius_m": 1e-310},
            "planar_laplace",
            "privacy_level",
        ),
        (
            {
                "region": REGION,
                "cell_size_m": 200,
                "privacy_level": 1e-300,
                "privacy_radius_m": 1e300,
            },
            "planar_laplace",
            "privacy_level",
        ),
        (
            {"region": REGION, "cell_size_m": 200, "epsilon": 0.01, "privacy_level": 2},
            "planar_laplace",
            "privacy_radius_m",
        ),
        (
            {
                "region": REGION,
                "cell_size_m": 200,
                "epsilon": 0.02,
                "privacy_level": 2,
                "privacy_radius_m": 200,
            },
            "planar_laplace",
            "epsilon",
        ),
    ],
)
def test_what_the_explicit_path_refuses_is_refused_without_a_mechanism_too(
    client, admin, body, mechanism, field
):
    explicit = create(client, admin, mechanism=mechanism, **body)
    assert explicit.status_code == 422, explicit.get_json()
    assert explicit.get_json()["error"]["field"] == field
    advised = create(client, admin, **body)
    assert advised.status_code == 422, advised.get_data(as_text=True)
    assert advised.get_json()["error"]["code"] == "invalid_spec"
    assert advised.get_json()["error"]["field"] == field


@pytest.mark.parametrize(
    ("body", "chosen"),
    [
        ({"epsilon": 1e-16, "domain": LABELS}, "krr"),
        ({"epsilon": 1e-17, "domain": ["no", "yes"]}, "rr"),
        ({"epsilon": 2.0**-63, "domain": [f"item{i}" for i in range(200)]}, None),
        # Only geometric takes this epsilon; its closed form has no finite value there.
        ({"epsilon": 1e-300, "lo": 0, "hi": 10}, "geometric"),
        ({"epsilon": 1e-17, "lo": 0, "hi": 10}, None),
        # Above geometric's limit: the oracles over the range's values only.
        ({"epsilon": 20, "lo": 0, "hi": 10}, None),
    ],
)
def test_an_extreme_epsilon_the_explicit_path_takes_creates_a_campaign(client, admin, body, chosen):
    response = create(client, admin, **body)
    assert response.status_code == 201, response.get_data(as_text=True)
    created = _strict_json(response)
    assert created["advice"]["chosen"] == created["mechanism"]
    if chosen is not None:
        assert created["mechanism"] == chosen
    spec, _ = CampaignSpec.from_wire(client.get("/api/v1/campaigns/planned").get_json())
    assert spec.epsilon == body["epsilon"]
    ranked = {option["mechanism"] for option in created["advice"]["ranking"]}
    if body["epsilon"] > MAX_GEOMETRIC_EPSILON:
        assert "geometric" not in ranked  # a spec it cannot have is not ranked
    if body["epsilon"] < 2.0**-63:
        assert ranked == {"geometric"}


# The bounds the served document gives a body without a mechanism (the contract test walks
# each one; here they bound random bodies).
_ADVISED = ADVISED_SCHEMA.merged().schema()["properties"]
_LAT = _ADVISED["region"]["properties"]["lat_min"]
_LON = _ADVISED["region"]["properties"]["lon_min"]
_BOUND = _ADVISED["lo"]
_USERS = _ADVISED["expected_users"]
# Positive numbers of every magnitude, the subnormals and the mechanisms' limits included.
positive = st.one_of(
    st.floats(min_value=0, exclude_min=True, allow_infinity=False, allow_subnormal=True),
    st.integers(-323, 308).map(lambda exponent: float(f"1e{exponent}")),
    st.sampled_from(
        [5e-324, 1e-310, 2.0**-63, 1e-17, 1e-16, 1e-15, 0.01, 1.0, MAX_GEOMETRIC_EPSILON]
    ),
    st.floats(min_value=MAX_EPSILON * 0.9, max_value=MAX_EPSILON * 1.1),
)
labels = st.lists(
    st.text(min_size=1, max_size=_ADVISED["domain"]["items"]["maxLength"]),
    min_size=_ADVISED["domain"]["minItems"],
    max_size=40,
    unique=True,
)


@st.composite
def ranges(draw) -> dict:
    lo = draw(st.integers(_BOUND["minimum"], _BOUND["maximum"]))
    width = draw(st.integers(-1, MAX_RANGE_VALUES + 1) | st.sampled_from([1, 2, MAX_RANGE_VALUES]))
    return {"lo": lo, "hi": min(lo + width, _BOUND["maximum"])}


@st.composite
def regions(draw) -> dict:
    lat = draw(st.floats(_LAT["minimum"], _LAT["maximum"]))
    lon = draw(st.floats(_LON["minimum"], _LON["maximum"]))
    extent = st.floats(1e-6, 2.0) | st.sampled_from([1e-9, 0.001, 0.01, 10.0])
    region = {
        "lat_min": lat,
        "lat_max": min(lat + draw(extent), _LAT["maximum"]),
        "lon_min": lon,
        "lon_max": min(lon + draw(extent), _LON["maximum"]),
    }
    cell = draw(st.floats(_ADVISED["cell_size_m"]["minimum"], 1e6) | st.sampled_from([1.0, 1e300]))
    body: dict = {"region": region, "cell_size_m": cell}
    privacy = draw(st.sampled_from(["epsilon", "level", "both", "level only"]))
    if privacy in ("epsilon", "both"):
        body["epsilon"] = draw(positive)
    if privacy in ("level", "both", "level only"):
        body["privacy_level"] = draw(positive)
    if privacy in ("level", "both"):
        body["privacy_radius_m"] = draw(positive)
    return body


@st.composite
def advised_bodies(draw) -> dict:
    form = draw(st.sampled_from(["labels", "range", "region"]))
    if form == "labels":
        body = {"domain": draw(labels), "epsilon": draw(positive)}
    elif form == "range":
        body = {**draw(ranges()), "epsilon": draw(positive)}
    else:
        body = draw(regions())
    if draw(st.booleans()):
        body["expected_users"] = draw(
            st.integers(_USERS["minimum"], _USERS["maximum"])
            | st.sampled_from([_USERS["minimum"], _USERS["maximum"]])
        )
    return body


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=advised_bodies())
def test_a_campaign_without_a_mechanism_is_created_or_refused_never_a_server_error(
    client, admin, body
):
    campaign_id = f"fuzz-{uuid.uuid4().hex[:12]}"
    response = client.post(
        "/api/v1/campaigns", json={"id": campaign_id, "title": "T", **body}, headers=admin
    )
    assert response.status_code in (201, 422), (body, response.get_data(as_text=True)[:500])
    answer = _strict_json(response)
    if response.status_code == 422:
        assert answer["error"]["code"] == "invalid_spec"
        assert answer["error"]["field"], answer
        return
    assert answer["advice"]["chosen"] == answer["mechanism"]
    served = client.get(f"/api/v1/campaigns/{campaign_id}").get_json()
    spec, _ = CampaignSpec.from_wire(served)
    assert spec.mechanism == answer["mechanism"]


def test_a_campaign_without_a_mechanism_takes_a_reporting_period(client, admin):
    body = {"id": "weekly", "title": "Weekly", "epsilon": 1.0, "domain": ["a", "b", "c"]}
    response = client.post("/api/v1/campaigns", json={**body, "period": "week"}, headers=admin)
    assert response.status_code == 201, response.get_json()
    assert client.get("/api/v1/campaigns/weekly").get_json()["period"] == "week"
