"""Prometheus metrics: ``GET /metrics`` in the Prometheus text format.

What is counted (docs/aggregator.md, "Metrics", lists every metric):

* report submissions: the reports accepted and the duplicates per campaign, and
  submissions refused per campaign and reason (the error code the report
  endpoint answered, validation errors grouped as ``invalid``);
* the time each estimate took, per method, confidence level and outcome;
* Redis errors that failed a request, per node where the error names one;
* new reports a master acknowledged with fewer replicas than writes wait for
  (``LDP_ACK_REPLICAS`` unset: a master with no replica yet, after a failover);
* at scrape time, per Redis node (every node of a Redis Cluster): whether it
  answers, its memory used, its ``maxmemory`` and the store's high-water mark;
  per master its replicas, and the slots and campaign shards held by masters
  with fewer replicas than writes wait for (read at most every few seconds, see
  :class:`aggregator.storage.replication.ReplicaWatch`).

Labels stay bounded: a campaign label is only ever a campaign that was found
in the store (created by an admin), never a client's address or a report id.

A scrape needs a bearer token of the metrics role (``METRICS_TOKEN``, or the
admin token). With ``METRICS_PUBLIC`` a scrape without a token is answered
too, with :class:`OpenView`: nothing an anonymous caller may not see. The
report counts are left out (per campaign they are the analyst's ``n``, and
summed they are a lone campaign's), the other counts are summed over
campaigns and nodes, and the Redis nodes are numbered instead of named by
their address or socket path.

Under gunicorn the workers are separate processes: :func:`enable_multiprocess`
(called by :func:`aggregator.http.wsgi.run_gunicorn` before the workers start)
points prometheus_client's multiprocess mode at a fresh directory, every worker
writes its counts there, and a scrape answered by any worker sums them all.
Without it (the Flask test client, one app per test) each app counts in its own
registry, so apps never share counts.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import flask
import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from aggregator.estimation.compute import METHODS
from aggregator.http.auth import METRICS, bearer_token, check_role, grants
from aggregator.http.errors import APIError, answer_code
from aggregator.services import current_settings, get_redis_client, get_replication
from aggregator.storage.cluster import Connection, node_clients
from aggregator.storage.ingest import IngestResult
from aggregator.storage.replication import ReplicationReading
from shared.errors import ValidationError

bp = flask.Blueprint("metrics", __name__)

METRICS_EXTENSION = "ldp_metrics"
# prometheus_client reads this variable: where each process writes its counts.
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
# From a cache hit (about a millisecond) to the default time limit of a computation (30 s).
ESTIMATE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Refusals of a malformed body (not JSON, not a report), counted with the validation errors.
INVALID = "invalid"
_MALFORMED_CODES = frozenset({"invalid_json", "unsupported_media_type", "bad_request"})
# Refusals that may come before the campaign is known to exist: no campaign label then, so
# that a client cannot make up label values.
_BEFORE_CAMPAIGN_CODES = frozenset({"campaign_not_found", "storage_unavailable", "internal_error"})
NO_CAMPAIGN = ""
UNKNOWN_NODE = "unknown"
OTHER_METHOD = "other"
# "Error 111 connecting to 10.0.0.5:6379.", "Error while reading from 10.0.0.5:6379 : ...",
# "Error 2 connecting to /run/ldp/redis.sock." (redis-py's connection errors).
_NODE_IN_MESSAGE = re.compile(r"(?:connecting to|reading from|writing to) (\S+?)\.?(?:\s|$)")
_HOST_PORT = re.compile(r"\S+:\d+|/\S+")
# Left out of a scrape without a token: counts of reports (see the module docstring).
_REPORT_COUNTS = frozenset(
    {
        "ldp_reports_accepted",
        "ldp_reports_duplicate",
        "ldp_report_submissions_accepted",
        "ldp_reports_under_replicated",
    }
)
# Summed away in a scrape without a token: a campaign, and a node's address or socket path.
_PRIVATE_LABELS = frozenset({"campaign", "node"})

_View = TypeVar("_View", bound=Callable[..., Any])


def enable_multiprocess(directory: str) -> None:
    """Make this process and the processes it forks count in ``directory`` (must be fresh).

    prometheus_client picks where values live when it is first imported, from
    :data:`MULTIPROCESS_ENV`; it may have been imported already (the server
    builds one app before it forks its workers), so the choice is made again.
    """
    os.environ[MULTIPROCESS_ENV] = directory
    values.ValueClass = values.get_value_class()


class Metrics:
    """An app's counters and histogram, and the text a scrape answers.

    Parameters
    ----------
    multiprocess_dir
        The directory every worker of the server writes its counts to (see
        :func:`enable_multiprocess`); None: this app's own registry only.
    """

    def __init__(self, multiprocess_dir: str | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self.registry = CollectorRegistry()
        registry = self.registry
        self.reports_accepted = Counter(
            "ldp_reports_accepted",
            "New reports stored, per campaign.",
            ["campaign"],
            registry=registry,
        )
        self.reports_duplicate = Counter(
            "ldp_reports_duplicate",
            "Reports received again (a report id already stored): acknowledged, not counted twice.",
            ["campaign"],
            registry=registry,
        )
        self.submissions_accepted = Counter(
            "ldp_report_submissions_accepted",
            "Report submissions (one report or a batch) answered 200.",
            ["campaign"],
            registry=registry,
        )
        self.submissions_refused = Counter(
            "ldp_report_submissions_refused",
            "Report submissions refused, per campaign (empty before the campaign was found) and "
            "reason (the error code answered; validation errors are 'invalid'); a refused "
            "submission stores none of its reports.",
            ["campaign", "reason"],
            registry=registry,
        )
        self.estimate_duration = Histogram(
            "ldp_estimate_duration_seconds",
            "Time to answer an estimate, per method, confidence level and outcome "
            "(cached, computed, failed).",
            ["method", "confidence", "outcome"],
            buckets=ESTIMATE_BUCKETS_S,
            registry=registry,
        )
        self.redis_errors = Counter(
            "ldp_redis_errors",
            "Redis errors that failed a request (503 storage_unavailable), per node named by "
            "the error ('unknown' when it names none).",
            ["node"],
            registry=registry,
        )
        self.reports_under_replicated = Counter(
            "ldp_reports_under_replicated",
            "New reports acknowledged by a master with fewer replicas than writes wait for "
            "(LDP_ACK_REPLICAS unset: none yet, after a failover), per master.",
            ["node"],
            registry=registry,
        )

    @classmethod
    def for_process(cls) -> Metrics:
        """Metrics that count where this process's server counts (multiprocess or not)."""
        return cls(os.environ.get(MULTIPROCESS_ENV) or None)

    def record_ingest(self, campaign_id: str, result: IngestResult) -> None:
        """Count an accepted submission, its new reports and its duplicates."""
        self.submissions_accepted.labels(campaign_id).inc()
        if result.accepted:
            self.reports_accepted.labels(campaign_id).inc(result.accepted)
        if result.duplicates:
            self.reports_duplicate.labels(campaign_id).inc(result.duplicates)

    def record_refusal(self, campaign_id: str, error: Exception) -> None:
        """Count a submission refused with ``error`` (as the error handlers will answer it)."""
        reason = refusal_reason(error)
        campaign = NO_CAMPAIGN if reason in _BEFORE_CAMPAIGN_CODES else campaign_id
        self.submissions_refused.labels(campaign, reason).inc()

    def observe_estimate(
        self, method: str, confidence: float, outcome: str, seconds: float
    ) -> None:
        """Count one estimate's time (``outcome``: cached, computed or failed)."""
        method = method if method in METHODS else OTHER_METHOD
        self.estimate_duration.labels(method, f"{confidence:g}", outcome).observe(seconds)

    def record_redis_error(self, error: redis.RedisError) -> None:
        """Count a Redis error that failed a request, under the node it names."""
        self.redis_errors.labels(node_of_error(error)).inc()

    def record_under_replicated(self, node: str, reports: int) -> None:
        """Count new reports ``node`` acknowledged with fewer replicas than writes wait for."""
        self.reports_under_replicated.labels(node).inc(reports)

    def exposition(
        self,
        client: Connection | None,
        high_water: float,
        *,
        open_view: bool = False,
        replication: ReplicationReading | None = None,
    ) -> bytes:
        """The text a scrape answers: the counts (of every worker), each node's state and the
        masters' ``replication``; ``open_view``: what a scrape without a token gets
        (:class:`OpenView`)."""
        scrape = CollectorRegistry()
        counts: Collector = (
            self.registry
            if self.multiprocess_dir is None
            else MultiProcessCollector(None, path=self.multiprocess_dir)
        )
        scrape.register(OpenView(counts) if open_view else counts)
        if client is not None:
            scrape.register(RedisNodeCollector(client, high_water, numbered=open_view))
            if replication is not None:
                labels = node_labels(client, numbered=open_view)
                scrape.register(ReplicationCollector(replication, labels))
        return generate_latest(scrape)


