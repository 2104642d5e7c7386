"""scripts/bench_coverage.py: a subset of configurations gives the full run's rows."""

from __future__ import annotations

from pathlib import Path

from scripts import bench_coverage


def rows(capsys, *options: str) -> dict[str, str]:
    missing = str(Path(__file__).parent / "no-such-check-ins.csv")
    assert bench_coverage.main(["--quick", "--data", missing, *options]) == 0
    out = capsys.readouterr().out
    return {
        line.split(" n=")[0]: line.rsplit(" (", 1)[0]  # without the timing
        for line in out.splitlines()
        if " n=" in line and " coverage " in line
    }


def test_only_keeps_each_configuration_s_seed(capsys):
    # The trials' seeds came from a configuration's place in the filtered list, so --only
    # printed other figures for the same configuration than the full run.
    full = rows(capsys)
    planar = rows(capsys, "--only", "planar")
    assert len(full) > 1 and len(planar) == 1
    ((name, line),) = planar.items()
    assert name.startswith("planar") and full[name] == line
