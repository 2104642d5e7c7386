"""End-to-end simulation: the real client library, for every simulated user, against a server.

:func:`run_via_server` is what ``ldp-simulate via --server URL`` runs, and what a
demo script calls to fill a campaign:

1. create the campaign from its spec (admin token), or use the existing one
   with that id (an identical spec, or any spec when only an id is given);
2. draw ``n`` users from the population and give each its true value: a
   label, or for locations a point (the data set's own, or a uniform point in
   the user's cell);
3. report every user through :class:`client.Reporter`, concurrently on a
   thread pool, each with its own state directory (its own secret, ledger
   and queue: the client library keeps its state on disk only), removed once
   the user's report is acknowledged. A report the server does not take now
   (rate limit, unavailable) stays on that user's queue and is flushed again
   with a growing delay until ``deadline_s``;
4. fetch the server's counts and estimates (analyst token) and score them
   against the users' true distribution, next to the in-process simulation
   of the same users (vectorised sampler, same estimators) for reference.

Simulated users accept the campaign's cost: their :class:`client.Policy`
raises the per-report cap and the budget to at least the campaign's cost,
which a real user's device would not do for an expensive campaign.
The true values stay in this process; only the perturbed reports travel.
"""

from __future__ import annotations

import dataclasses
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import requests
from tqdm.auto import tqdm

from aggregator.estimation import METHODS
from aggregator.http.estimates import is_oracle, output_labels, value_labels
from client import Policy, Reporter, ServerUnavailable
from client.policy import DEFAULT_MAX_EPSILON, DEFAULT_TOTAL_BUDGET
from client.reporter import DELIVERED, DUPLICATE, QUEUED
from client.transport import normalize_server_url
from shared.errors import LDPError, SpecError
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec
from simulate.metrics import Scores, score
from simulate.populations import Population
from simulate.runner import NOISY, check_compatible, estimate_methods
from simulate.sampling import sample

API = "/api/v1"
DEFAULT_WORKERS = 8
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_DEADLINE_S = 600.0
_RETRY_FIRST_S = 0.5
_RETRY_MAX_S = 10.0
_ERRORS_KEPT = 5


