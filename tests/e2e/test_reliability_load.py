"""The load and fault harness, small: real clients, kill -9 of Redis and of a worker, then an audit.

The full run (50 clients, 100,000 reports) is ``python scripts/load_harness.py``;
this one sends 2,000 reports from 8 clients with the same faults and checks
the same figures: 0 lost, 0 counted twice, counts equal to the stream and to
the clients' own tally, ``redis-check-aof`` clean after a final kill -9.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from load_harness import HarnessConfig, run


@pytest.mark.parametrize("fsync", ["always", pytest.param("everysec", marks=pytest.mark.slow)])
def test_no_acknowledged_report_is_lost_or_counted_twice_under_faults(tmp_path, fsync):
    config = HarnessConfig(
        clients=8, reports=1000, workers=2, processes=2, fsync=fsync, retry_fraction=0.05
    )
    figures = run(config, workdir=tmp_path)
    assert figures.problems == []
    assert figures.redis_kills == 1 and figures.worker_kills == 1
    assert figures.reports_made == 1000 == figures.acknowledged == figures.stream_entries
    assert figures.lost == 0 and figures.counted_twice == 0 and figures.unknown_in_stream == 0
    assert figures.retried > 0 and figures.retries_counted_as_duplicates == figures.retried
    assert figures.counts_equal_stream and figures.counts_equal_clients
    assert figures.n_reports_equal_stream and figures.counts_after_restart_equal
    assert figures.aof_check == "valid"
    assert figures.ok