def current_metrics() -> Metrics:
    """The current app's metrics."""
    return flask.current_app.extensions[METRICS_EXTENSION]


def refusal_reason(error: Exception) -> str:
    """The reason a refused submission is counted under: its error code, or ``invalid``."""
    if isinstance(error, ValidationError):
        return INVALID
    code = answer_code(error)
    return INVALID if code in _MALFORMED_CODES else code


def counted_submission(view: _View) -> _View:
    """Decorator of the report endpoint: count each refused submission by its reason.

    The view counts what it accepts (:meth:`Metrics.record_ingest`). It must
    find the campaign before anything else can refuse the submission: every
    reason but those of :data:`_BEFORE_CAMPAIGN_CODES` is labelled with the
    campaign id from the URL.
    """

    @functools.wraps(view)
    def counted(campaign_id: str) -> Any:
        try:
            return view(campaign_id)
        except Exception as error:
            current_metrics().record_refusal(campaign_id, error)
            raise

    return counted  # type: ignore[return-value]


def node_of_error(error: redis.RedisError) -> str:
    """The node (``host:port`` or a socket's path) a Redis error names, else ``unknown``."""
    host, port = getattr(error, "host", None), getattr(error, "port", None)
    if host is not None and port is not None:  # a cluster's MOVED or ASK
        return f"{host}:{port}"
    if isinstance(error, redis.ConnectionError | redis.TimeoutError):
        match = _NODE_IN_MESSAGE.search(str(error))
        if match is not None and _HOST_PORT.fullmatch(match.group(1)):
            return match.group(1)
    return UNKNOWN_NODE