class SimulationError(LDPError):
    """The end-to-end simulation cannot go on (server refused, unreachable, nothing delivered)."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message, code=code)
        self.status = status


@dataclass(frozen=True)
class ViaResult:
    """What an end-to-end run did and how accurate the server's estimates are.

    ``scores[method]`` scores the server's estimate; ``in_process[method]``
    scores the in-process simulation of the same users. ``previous_n`` is the
    number of reports the campaign held before this run (then the server's
    estimates mix them in, and the scores are not about these users alone).
    """

    url: str
    campaign_id: str
    spec_hash: str
    created: bool
    n_users: int
    delivered: int
    duplicates: int
    failed: int
    errors: list[str]
    seconds: float
    previous_n: int
    server_n: int | None
    truth: np.ndarray
    estimates: dict[str, np.ndarray] = field(default_factory=dict)
    responses: dict[str, dict[str, Any]] = field(default_factory=dict)
    scores: dict[str, Scores] = field(default_factory=dict)
    in_process: dict[str, Scores] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        rows = [
            {"source": source, "method": method, **s.to_dict()}
            for source, table in (("server", self.scores), ("in-process", self.in_process))
            for method, s in table.items()
        ]
        return {
            "url": self.url,
            "campaign": self.campaign_id,
            "spec_hash": self.spec_hash,
            "created": self.created,
            "n_users": self.n_users,
            "delivered": self.delivered,
            "duplicates": self.duplicates,
            "failed": self.failed,
            "errors": self.errors,
            "seconds": self.seconds,
            "reports_per_second": self.delivered / self.seconds if self.seconds > 0 else None,
            "previous_n": self.previous_n,
            "server_n": self.server_n,
            "results": rows,
        }


class ServerAPI:
    """The admin and analyst calls of the simulation, with a timeout on every request."""

    def __init__(
        self,
        url: str,
        *,
        admin_token: str | None = None,
        analyst_token: str | None = None,
        session: requests.Session | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ):
        self.url = normalize_server_url(url)
        self.admin_token = admin_token
        self.analyst_token = analyst_token
        self.session = session if session is not None else requests.Session()
        self.timeout = timeout

    def _call(self, method: str, path: str, *, token: str | None = None, **kwargs: Any):
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            response = self.session.request(
                method, f"{self.url}{API}{path}", headers=headers, timeout=self.timeout, **kwargs
            )
        except requests.RequestException as exc:
            raise SimulationError(f"cannot reach the aggregator at {self.url}: {exc}") from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        return response.status_code, body

    @staticmethod
    def _error(status: int, body: Any, what: str) -> SimulationError:
        error = body.get("error") if isinstance(body, dict) else None
        error = error if isinstance(error, dict) else {}
        message = error.get("message") or f"HTTP {status}"
        return SimulationError(
            f"{what}: {message} ({status})", status=status, code=error.get("code")
        )

    def get_campaign(self, campaign_id: str) -> tuple[CampaignSpec, dict[str, Any]] | None:
        """The campaign's spec and server fields, or None if there is no such campaign."""
        status, body = self._call("GET", f"/campaigns/{quote(campaign_id, safe='')}")
        if status == 404:
            return None
        if status != 200:
            raise self._error(status, body, f"cannot read campaign {campaign_id!r}")
        try:
            return CampaignSpec.from_wire(body)
        except SpecError as exc:
            raise SimulationError(f"the server's spec is invalid: {exc.message}") from exc

    def create_campaign(self, spec: CampaignSpec) -> bool:
        """Create the campaign; True if created, False if it existed with this very spec."""
        if not self.admin_token:
            raise SimulationError(
                f"campaign {spec.id!r} does not exist; creating it needs the admin token "
                "(--admin-token or LDP_ADMIN_TOKEN)"
            )
        status, body = self._call("POST", "/campaigns", token=self.admin_token, json=spec.to_dict())
        if status not in (200, 201):
            raise self._error(status, body, f"cannot create campaign {spec.id!r}")
        return status == 201

    def counts(self, campaign_id: str) -> dict[str, Any]:
        status, body = self._call(
            "GET", f"/campaigns/{quote(campaign_id, safe='')}/counts", token=self.analyst_token
        )
        if status != 200:
            raise self._error(status, body, "cannot read the counts")
        return body

    def estimate(self, campaign_id: str, method: str) -> dict[str, Any]:
        status, body = self._call(
            "GET",
            f"/campaigns/{quote(campaign_id, safe='')}/estimate",
            token=self.analyst_token,
            params={"method": method},
        )
        if status != 200:
            raise self._error(status, body, f"cannot fetch the {method} estimate")
        return body


def ensure_campaign(api: ServerAPI, spec: CampaignSpec | str) -> tuple[CampaignSpec, bool]:
    """The campaign to fill: an existing one (spec or id) or one created from ``spec``."""
    campaign_id = spec if isinstance(spec, str) else spec.id
    existing = api.get_campaign(campaign_id)
    if existing is not None:
        served, meta = existing
        if not isinstance(spec, str) and served.spec_hash != spec.spec_hash:
            raise SimulationError(
                f"campaign {campaign_id!r} already exists with another spec (hash "
                f"{served.spec_hash[:12]}...); choose another campaign id"
            )
        if meta.get("status", "open") != "open":
            raise SimulationError(f"campaign {campaign_id!r} is closed")
        return served, False
    if isinstance(spec, str):
        raise SimulationError(f"campaign {campaign_id!r} does not exist; give a spec to create it")
    return spec, api.create_campaign(spec)


def vector_from_estimate(body: dict[str, Any], mechanism: Mechanism) -> np.ndarray:
    """The estimate response's frequencies in input-index order (matched by label).

    An oracle's estimate (OLH, Hadamard response) lists its top values only: the
    others are taken as 0 (their total is the response's ``rows.rest_frequency``).
    """
    if is_oracle(mechanism):
        position = {label: i for i, label in enumerate(value_labels(mechanism))}  # type: ignore[arg-type]  # an oracle
        vector = np.zeros(len(position))
        for entry in body.get("estimates") or []:
            label = entry.get("label") if isinstance(entry, dict) else None
            if label not in position:
                raise SimulationError("the server's estimate names an unknown value")
            vector[position[label]] = float(entry["frequency"])
        return vector
    labels = output_labels(mechanism)
    position = {label: i for i, label in enumerate(labels)}
    vector = np.zeros(len(labels))
    estimates = body.get("estimates")
    if not isinstance(estimates, list) or len(estimates) != len(labels):
        raise SimulationError("the server's estimate does not cover the campaign's domain")
    for entry in estimates:
        label = entry.get("label") if isinstance(entry, dict) else None
        if label not in position:
            raise SimulationError("the server's estimate names an unknown label")
        vector[position[label]] = float(entry["frequency"])
    return vector


