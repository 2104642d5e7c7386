"""scripts/bench_peers.py stays working: one tiny grid against the peers, printed only."""

from __future__ import annotations

import importlib.util

import pytest

PEERS = ("pure_ldp", "multi_freq_ldpy", "sklearn", "statsmodels", "xxhash")


MISSING = [name for name in PEERS if importlib.util.find_spec(name) is None]


@pytest.mark.skipif(
    bool(MISSING),
    reason=f"the peer packages are not installed ({', '.join(MISSING)}): pip install -e '.[peers]'",
)
def test_the_peers_benchmark_runs_on_a_tiny_grid(capsys):
    from scripts import bench_peers as module

    grid = ["--k", "16", "--epsilon", "1", "--users", "400", "--seeds", "1", "--big-users", "0"]
    status = module.main([*grid, "--budget", "60", "--no-write"])
    assert status == 0
    out = capsys.readouterr().out
    lines = [line.split(" | ") for line in out.splitlines() if line.startswith("| ")]
    rows = [cells for cells in lines if len(cells) == 11 and cells[0] != "| mechanism"]
    peers = {(row[0].strip("| "), row[3]) for row in rows}
    assert {mechanism for mechanism, _ in peers} == set(module.MECHANISMS)
    assert len(peers) == 8  # every protocol of both peers ran
    for row in rows:
        same, own, seconds = row[4], row[5], row[9]
        assert seconds.replace(".", "").isdigit(), row  # the peer finished: no budget, no error
        if same != "—" and not row[0].endswith("OLH"):  # ours peels OLH's pool bias
            # Same reports, same formula: the two estimators agree to rounding.
            assert abs(float(same) - 1) < 0.02, row
        assert float(own) > 0, row
    assert "| epsilon | pool 1,024, linear | pool 1,024, served |" in out