class OpenView:
    """The counts of ``source`` as a scrape without a token shows them: no report counts,
    every other count summed over campaigns and nodes (``_created`` times left out)."""

    def __init__(self, source: Collector) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            if family.name in _REPORT_COUNTS:
                continue
            totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                labels = tuple(
                    sorted(
                        (name, value)
                        for name, value in sample.labels.items()
                        if name not in _PRIVATE_LABELS
                    )
                )
                key = (sample.name, labels)
                totals[key] = totals.get(key, 0.0) + sample.value
            summed = Metric(family.name, family.documentation, family.type, family.unit)
            for (name, labels), value in totals.items():
                summed.add_sample(name, dict(labels), value)
            yield summed


class RedisNodeCollector:
    """Reads every Redis node's state when scraped (``INFO memory``, one call a node).

    ``numbered``: each node is labelled by its place among the nodes sorted by
    address (``0``, ``1``, ...), not by its address or socket path.
    """

    def __init__(self, client: Connection, high_water: float, *, numbered: bool = False) -> None:
        self.client = client
        self.high_water = high_water
        self.numbered = numbered

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "ldp_redis_up",
            "Whether the Redis node answered this scrape (1) or not (0).",
            labels=["node"],
        )
        used = GaugeMetricFamily(
            "ldp_redis_memory_used_bytes", "Redis's used_memory.", labels=["node"]
        )
        limit = GaugeMetricFamily(
            "ldp_redis_memory_max_bytes", "Redis's maxmemory (0: no limit).", labels=["node"]
        )
        high_water = GaugeMetricFamily(
            "ldp_redis_memory_high_water_bytes",
            "Used memory above which new reports are refused (507 storage_full); only for a "
            "node with a maxmemory.",
            labels=["node"],
        )
        nodes = node_clients(self.client, masters_only=False)
        labels = node_labels(self.client, numbered=self.numbered)
        for name, client in nodes:
            node = labels[name]
            if client is None:
                up.add_metric([node], 0)
                continue
            try:
                info = client.info("memory")
            except redis.ResponseError:  # INFO disabled (some managed servers): it answered
                up.add_metric([node], 1)
                continue
            except redis.RedisError:
                up.add_metric([node], 0)
                continue
            up.add_metric([node], 1)
            used.add_metric([node], int(info.get("used_memory", 0)))
            maxmemory = int(info.get("maxmemory", 0))
            limit.add_metric([node], maxmemory)
            if maxmemory:
                high_water.add_metric([node], int(maxmemory * self.high_water))
        yield from (up, used, limit, high_water)