def _vector_from_counts(body: dict[str, Any], mechanism: Mechanism) -> np.ndarray:
    position = {label: i for i, label in enumerate(output_labels(mechanism))}
    vector = np.zeros(len(position))
    for entry in body.get("counts", []):
        vector[position[entry["label"]]] = entry["count"]
    return vector


def simulated_user_policy(spec: CampaignSpec) -> Policy:
    """A policy that admits the campaign: cap and budget at least its cost per report."""
    cost = Policy().cost(spec)
    return Policy(
        max_epsilon=max(DEFAULT_MAX_EPSILON, cost * 1.001),
        total_budget=max(DEFAULT_TOTAL_BUDGET, cost * 1.001),
    )


class _UserDriver:
    """Reports one simulated user at a time through a fresh :class:`client.Reporter`."""

    def __init__(
        self, url: str, spec: CampaignSpec, root: Path, timeout: float, deadline: float
    ) -> None:
        self.url = url
        self.spec = spec
        self.policy = simulated_user_policy(spec)
        self.root = root
        self.timeout = timeout
        self.deadline = deadline
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def close(self) -> None:
        for session in self._sessions:
            session.close()

    def report(self, value: Any) -> str:
        """``delivered``, ``duplicate``, or raise; retries a queued report until the deadline."""
        with tempfile.TemporaryDirectory(dir=self.root, prefix="user-") as state_dir:
            reporter = Reporter(
                self.url,
                state_dir=state_dir,
                policy=self.policy,
                session=self._session(),
                timeout=self.timeout,
            )
            delay = _RETRY_FIRST_S
            while True:
                try:
                    result = reporter.report(self.spec.id, value)
                    break
                except ServerUnavailable as exc:
                    # Not even the spec could be fetched: nothing was spent, try again.
                    if time.monotonic() + delay > self.deadline:
                        raise SimulationError(
                            f"the server stayed unavailable: {exc.message}"
                        ) from exc
                    time.sleep(delay)
                    delay = min(delay * 2, _RETRY_MAX_S)
            delay = _RETRY_FIRST_S
            detail = result.detail
            outcome = result.outcome
            while outcome == QUEUED:
                if time.monotonic() + delay > self.deadline:
                    raise SimulationError(f"a report could not be delivered in time: {detail}")
                time.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)
                flushed = reporter.flush()
                if flushed.rejected:
                    raise SimulationError(f"the server refused a report: {flushed.rejected[0]}")
                if flushed.remaining == 0:
                    outcome = (
                        DUPLICATE if flushed.duplicates and not flushed.accepted else DELIVERED
                    )
                detail = "; ".join(flushed.errors) or detail
            return outcome


