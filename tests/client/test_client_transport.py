"""HTTP details against real sockets on loopback: timeouts, refused connections, big answers."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from support import free_port

from client import ServerRejected, ServerUnavailable, UntrustedSpec
from client.transport import (
    AggregatorAPI,
    check_campaign_id,
    normalize_server_url,
    parse_retry_after,
)
from shared.errors import ValidationError


@pytest.fixture
def session():
    with requests.Session() as s:
        yield s


@pytest.fixture
def silent_server():
    """Accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


@pytest.fixture
def http_server():
    """A real HTTP server whose answer each test sets: (status, headers, body bytes)."""
    answer = {"value": (200, {}, b"{}")}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status, headers, body = answer["value"]
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", answer
    server.shutdown()
    server.server_close()


def test_every_request_times_out(silent_server, session):
    api = AggregatorAPI(silent_server, session, timeout=0.3)
    start = time.monotonic()
    with pytest.raises(ServerUnavailable, match="did not answer in time"):
        api.get_campaign("fruit")
    with pytest.raises(ServerUnavailable):
        api.post_reports("fruit", [{"report_id": "x", "value": "a"}])
    assert time.monotonic() - start < 3


def test_a_refused_connection_is_unavailable(session):
    api = AggregatorAPI(f"http://127.0.0.1:{free_port()}", session, timeout=1)
    with pytest.raises(ServerUnavailable, match="cannot reach"):
        api.get_campaign("fruit")


def test_an_oversized_answer_is_refused(http_server, session):
    url, answer = http_server
    answer["value"] = (200, {}, b" " * 5000)
    api = AggregatorAPI(url, session, timeout=2, max_response_bytes=1000)
    with pytest.raises(ServerUnavailable, match="larger than"):
        api.get_campaign("fruit")


def test_redirects_are_not_followed(http_server, session):
    url, answer = http_server
    answer["value"] = (302, {"Location": "http://elsewhere.test/"}, b"")
    with pytest.raises(ServerRejected, match="redirected"):
        AggregatorAPI(url, session, timeout=2).get_campaign("fruit")


def test_server_errors_keep_their_code_and_field(http_server, session):
    url, answer = http_server
    error = {"error": {"code": "spec_mismatch", "message": "other\x1bspec", "field": "spec_hash"}}
    answer["value"] = (409, {"Content-Type": "application/json"}, json.dumps(error).encode())
    with pytest.raises(ServerRejected) as info:
        AggregatorAPI(url, session, timeout=2).post_reports("fruit", [{"report_id": "x"}])
    assert (info.value.code, info.value.field, info.value.status) == (
        "spec_mismatch",
        "spec_hash",
        409,
    )
    assert "\x1b" not in info.value.message


def test_an_unreadable_acknowledgement_is_retried(http_server, session):
    url, answer = http_server
    answer["value"] = (200, {}, b"ok")
    with pytest.raises(ServerUnavailable, match="acknowledgement"):
        AggregatorAPI(url, session, timeout=2).post_reports("fruit", [{"report_id": "x"}])


def test_a_spec_without_a_hash_is_untrusted(http_server, session):
    url, answer = http_server
    spec = {"id": "fruit", "title": "t", "mechanism": "rr", "epsilon": 1.0, "status": "open"}
    answer["value"] = (200, {}, json.dumps(spec).encode())
    with pytest.raises(UntrustedSpec, match="spec_hash"):
        AggregatorAPI(url, session, timeout=2).get_campaign("fruit")


def test_retry_after():
    assert parse_retry_after("120", 0) == 120
    assert parse_retry_after("Thu, 01 Jan 1970 00:01:40 GMT", 40.0) == 60
    assert parse_retry_after("soon", 0) is None
    assert parse_retry_after("1e300", 0) == 24 * 3600


@pytest.mark.parametrize("url", ["ftp://x", "localhost:8000", "http://", "http://h/?q=1"])
def test_server_urls_are_checked(url):
    with pytest.raises(ValueError):
        normalize_server_url(url)


def test_server_urls_are_normalized():
    assert normalize_server_url(" https://h:1/p/ ") == "https://h:1/p"


@pytest.mark.parametrize("campaign_id", ["fruit\n", "fruit\r\n", "fruit/x", ""])
def test_campaign_ids_are_checked_whole(campaign_id):
    with pytest.raises(ValidationError):
        check_campaign_id(campaign_id)
    assert check_campaign_id("fruit") == "fruit"
