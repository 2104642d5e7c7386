"""The state directory: permissions, atomic writes, damage detection, locking across processes."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from client import StateError
from client.state import (
    LOCK_FILE,
    SECRET_FILE,
    STATE_FILE,
    CampaignRecord,
    PeriodReport,
    StateStore,
)

ROOT = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_are_private(tmp_path):
    store = StateStore(tmp_path / "a" / "state")
    store.secret()
    with store.transaction() as state:
        state.forgotten_spent = 1.0
    assert mode(store.directory) == 0o700
    for name in (SECRET_FILE, STATE_FILE, LOCK_FILE):
        assert mode(store.directory / name) == 0o600
    assert sorted(p.name for p in store.directory.iterdir()) == [LOCK_FILE, SECRET_FILE, STATE_FILE]


def test_a_directory_others_can_read_is_tightened(tmp_path):
    directory = tmp_path / "loose"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    StateStore(directory).read()
    assert mode(directory) == 0o700


def test_the_secret_is_created_once(tmp_path):
    first = StateStore(tmp_path).secret()
    assert len(first) == 32
    assert StateStore(tmp_path).secret() == first


def test_a_damaged_secret_is_never_replaced(tmp_path):
    (tmp_path / SECRET_FILE).write_bytes(b"truncated")
    with pytest.raises(StateError, match="damaged"):
        StateStore(tmp_path).secret()
    assert (tmp_path / SECRET_FILE).read_bytes() == b"truncated"


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"version": 99}', b'{"version": 1, "campaigns": {"x": {}}}'],
)
def test_a_damaged_state_is_reported_not_overwritten(tmp_path, content):
    (tmp_path / STATE_FILE).write_bytes(content)
    store = StateStore(tmp_path)
    with pytest.raises(StateError, match="damaged"):
        store.read()
    with pytest.raises(StateError), store.transaction():
        pass
    assert (tmp_path / STATE_FILE).read_bytes() == content


def test_a_failed_transaction_writes_nothing(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as state:
        state.forgotten_spent = 2.0
    before = (tmp_path / STATE_FILE).read_bytes()
    with pytest.raises(RuntimeError), store.transaction() as state:
        state.forgotten_spent = 5.0
        raise RuntimeError("refused")
    assert (tmp_path / STATE_FILE).read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_round_trip(tmp_path):
    store = StateStore(tmp_path)
    with store.transaction() as state:
        state.campaigns["c@s"] = CampaignRecord(
            server="s",
            campaign_id="c",
            spec={"id": "c"},
            spec_hash="h",
            pinned_at=1.5,
            charges={"t1": 0.5, "t2": 0.25},
        )
        state.campaigns["c@s"].period_report = PeriodReport(
            period="2025-W03", tag="t1", payload={"report_id": "r", "value": "noisy"}
        )
    loaded = store.read()
    assert loaded.campaigns["c@s"].spent == 0.75 and loaded.total_spent == 0.75
    assert loaded.campaigns["c@s"].period_report == PeriodReport(
        period="2025-W03", tag="t1", payload={"report_id": "r", "value": "noisy"}
    )
    assert json.loads((tmp_path / STATE_FILE).read_text())["version"] == 1


def test_state_written_before_periods_still_loads(tmp_path):
    record = {
        "server": "s",
        "campaign_id": "c",
        "spec": {"id": "c"},
        "spec_hash": "h",
        "pinned_at": 1.5,
        "charges": {"t1": 0.5},
    }
    document = {"version": 1, "campaigns": {"c@s": record}, "queue": [], "rejected": []}
    (tmp_path / STATE_FILE).write_text(json.dumps(document))
    loaded = StateStore(tmp_path).read().campaigns["c@s"]
    assert loaded.period_report is None and loaded.spent == 0.5


def test_the_lock_times_out_with_a_clear_error(tmp_path):
    store = StateStore(tmp_path, lock_timeout=0.2)
    store.read()
    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(StateError, match="locked by another process"):
            store.read()
    finally:
        os.close(fd)
    store.read()


def test_concurrent_processes_do_not_lose_updates(tmp_path):
    """Four processes each add 50 charges in separate transactions; all 200 must be there."""
    script = textwrap.dedent(
        """
        import sys
        from client.state import CampaignRecord, StateStore
        store = StateStore(sys.argv[1])
        for i in range(50):
            with store.transaction() as state:
                record = state.campaigns.setdefault(
                    "c@s", CampaignRecord("s", "c", {"id": "c"}, "h", 0.0)
                )
                record.charges[f"{sys.argv[2]}-{i}"] = 0.01
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(n)], cwd=ROOT)
        for n in range(4)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    assert len(StateStore(tmp_path).read().campaigns["c@s"].charges) == 200