def node_labels(client: Connection, *, numbered: bool) -> dict[str, str]:
    """Each node's label (every node of a cluster): its address or socket path, or with
    ``numbered`` its place among the nodes sorted by address (``0``, ``1``, ...)."""
    names = sorted(name for name, _ in node_clients(client, masters_only=False))
    return {name: str(place) if numbered else name for place, name in enumerate(names)}


class ReplicationCollector:
    """The masters' replicas as last read (:class:`~aggregator.storage.replication.ReplicaWatch`),
    each master labelled by ``labels`` (a master missing from them is left out)."""

    def __init__(self, reading: ReplicationReading, labels: dict[str, str]) -> None:
        self.reading = reading
        self.labels = labels

    def collect(self) -> Iterator[Metric]:
        reading = self.reading
        replicas = GaugeMetricFamily(
            "ldp_redis_replicas",
            "Replicas connected to the master (INFO replication), for each master that answered.",
            labels=["node"],
        )
        for master in reading.masters:
            if master.node in self.labels:
                replicas.add_metric([self.labels[master.node]], master.replicas)
        short = reading.under_replicated
        yield replicas
        yield GaugeMetricFamily(
            "ldp_redis_replicas_wanted",
            "Replicas a write of reports waits for (LDP_ACK_REPLICAS; unset: 1 on a cluster, "
            "or as many as the master has while it has fewer).",
            value=reading.wanted,
        )
        yield GaugeMetricFamily(
            "ldp_redis_under_replicated_masters",
            "Masters with fewer replicas than writes wait for.",
            value=len(short),
        )
        yield GaugeMetricFamily(
            "ldp_redis_under_replicated_slots",
            "Cluster slots served by those masters (a single server serves all 16384).",
            value=reading.under_replicated_slots,
        )
        shards = reading.under_replicated_shards
        if shards is not None:  # left out when the campaigns could not be read
            yield GaugeMetricFamily(
                "ldp_redis_under_replicated_shards",
                "Campaign shards held by those masters.",
                value=shards,
            )


def scrape_sees_everything(public: bool) -> bool:
    """True for a token of the metrics role; False for no token where the metrics are
    ``public``; else 401, 403 or 429 as for any role (:func:`aggregator.http.auth.check_role`).

    Failed attempts are counted in Redis: when Redis cannot count them the token
    is still compared, so that a scrape answers, and shows Redis down, in an outage.
    """
    token = bearer_token()
    if token is None and public:
        return False
    try:
        check_role(METRICS)
    except redis.RedisError:
        if token is None or not grants(token, METRICS):
            raise APIError(401, "unauthorized", "the bearer token is not valid") from None
    return True


@bp.get("/metrics")
def metrics() -> flask.Response:
    """The metrics for Prometheus: all of them for a metrics or admin token; without a
    token only with ``METRICS_PUBLIC``, and then the open view."""
    settings = current_settings()
    everything = scrape_sees_everything(settings.metrics_public)
    try:
        client = get_redis_client()
    except redis.RedisError:  # the embedded Redis would not start: nodes show nothing
        client = None
    try:
        replication: ReplicationReading | None = get_replication().reading()
    except redis.RedisError:  # the store cannot be opened: no master to read
        replication = None
    body = current_metrics().exposition(
        client, settings.storage_high_water, open_view=not everything, replication=replication
    )
    return flask.Response(body, mimetype=None, content_type=TEXT_FORMAT)


def init_app(app: flask.Flask) -> Metrics:
    """Give ``app`` its metrics and ``/metrics``; returns the metrics."""
    app_metrics = app.extensions[METRICS_EXTENSION] = Metrics.for_process()
    app.register_blueprint(bp)
    return app_metrics
