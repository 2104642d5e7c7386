"""The tables ``ldp-simulate`` prints: accuracy per configuration, and an end-to-end summary."""

from __future__ import annotations

from simulate.runner import ResultRow
from simulate.via import ViaResult


def _number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    return f"{value:.{digits}g}"


def _table(header: list[str], lines: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
        for i, h in enumerate(header)
    ]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"]
    out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in lines:
        out.append("| " + " | ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) + " |")
    return "\n".join(out)


def format_table(rows: list[ResultRow]) -> str:
    """The accuracy table, one line per (mechanism, epsilon, n, method), in markdown."""
    location = any(row.scores.emd_m is not None for row in rows)
    repeats = any(row.repeats > 1 for row in rows)
    header = ["mechanism", "epsilon", "n", "method", "TV"]
    header += ["TV sd"] if repeats else []
    header += ["MSE", "max |err|", "KL"] + (["EMD (m)"] if location else []) + ["iters", "seconds"]
    lines = []
    for row in rows:
        s = row.scores
        line = [row.mechanism, _number(row.epsilon), str(row.n), row.method, _number(s.tv)]
        line += [_number(row.scores_sd.tv, 2)] if repeats else []
        line += [_number(s.mse, 3), _number(s.max_abs), _number(s.kl)]
        line += [_number(s.emd_m)] if location else []
        line += ["-" if row.n_iter is None else f"{row.n_iter:.0f}", _number(row.seconds, 2)]
        lines.append(line)
    return _table(header, lines)


def format_via(result: ViaResult) -> str:
    """A summary of an end-to-end run and the table of server and in-process scores."""
    rate = result.delivered / result.seconds if result.seconds > 0 else float("nan")
    text = [
        f"campaign {result.campaign_id} at {result.url} ({'created' if result.created else 'existing'}, "
        f"spec hash {result.spec_hash[:12]}...)",
        f"{result.n_users} simulated users: {result.delivered} delivered ({result.duplicates} duplicates), "
        f"{result.failed} failed, in {result.seconds:.1f} s ({rate:.0f} reports/s)",
    ]
    text += [f"  error: {message}" for message in result.errors]
    if result.previous_n:
        text.append(
            f"warning: the campaign already held {result.previous_n} reports; the server's "
            "estimates include them, so the scores below are not about these users alone"
        )
    if not result.scores:
        text.append(
            "no analyst token (--analyst-token or LDP_ANALYST_TOKEN): estimates not fetched"
        )
        return "\n".join(text)
    location = any(s.emd_m is not None for s in result.scores.values())
    header = ["source", "method", "TV", "MSE", "max |err|", "KL"] + (
        ["EMD (m)"] if location else []
    )
    lines = []
    for source, table in (("server", result.scores), ("in-process", result.in_process)):
        for method, s in table.items():
            line = [
                source,
                method,
                _number(s.tv),
                _number(s.mse, 3),
                _number(s.max_abs),
                _number(s.kl),
            ]
            lines.append(line + ([_number(s.emd_m)] if location else []))
    text.append(
        f"server n = {result.server_n}; in-process = the same users through the vectorised sampler"
    )
    text.append(_table(header, lines))
    return "\n".join(text)
