"""``ldp-aggregator`` commands against a real Redis (and the embedded one in a data directory)."""

from __future__ import annotations

import json
import time

import click
import pytest
import redis
from aggregator_testdata import KRR_SPEC, PLANAR_SPEC, new_id

from aggregator.cli import describe_url, main
from aggregator.storage.ingest import StoredReport
from aggregator.storage.redis_server import EmbeddedRedis
from aggregator.storage.store import CampaignStore
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

HOSTILE_TITLE = "Fruit\x1b]0;owned\x07\x1b[2J\x9b1m\u202e"


def run(runner, redis_url, *args, **kwargs):
    return runner.invoke(main, ["--redis-url", redis_url, *args], **kwargs)


def write_spec(tmp_path, spec=KRR_SPEC):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


def test_create_list_show_close_open(runner, redis_url, tmp_path):
    created = run(runner, redis_url, "campaign", "create", write_spec(tmp_path))
    assert created.exit_code == 0, created.output
    assert json.loads(created.stdout)["spec_hash"] == CampaignSpec.from_dict(KRR_SPEC).spec_hash
    listed = run(runner, redis_url, "campaign", "list")
    assert listed.stdout.split("\t")[:4] == ["fruit", "krr", "open", "0"]
    listed_json = json.loads(run(runner, redis_url, "campaign", "list", "--json").stdout)
    assert [(c["id"], c["status"], c["n_reports"]) for c in listed_json] == [("fruit", "open", 0)]
    assert run(runner, redis_url, "campaign", "close", "fruit").exit_code == 0
    shown = json.loads(run(runner, redis_url, "campaign", "show", "fruit").stdout)
    assert shown["status"] == "closed"
    assert shown["n_reports"] == 0
    assert run(runner, redis_url, "campaign", "open", "fruit").exit_code == 0
    assert (
        json.loads(run(runner, redis_url, "campaign", "show", "fruit").stdout)["status"] == "open"
    )


def test_create_from_stdin_and_again(runner, redis_url):
    first = run(runner, redis_url, "campaign", "create", "-", input=json.dumps(KRR_SPEC))
    assert first.exit_code == 0
    again = run(runner, redis_url, "campaign", "create", "-", input=json.dumps(KRR_SPEC))
    assert again.exit_code == 0
    assert "already exists" in again.stderr


def test_create_without_a_mechanism_takes_the_advice(runner, redis_url):
    body = {"id": "age", "title": "Age", "lo": 0, "hi": 120, "epsilon": 0.5}
    created = run(runner, redis_url, "campaign", "create", "-", input=json.dumps(body))
    assert created.exit_code == 0, created.output
    wire = json.loads(created.stdout)
    assert wire["mechanism"] == "geometric"
    assert wire["advice"]["chosen"] == "geometric"
    no_domain = run(
        runner, redis_url, "campaign", "create", "-", input=json.dumps({"id": "x", "title": "X"})
    )
    assert no_domain.exit_code == 1
    assert no_domain.stderr.startswith("Error: give one domain")


def test_library_errors_become_error_lines(runner, redis_url, tmp_path):
    bad = run(
        runner, redis_url, "campaign", "create", write_spec(tmp_path, {**KRR_SPEC, "epsilon": 0})
    )
    assert bad.exit_code == 1
    assert bad.stderr.startswith("Error: epsilon must be at least 2**-63")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    not_json = run(runner, redis_url, "campaign", "create", str(broken))
    assert not_json.exit_code == 1
    assert "not valid JSON" in not_json.stderr
    missing = run(runner, redis_url, "campaign", "show", "nope")
    assert missing.exit_code == 1
    assert missing.stderr.endswith("\nError: no campaign 'nope'\n")
    down = runner.invoke(main, ["--redis-url", "redis://127.0.0.1:1/0", "campaign", "list"])
    assert down.exit_code == 1
    assert "\nError: the report store is unavailable" in down.stderr


def test_estimates_table_and_json(runner, redis_url, store, tmp_path, client, analyst):
    run(runner, redis_url, "campaign", "create", write_spec(tmp_path))
    spec = CampaignSpec.from_dict(KRR_SPEC)
    store.ingest("fruit", [StoredReport(new_id(), i % 2, spec.domain[i % 2]) for i in range(60)])
    table = run(runner, redis_url, "estimate", "fruit", "--method", "inversion")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0] == "campaign fruit  method inversion  n 60"
    assert [line.split()[0] for line in lines[-4:]] == list(spec.domain)
    as_json = json.loads(run(runner, redis_url, "estimate", "fruit", "--json").stdout)
    # The k-RR campaign's default, as the API gives it when asked for none.
    api = client.get("/api/v1/campaigns/fruit/estimate", headers=analyst).get_json()
    assert as_json["method"] == api["method"]
    assert as_json["n"] == 60
    wrong = run(runner, redis_url, "estimate", "fruit", "--method", "median")
    assert wrong.exit_code == 2
    level = run(runner, redis_url, "estimate", "fruit", "--confidence", "1")
    assert level.exit_code == 2


