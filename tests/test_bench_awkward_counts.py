"""scripts/bench_awkward_counts.py: counts no honest population produces get an estimate
within the service's limits (the quick cases; the whole table is the benchmark's)."""

from __future__ import annotations

import numpy as np

from scripts import bench_awkward_counts as module


def test_every_case_is_counts_its_mechanism_cannot_explain_and_the_quick_ones_answer(capsys):
    names = [case.name for case in module.cases()]
    assert len(names) == len(set(names)) == 7
    for case in module.cases():
        counts = module.awkward_counts(case.mechanism.n_outputs, case.shape, case.size)
        assert counts.shape == (case.mechanism.n_outputs,) and counts.sum() > 0
        assert np.all(counts == np.round(counts)) and counts.min() >= 0
    assert module.main(["--only", "3 categories", "--repeats", "1", "--no-write"]) == 0
    assert module.main(["--only", "1,000 categories", "--repeats", "1", "--no-write"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| k-RR")]
    assert len(rows) == 2 and all(" | 200 | " in row for row in rows), rows