def run_via_server(
    url: str,
    spec: CampaignSpec | dict[str, Any] | str,
    population: Population,
    n: int | None,
    *,
    admin_token: str | None = None,
    analyst_token: str | None = None,
    methods: Sequence[str] = ("ibu",),
    workers: int = DEFAULT_WORKERS,
    seed: int = 0,
    progress: bool | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    deadline_s: float = DEFAULT_DEADLINE_S,
    state_root: str | Path | None = None,
) -> ViaResult:
    """Fill a campaign on a running aggregator with simulated users, then score its estimates.

    Parameters
    ----------
    url : str
        The aggregator, e.g. ``http://127.0.0.1:8000``.
    spec : CampaignSpec, dict or str
        The campaign to create (or reuse if it exists with the same spec), or
        the id of an existing campaign.
    population : Population
        Over the campaign's labels or grid (:func:`runner.check_compatible`).
    n : int or None
        Number of users; ``None`` takes every row of a data-set population once.
    admin_token, analyst_token : str, optional
        Needed to create the campaign, and to fetch counts and estimates
        (without an analyst token the run reports delivery only).
    methods : sequence of str
        Server estimate methods to fetch and score.
    workers : int
        Simulated users reporting at the same time (threads).
    seed : int
        Seeds the draw of users (the noise comes from each user's client).
    progress : bool or None
        Progress bar: ``None`` on a terminal only.
    deadline_s : float
        How long reports refused for now (e.g. rate limited) are retried.
    state_root : path, optional
        Where the users' temporary state directories go (default: system temp).
    """
    if isinstance(spec, dict):
        spec = CampaignSpec.from_dict(spec)
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; the server offers {', '.join(METHODS)}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    api = ServerAPI(url, admin_token=admin_token, analyst_token=analyst_token, timeout=timeout)
    try:
        spec, created = ensure_campaign(api, spec)
        mechanism = Mechanism.from_spec(spec)
        check_compatible(population, mechanism)
        previous_n = int(api.counts(spec.id)["n"]) if analyst_token else 0

        generator = np.random.default_rng(seed)
        users = population.draw_users(n, generator)
        indices = population.indices_of(users)
        truth = np.bincount(indices, minlength=population.size) / indices.size
        values = population.client_values(users, generator, as_location=mechanism.grid is not None)
        delivered, outcomes, errors, seconds = _report_all(
            api.url, spec, values, workers, progress, timeout, deadline_s, state_root
        )
        result = ViaResult(
            url=api.url,
            campaign_id=spec.id,
            spec_hash=spec.spec_hash,
            created=created,
            n_users=len(values),
            delivered=delivered,
            duplicates=outcomes[DUPLICATE],
            failed=sum(errors.values()),
            errors=[f"{message} (x{count})" for message, count in errors.most_common(_ERRORS_KEPT)],
            seconds=seconds,
            previous_n=previous_n,
            server_n=None,
            truth=truth,
        )
        if delivered == 0:
            raise SimulationError(
                "no report was delivered: " + ("; ".join(result.errors) or "no users")
            )
        if not analyst_token:
            return result
        return _score_server(api, result, mechanism, population, indices, methods, seed)
    finally:
        api.session.close()


def _report_all(
    url: str,
    spec: CampaignSpec,
    values: list[Any],
    workers: int,
    progress: bool | None,
    timeout: float,
    deadline_s: float,
    state_root: str | Path | None,
) -> tuple[int, Counter, Counter, float]:
    started = time.monotonic()
    outcomes: Counter = Counter()
    errors: Counter = Counter()
    with tempfile.TemporaryDirectory(dir=state_root, prefix="ldp-simulate-") as root:
        driver = _UserDriver(url, spec, Path(root), timeout, started + deadline_s)
        bar = tqdm(
            total=len(values),
            desc="reporting",
            unit="user",
            disable=None if progress is None else not progress,
        )
        try:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futures = [pool.submit(driver.report, value) for value in values]
                for future in as_completed(futures):
                    try:
                        outcomes[future.result()] += 1
                    except LDPError as exc:
                        errors[getattr(exc, "message", str(exc))] += 1
                    bar.update()
        finally:
            bar.close()
            driver.close()
    delivered = outcomes[DELIVERED] + outcomes[DUPLICATE]
    return delivered, outcomes, errors, time.monotonic() - started


def _score_server(
    api: ServerAPI,
    result: ViaResult,
    mechanism: Mechanism,
    population: Population,
    indices: np.ndarray,
    methods: Sequence[str],
    seed: int,
) -> ViaResult:
    grid = population.grid
    counts = api.counts(result.campaign_id)
    report_counts = _vector_from_counts(counts, mechanism)
    estimates = {}
    if mechanism.n_outputs == mechanism.n_inputs:  # reports are values: the raw histogram
        estimates[NOISY] = report_counts / report_counts.sum()
    responses = {}
    for method in methods:
        body = api.estimate(result.campaign_id, method)
        responses[method] = body
        estimates[method] = vector_from_estimate(body, mechanism)
    scores = {method: score(result.truth, est, grid) for method, est in estimates.items()}
    # The same users through the vectorised sampler and the same estimators, for reference.
    noise = np.random.default_rng([seed, 1])
    local_counts = np.bincount(sample(mechanism, indices, noise), minlength=mechanism.n_outputs)
    runs = estimate_methods(local_counts, mechanism, (*methods, NOISY), seed=0)
    in_process = {m: score(result.truth, run.frequencies, grid) for m, run in runs.items()}
    return dataclasses.replace(
        result,
        server_n=int(counts["n"]),
        estimates=estimates,
        responses=responses,
        scores=scores,
        in_process=in_process,
    )