def test_export_writes_every_report_as_json_lines(runner, redis_url, store, tmp_path):
    run(runner, redis_url, "campaign", "create", write_spec(tmp_path))
    spec = CampaignSpec.from_dict(KRR_SPEC)
    sent = [StoredReport(new_id(), i % 4, spec.domain[i % 4]) for i in range(2500)]
    for start in range(0, 2500, 500):
        store.ingest("fruit", sent[start : start + 500])
    out = tmp_path / "reports.jsonl"
    result = run(runner, redis_url, "export", "fruit", "-o", str(out))
    assert result.exit_code == 0
    assert "2500 reports written" in result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # Oldest first: within one submission (one millisecond) the shards' order.
    assert sorted((r["report_id"], r["value"]) for r in rows) == sorted(
        (s.report_id, s.value) for s in sent
    )
    times = [r["received_at"] for r in rows]
    assert times == sorted(times)
    to_stdout = run(runner, redis_url, "export", "fruit")
    assert len(to_stdout.stdout.splitlines()) == 2500


def test_embedded_store_in_a_data_directory(runner, tmp_path):
    data = tmp_path / "data"
    with EmbeddedRedis(data):  # what serve leaves behind
        pass
    args = ["--data-dir", str(data)]
    created = runner.invoke(main, [*args, "campaign", "create", write_spec(tmp_path)])
    assert created.exit_code == 0, created.output
    assert created.stderr == f"Store: embedded Redis in {data}\n"
    # The command stopped the server it started; the next one finds the campaign on disk.
    assert not EmbeddedRedis(data).is_running()
    listed = runner.invoke(main, [*args, "campaign", "list"])
    assert listed.stdout.startswith("fruit\tkrr\topen")


def test_admin_commands_do_not_create_a_store(runner, tmp_path, monkeypatch):
    monkeypatch.delenv("LDP_REDIS_URL", raising=False)
    monkeypatch.delenv("LDP_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    for command in (["campaign", "list"], ["campaign", "show", "fruit"], ["estimate", "fruit"]):
        result = runner.invoke(main, command)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith(f"Error: no report store in {tmp_path / '.ldp-data'}: ")
        assert "--data-dir" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(main, ["--data-dir", str(empty), "campaign", "list"])
    assert result.exit_code == 1
    assert f"no report store in {empty}" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]
    assert list(empty.iterdir()) == []


def test_commands_say_which_store_they_use(runner, redis_url):
    listed = run(runner, redis_url, "campaign", "list")
    assert listed.exit_code == 0
    assert listed.stderr == f"Store: {redis_url}\n"
    hidden = describe_url("redis://:hunter2@db.example:6380/1")
    assert hidden == "redis://:***@db.example:6380/1"


def test_retention_trims_old_raw_reports_and_keeps_counts(runner, redis_url, store, tmp_path):
    assert run(runner, redis_url, "campaign", "create", write_spec(tmp_path)).exit_code == 0
    spec = CampaignSpec.from_dict(KRR_SPEC)
    store.ingest("fruit", [StoredReport(new_id(), 0, spec.domain[0]) for _ in range(5)])
    kept = run(runner, redis_url, "retention", "--days", "1")
    assert kept.exit_code == 0, kept.output
    assert kept.stdout == "fruit\t0 raw reports removed\n"
    # Stream ids are milliseconds: once one has passed, a retention far below it drops
    # every report, and the counts stay.
    time.sleep(0.01)
    trimmed = run(runner, redis_url, "retention", "--days", "1e-12")
    assert trimmed.stdout == "fruit\t5 raw reports removed\n"
    assert list(store.iter_reports("fruit")) == []
    assert store.counts("fruit") == {0: 5}
    assert run(runner, redis_url, "retention", "--days", "0").exit_code == 2


