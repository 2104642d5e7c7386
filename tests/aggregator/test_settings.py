"""The settings object: typed fields read once, bad values refused naming their variable."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aggregator_testdata import ADMIN_TOKEN, ANALYST_TOKEN
from support import free_port, server_env

from aggregator.app import create_app
from aggregator.cli import main
from aggregator.services import SETTINGS_EXTENSION
from aggregator.settings import DAY_S, Settings, SettingsError, setting_rows
from aggregator.storage.redis_server import parse_memory_size

ROOT = Path(__file__).resolve().parents[2]


def _render_settings_script():
    spec = importlib.util.spec_from_file_location(
        "render_settings", ROOT / "scripts" / "render_settings.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_defaults_are_valid_settings():
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.retention_days is None and settings.retention_s is None
    assert settings.cors_origins == "*"
    assert settings.estimate_max_work == 10**9


def test_values_from_the_environment_get_their_types():
    settings = Settings.from_env(
        {
            "LDP_MAX_BATCH": "50",
            "LDP_STORAGE_HIGH_WATER": "0.5",
            "LDP_RATELIMIT_ENABLED": "false",
            "LDP_SESSION_COOKIE_SECURE": "1",
            "LDP_RATELIMIT_REPORTS": '"100 per minute"',  # JSON-quoted, as documented
            "LDP_REPORT_BUDGET": "20/hour",
            "LDP_CORS_ORIGINS": '["https://a.example", "https://b.example"]',
            "LDP_REDIS_MAXMEMORY": "512mb",
            "LDP_ESTIMATE_MAX_WORK": "null",
            "LDP_ESTIMATE_TIMEOUT_S": "2.5",
            "LDP_RETENTION_DAYS": "1.5",
            "LDP_SECRET_KEY": "12345678901234567890",  # digits stay text
            "LDP_REDIS_URL": "",
            "LDP_SERVER_URL": "http://elsewhere",  # the client's: not read
        }
    )
    assert settings.max_batch == 50
    assert settings.storage_high_water == 0.5
    assert settings.ratelimit_enabled is False
    assert settings.session_cookie_secure is True
    assert settings.ratelimit_reports == "100 per minute"
    assert settings.report_budget == "20/hour"
    assert settings.cors_origins == ("https://a.example", "https://b.example")
    assert settings.redis_maxmemory == 512 * 2**20
    assert settings.estimate_max_work is None
    assert settings.estimate_timeout_s == 2.5
    assert settings.retention_s == 1.5 * DAY_S
    assert settings.secret_key == "12345678901234567890"
    assert settings.redis_url is None


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LDP_RETENTION_DAYS", "abc"),
        ("LDP_RETENTION_DAYS", "-1"),
        ("LDP_RETENTION_DAYS", "nan"),
        ("LDP_STORAGE_HIGH_WATER", "1.5"),
        ("LDP_STORAGE_HIGH_WATER", "0"),
        ("LDP_STORAGE_CHECK_INTERVAL_S", "inf"),
        ("LDP_MAX_BATCH", "0"),
        ("LDP_MAX_BATCH", "1.5"),
        ("LDP_MAX_CONTENT_LENGTH", "lots"),
        ("LDP_CAMPAIGN_MAX_REPORTS", "-1"),
        ("LDP_REPORT_ID_TTL_S", "null"),
        ("LDP_REDIS_MAXMEMORY", "lots"),
        ("LDP_REDIS_FSYNC", "sometimes"),
        ("LDP_RATELIMIT_REPORTS", "often"),
        ("LDP_RATELIMIT_PUBLIC", "0 per minute"),
        ("LDP_RATELIMIT_ENABLED", "maybe"),
        ("LDP_SESSION_COOKIE_SECURE", "2"),
        ("LDP_SESSION_COOKIE_SAMESITE", "None"),
        ("LDP_CORS_ORIGINS", "[1, 2]"),
        ("LDP_CORS_ORIGINS", "[not json"),
        ("LDP_TRUSTED_PROXIES", "one"),
        ("LDP_ESTIMATE_TIMEOUT_S", "0"),
        ("LDP_DASHBOARD_SESSION_TTL_S", "0"),
        ("LDP_PORT", "70000"),
        ("LDP_WORKERS", "0"),
        ("LDP_DATA_DIR", ""),
        ("LDP_REDIS_URL", "localhost:6379"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_the_value(variable, value):
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({variable: value})
    assert refused.value.env_var == variable
    assert str(refused.value).startswith(f"{variable} must be ")
    assert str(refused.value).endswith(f", got {value!r}")


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("TRUSTED_PROXIES", True),
        ("MAX_BATCH", 2.0),
        ("ESTIMATE_MAX_WORK", 0),
        ("STORAGE_HIGH_WATER", float("nan")),
        ("CORS_ORIGINS", ["*"]),
        ("RETENTION_DAYS", True),
        ("ADMIN_TOKEN", 1234),
    ],
)
def test_a_bad_value_in_a_mapping_is_refused(setting, value):
    with pytest.raises(SettingsError, match=f"^LDP_{setting} must be "):
        Settings.from_mapping({setting: value})


@pytest.mark.parametrize(
    ("days", "seconds"),
    [(None, None), ("", None), (0, None), (30, 30 * DAY_S), ("1.5", 1.5 * DAY_S)],
)
def test_retention_days(days, seconds):
    assert Settings.from_mapping({"RETENTION_DAYS": days}).retention_s == seconds


def test_the_basemap_is_off_by_default():
    settings = Settings.from_env({})
    assert settings.map_tiles_url is None and settings.map_tiles_attribution is None


@pytest.mark.parametrize(
    "url",
    [
        "https://tile.example/{z}/{x}/{y}.png",
        "http://127.0.0.1:8080/tiles/{z}/{x}/{y}.png",
        "https://{s}.tile.example/{z}/{x}/{y}{r}.png",
        "https://tile.example/{z}/{x}/{-y}.png?key=abc",
    ],
)
def test_a_tile_url_template_is_taken(url):
    settings = Settings.from_env({"LDP_MAP_TILES_URL": url, "LDP_MAP_TILES_ATTRIBUTION": "© OSM"})
    assert (settings.map_tiles_url, settings.map_tiles_attribution) == (url, "© OSM")


@pytest.mark.parametrize(
    "url",
    [
        "tile.example/{z}/{x}/{y}.png",  # no scheme
        "ftp://tile.example/{z}/{x}/{y}.png",
        "https:///{z}/{x}/{y}.png",  # no host
        "https://tile.example/{z}/{x}.png",  # no {y}
        "https://tile.example/tiles.png",
        "https://tile.example/{z}/{x}/{y}/{apikey}.png",  # Leaflet cannot fill it
        "https://a.{s}.tile.example/{z}/{x}/{y}.png",  # {s} not the first label
        "https://tile.example/{z}/{x}/{y}.png; script-src *",  # would widen the CSP
    ],
)
def test_a_bad_tile_url_is_refused_naming_its_variable(url):
    with pytest.raises(SettingsError, match=r"^LDP_MAP_TILES_URL must be an http"):
        Settings.from_env({"LDP_MAP_TILES_URL": url})


def test_a_mapping_takes_flask_keys_and_refuses_unknown_names():
    settings = Settings.from_mapping({"MAX_BATCH": 5, "TESTING": True, "SECRET_KEY": "k" * 40})
    assert settings.max_batch == 5
    with pytest.raises(SettingsError, match="'MAX_BATCHES' is not a setting"):
        Settings.from_mapping({"MAX_BATCHES": 5})


def test_no_token_is_ever_shown():
    secret = "s3cret-" + "x" * 40
    settings = Settings(admin_token=secret, analyst_token=secret + "2", secret_key=secret)
    assert secret not in repr(settings)
    with pytest.raises(SettingsError) as refused:
        Settings.from_mapping({"ANALYST_TOKEN": 12345})
    assert "12345" not in str(refused.value)
    with pytest.raises(SettingsError, match=r"^LDP_ADMIN_TOKEN is shorter") as weak:
        Settings.from_env({"LDP_ADMIN_TOKEN": "tiny-token"})
    assert "tiny-token" not in str(weak.value)
    assert Settings.from_env(
        {"LDP_ADMIN_TOKEN": "tiny-token", "LDP_ALLOW_WEAK_TOKENS": "yes"}
    ).allow_weak_tokens


def test_replace_checks_the_new_values():
    settings = Settings()
    assert settings.replace(redis_maxmemory="1gb").redis_maxmemory == parse_memory_size("1gb")
    with pytest.raises(SettingsError, match="LDP_PORT"):
        settings.replace(port=-1)


def test_a_bad_environment_stops_the_app_factory(monkeypatch, redis_url):
    # It used to build, and then every request that opened the store was a 500.
    monkeypatch.setenv("LDP_REDIS_URL", redis_url)
    monkeypatch.setenv("LDP_RETENTION_DAYS", "abc")
    with pytest.raises(SettingsError, match=r"LDP_RETENTION_DAYS must be .*, got 'abc'"):
        create_app()


def test_the_app_reads_its_typed_settings(config):
    app = create_app({**config, "STORAGE_HIGH_WATER": "0.5", "TESTING": True})
    settings = app.extensions[SETTINGS_EXTENSION]
    assert settings.storage_high_water == 0.5
    assert app.config["STORAGE_HIGH_WATER"] == 0.5
    assert app.config["TESTING"] is True
    assert create_app(settings).extensions[SETTINGS_EXTENSION] is settings


def _serve(tmp_path: Path, **variables: str) -> subprocess.CompletedProcess:
    env = server_env(tmp_path / "data", variables)
    command = [sys.executable, "-m", "aggregator.cli", "serve", "--port", str(free_port())]
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )


def test_serve_with_a_bad_setting_exits_2_before_it_starts_anything(tmp_path):
    served = _serve(
        tmp_path,
        LDP_ADMIN_TOKEN=ADMIN_TOKEN,
        LDP_ANALYST_TOKEN=ANALYST_TOKEN,
        LDP_RETENTION_DAYS="abc",
    )
    assert served.returncode == 2, served.stderr
    assert served.stderr == (
        "Error: LDP_RETENTION_DAYS must be a finite number of days >= 0, got 'abc'\n"
    )
    assert not (tmp_path / "data").exists()  # no Redis was started


def test_serve_hands_its_redis_url_to_the_workers_in_the_settings(runner, tmp_path, monkeypatch):
    import aggregator.http.wsgi

    served = {}
    monkeypatch.setattr(
        aggregator.http.wsgi, "run_gunicorn", lambda **options: served.update(options)
    )
    for name in [name for name in os.environ if name.startswith("LDP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LDP_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("LDP_WORKERS", "3")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, ["serve", "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 0, result.output
    assert "LDP_REDIS_URL" not in os.environ
    assert served["workers"] == 3
    worker_app = served["app_factory"]()
    settings = worker_app.extensions[SETTINGS_EXTENSION]
    assert settings.redis_url == f"unix://{(tmp_path / 'data' / 'redis.sock').resolve()}"
    assert settings.admin_token == ADMIN_TOKEN


def test_the_cli_estimate_reads_its_limits_as_the_server_does(
    runner, redis_url, krr_campaign, monkeypatch
):
    args = ["--redis-url", redis_url, "estimate", "fruit", "--json"]
    monkeypatch.setenv("LDP_ESTIMATE_MAX_WORK", "null")  # no cap, as on the server
    uncapped = runner.invoke(main, args)
    assert uncapped.exit_code == 0, uncapped.output
    monkeypatch.setenv("LDP_ESTIMATE_TIMEOUT_S", "soon")
    refused = runner.invoke(main, args)
    assert refused.exit_code == 2
    assert "LDP_ESTIMATE_TIMEOUT_S must be a finite number of seconds > 0 or null, got 'soon'" in (
        refused.stderr
    )


def test_the_admin_commands_check_the_store_settings_they_read(runner, monkeypatch):
    monkeypatch.setenv("LDP_REDIS_URL", "localhost:6379")
    refused = runner.invoke(main, ["campaign", "list"])
    assert refused.exit_code == 2
    assert "LDP_REDIS_URL must be a redis://, rediss:// or unix:// URL" in refused.stderr


def test_every_setting_has_a_variable_a_type_and_a_description():
    rows = setting_rows()
    assert len(rows) == len(dataclasses.fields(Settings))
    for row in rows:
        assert row["env"] == "LDP_" + row["name"].upper()
        assert row["type"] and row["description"]
    assert "LDP_RETENTION_DAYS" in {row["env"] for row in rows}


def test_the_settings_table_in_the_docs_is_the_rendered_one():
    script = _render_settings_script()
    doc = (ROOT / "docs" / "aggregator.md").read_text(encoding="utf-8")
    assert script.doc_table(doc) == script.render_table()
    assert "| `RETENTION_DAYS` | `LDP_RETENTION_DAYS` |" in script.render_table()


def test_the_render_script_rewrites_a_stale_table(tmp_path):
    script = _render_settings_script()
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Doc\n\n{script.START}\n| stale |\n{script.END}\n\nafter\n")
    assert script.main(["--check", "--doc", str(doc)]) == 1
    assert script.main(["--doc", str(doc)]) == 0
    assert script.main(["--check", "--doc", str(doc)]) == 0
    assert doc.read_text().endswith(f"{script.END}\n\nafter\n")
