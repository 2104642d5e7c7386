"""The bare baseline of the ingestion benchmark: Flask + one Lua call per request, no validation.

``scripts/bench_ingest.py`` runs this app under gunicorn with the same worker
setup as ``ldp-aggregator serve`` and compares our server against it. Each
request's JSON body is parsed and its ``report_id`` and ``value`` go, unchecked,
into one Lua call that does what the real ingestion script does at its core:
dedupe the id (``SET NX EX``), count the value (``HINCRBY``), append the report
to a stream (``XADD``). Nothing else: no campaign lookup, no validation, no rate
limit. A batch body ``{"reports": [...]}`` is one Lua call for all its reports.

The Redis to use is read from ``BENCH_REDIS_URL`` when gunicorn builds the app
(``create_bare_app()``), never at import.
"""

from __future__ import annotations

import os

import flask
import redis

# KEYS[1] counts, KEYS[2] stream, KEYS[3..] seen keys; ARGV[1] ttl, then id, value per report.
BARE_LUA = """
local accepted = 0
for i = 3, #KEYS do
  local base = 2 + (i - 3) * 2
  if redis.call('SET', KEYS[i], '1', 'NX', 'EX', ARGV[1]) then
    redis.call('HINCRBY', KEYS[1], ARGV[base + 1], 1)
    redis.call('XADD', KEYS[2], '*', 'report_id', ARGV[base], 'value', ARGV[base + 1])
    accepted = accepted + 1
  end
end
return accepted
"""
TTL_S = 90 * 24 * 3600


def bare_ingest(script, campaign_id: str, reports: list[dict]) -> int:
    """One Lua call for ``reports`` (dicts with ``report_id`` and ``value``); returns accepted."""
    keys = [f"bare:{{c:{campaign_id}}}:counts", f"bare:{{c:{campaign_id}}}:reports"]
    args: list = [TTL_S]
    for report in reports:
        keys.append(f"bare:{{c:{campaign_id}}}:seen:{report['report_id']}")
        args.extend((report["report_id"], report["value"]))
    return int(script(keys=keys, args=args))


def create_bare_app(redis_url: str | None = None) -> flask.Flask:
    """The baseline app; ``redis_url`` defaults to ``BENCH_REDIS_URL``."""
    app = flask.Flask(__name__)
    connection = redis.Redis.from_url(redis_url or os.environ["BENCH_REDIS_URL"])
    script = connection.register_script(BARE_LUA)

    @app.post("/api/v1/campaigns/<campaign_id>/reports")
    def submit(campaign_id: str) -> flask.Response:
        body = flask.request.get_json()
        reports = body.get("reports", [body])
        accepted = bare_ingest(script, campaign_id, reports)
        return flask.jsonify({"accepted": accepted, "duplicates": len(reports) - accepted})

    return app


def main() -> None:
    """Serve the baseline under gunicorn with the worker setup of ``ldp-aggregator serve``."""
    import argparse
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from aggregator.http.wsgi import run_gunicorn

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.environ["BENCH_REDIS_URL"] = args.redis_url
    run_gunicorn(host=args.host, port=args.port, workers=args.workers, app_factory=create_bare_app)


if __name__ == "__main__":
    main()