def test_enrollment_issue_prints_single_use_tokens(runner, redis_url, store, tmp_path):
    spec_path = write_spec(tmp_path, {**KRR_SPEC, "enrollment_required": True})
    assert run(runner, redis_url, "campaign", "create", spec_path).exit_code == 0
    issued = run(runner, redis_url, "enrollment", "issue", "fruit", "--count", "3")
    assert issued.exit_code == 0, issued.output
    tokens = issued.stdout.split()
    assert len(tokens) == len(set(tokens)) == 3
    assert store.unused_enrollment_tokens("fruit") == 3
    assert "3 issued; 3 unused in all" in issued.stderr


def test_enrollment_issue_refuses_open_campaigns(runner, redis_url, tmp_path):
    assert run(runner, redis_url, "campaign", "create", write_spec(tmp_path)).exit_code == 0
    refused = run(runner, redis_url, "enrollment", "issue", "fruit")
    assert refused.exit_code == 1
    assert "does not require enrollment" in refused.stderr


def test_titles_and_labels_print_with_their_control_characters_escaped(
    runner, redis_url, store, tmp_path
):
    labels = ["apple\x1b[31m", "banana", "cherry", "damson"]
    spec_path = write_spec(tmp_path, {**KRR_SPEC, "title": HOSTILE_TITLE, "domain": labels})
    created = run(runner, redis_url, "campaign", "create", spec_path)
    listed = run(runner, redis_url, "campaign", "list")
    shown = run(runner, redis_url, "campaign", "show", "fruit")
    store.ingest("fruit", [StoredReport(new_id(), 0, labels[0]) for _ in range(5)])
    table = run(runner, redis_url, "estimate", "fruit")
    for result in (created, listed, shown, table):
        assert result.exit_code == 0, result.output
        assert not {"\x1b", "\x07", "\x9b", "\u202e"} & set(result.output)
    assert listed.stdout.split("\t")[-1] == "Fruit\\x1b]0;owned\\x07\\x1b[2J\\x9b1m\\u202e\n"
    # The JSON still parses to the title as it is.
    assert json.loads(created.stdout)["title"] == json.loads(shown.stdout)["title"] == HOSTILE_TITLE
    assert "apple\\x1b[31m" in table.stdout


def every_command(group, path=()):
    for name, command in group.commands.items():
        yield [*path, name]
        if isinstance(command, click.Group):
            yield from every_command(command, (*path, name))


def test_version_and_short_help_on_every_command(runner):
    version = runner.invoke(main, ["--version"])
    assert version.exit_code == 0
    assert version.stdout.startswith("ldp-aggregator, version ")
    commands = [[], *every_command(main)]
    assert ["campaign", "list"] in commands
    for command in commands:
        result = runner.invoke(main, [*command, "-h"])
        assert result.exit_code == 0, (command, result.output)
        assert result.stdout.startswith(f"Usage: main {' '.join(command)}".rstrip())


def test_serve_takes_the_data_directory_after_the_command(runner, tmp_path, monkeypatch):
    import aggregator.http.wsgi

    assert "--data-dir" in runner.invoke(main, ["serve", "-h"]).stdout
    served = {}
    monkeypatch.setattr(
        aggregator.http.wsgi, "run_gunicorn", lambda **options: served.update(options)
    )
    monkeypatch.delenv("LDP_DATA_DIR", raising=False)
    monkeypatch.setenv("LDP_REDIS_URL", "")  # serve sets it for its workers
    monkeypatch.setenv("LDP_ADMIN_TOKEN", "admin-" + "a" * 40)
    monkeypatch.setenv("LDP_ANALYST_TOKEN", "analyst-" + "b" * 40)
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "served"
    result = runner.invoke(main, ["serve", "--data-dir", str(data), "--port", "8123"])
    assert result.exit_code == 0, result.output
    assert served["port"] == 8123
    assert result.stderr.startswith(f"Store: embedded Redis in {data}\n")
    assert (data / "appendonly.aof").exists()
    assert not (tmp_path / ".ldp-data").exists()


@pytest.fixture
def planar_estimate(runner, redis_url, store, tmp_path):
    created = run(runner, redis_url, "campaign", "create", write_spec(tmp_path, PLANAR_SPEC))
    assert created.exit_code == 0
    spec = CampaignSpec.from_dict(PLANAR_SPEC)
    mechanism = Mechanism.from_spec(spec)
    # Reports in three cells, most in the last one: share order is not cell order.
    cells = [spec.grid.n_cells - 1] * 30 + [0] * 20 + [5] * 10
    store.ingest("where", [StoredReport(new_id(), y, mechanism.report_value(y)) for y in cells])
    return spec, mechanism


def table_rows(output):
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("cell ")) + 1
    return [line.split() for line in lines[start:]]


def test_planar_estimate_shows_the_top_cells_with_their_centres(runner, redis_url, planar_estimate):
    spec, mechanism = planar_estimate
    assert spec.grid.n_cells > 20
    table = run(runner, redis_url, "estimate", "where", "--method", "inversion")
    assert table.exit_code == 0, table.output
    assert f"the 20 of {spec.grid.n_cells} cells with the largest estimated share" in table.stdout
    rows = table_rows(table.stdout)
    assert len(rows) == 20
    shares = [float(row[3]) for row in rows]
    assert shares == sorted(shares, reverse=True)
    last = spec.grid.n_cells - 1
    row, col = divmod(last, spec.grid.cols)
    centre = mechanism.report_value(last)
    assert rows[0][:3] == [f"r{row}c{col}", f"{centre['lat']:.5f}", f"{centre['lon']:.5f}"]
    every = table_rows(run(runner, redis_url, "estimate", "where", "--all").stdout)
    assert len(every) == spec.grid.n_cells
    assert len(table_rows(run(runner, redis_url, "estimate", "where", "--top", "3").stdout)) == 3


def test_categorical_estimate_keeps_label_order_unless_asked_for_the_top(
    runner, redis_url, store, tmp_path
):
    run(runner, redis_url, "campaign", "create", write_spec(tmp_path))
    spec = CampaignSpec.from_dict(KRR_SPEC)
    store.ingest("fruit", [StoredReport(new_id(), 3, spec.domain[3]) for _ in range(40)])
    table = run(runner, redis_url, "estimate", "fruit", "--method", "inversion")
    assert [line.split()[0] for line in table.stdout.splitlines()[-4:]] == list(spec.domain)
    top = run(runner, redis_url, "estimate", "fruit", "--method", "inversion", "--top", "1")
    assert top.stdout.splitlines()[-1].split()[0] == spec.domain[3]


def test_export_of_raw_reports_says_when_none_are_kept(runner, redis_url, tmp_path):
    run(runner, redis_url, "campaign", "create", write_spec(tmp_path))
    counts_only = CampaignStore(redis.Redis.from_url(redis_url))
    spec = CampaignSpec.from_dict(KRR_SPEC)
    counts_only.ingest("fruit", [StoredReport(new_id(), 1, spec.domain[1])])
    refused = run(runner, redis_url, "export", "fruit")
    assert refused.exit_code == 1
    assert "keeps counts only (LDP_RAW_REPORTS=off)" in refused.stderr
    counts = json.loads(run(runner, redis_url, "export", "fruit", "--data", "counts").stdout)
    assert counts["n"] == 1


@pytest.mark.parametrize("method", ["inversion", None])
def test_estimate_prints_the_headline_and_every_warning_the_api_returns(
    runner, redis_url, store, tmp_path, client, analyst, method
):
    # Few reports: the estimate warns (intervals from so few reports, shares out of [0, 1]).
    run(runner, redis_url, "campaign", "create", write_spec(tmp_path))
    spec = CampaignSpec.from_dict(KRR_SPEC)
    store.ingest("fruit", [StoredReport(new_id(), y, spec.domain[y]) for y in (0, 0, 1)])
    query = "" if method is None else f"?method={method}"
    api = client.get(f"/api/v1/campaigns/fruit/estimate{query}", headers=analyst).get_json()
    assert api["warnings"]
    asked = [] if method is None else ["--method", method]
    table = run(runner, redis_url, "estimate", "fruit", *asked)
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert [line for line in lines if line.startswith("warning: ")] == [
        f"warning: {text}" for text in api["warnings"]
    ]
    # The method that ran (the campaign's default when none is asked for), then its headline.
    assert lines[0] == f"campaign fruit  method {api['method']}  n 3"
    assert lines[1] == f"estimator {api['estimator']}"
    assert not any(line.startswith(("detail ", "interval method: ")) for line in lines)


def test_estimate_details_on_request(runner, redis_url, store, tmp_path, client, analyst):
    run(runner, redis_url, "campaign", "create", write_spec(tmp_path))
    spec = CampaignSpec.from_dict(KRR_SPEC)
    store.ingest("fruit", [StoredReport(new_id(), i % 4, spec.domain[i % 4]) for i in range(40)])
    api = client.get("/api/v1/campaigns/fruit/estimate?method=ibu", headers=analyst).get_json()
    shown = run(runner, redis_url, "estimate", "fruit", "--method", "ibu", "--details")
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert f"interval method: {api['interval_method']}" in lines
    details = api.get("details", {})
    for key, value in details.items():
        assert f"detail {key}: {value if isinstance(value, str) else json.dumps(value)}" in lines
