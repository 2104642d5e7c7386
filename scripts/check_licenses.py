"""Check that an install of ldp-collect with some extras pulls in no GPL-family licence.

Walks the requirements of ``ldp-collect[<extras>]`` transitively through the
installed distributions' metadata (``importlib.metadata``), so only what those
extras would install is checked, whatever else the environment holds. A
distribution is refused when every licence it offers is GPL, AGPL or LGPL
(a dual licence with a permissive choice passes), or when it ships a build of a
GPL library (pyFFTW's wheels bundle FFTW, under a BSD licence of their own).
The licence is read from ``License-Expression``, else the ``License ::``
classifiers, else a short ``License`` field. Prints one row per distribution.
Run from the repository's environment::

    python scripts/check_licenses.py                   # the aggregator extra
    python scripts/check_licenses.py --extra simulate  # or another one

The JavaScript vendored into the package (:data:`VENDORED`: Leaflet, served by
the dashboard for its basemap) is checked too: each directory must hold its
licence file, and its licence must be permissive.

Exit status: 0 all permissive, 1 something refused or without a stated
licence, 2 a required distribution is not installed.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare install: pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

PROJECT = "ldp-collect"
COPYLEFT = re.compile(r"\b[AL]?GPL|GNU (Affero |Lesser |Library )?General Public", re.IGNORECASE)
# Shared libraries under a GPL licence, by the file name a wheel bundles them under.
GPL_LIBRARIES = {"libfftw3": "FFTW (GPL-2.0-or-later)", "libreadline": "GNU Readline (GPL-3.0)"}
# A License field longer than this is the licence's text (often with the texts of bundled
# runtimes appended), not its name.
LICENSE_NAME_MAX = 120


ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Vendored:
    """Third-party files copied into the package: where, what, from where, under which licence."""

    path: str  # the directory, from the repository's root
    name: str
    version: str
    licence: str  # SPDX
    source: str  # the registry's archive and its integrity


VENDORED = (
    Vendored(
        path="aggregator/dashboard/static/vendor/leaflet",
        name="leaflet",
        version="1.9.4",
        licence="BSD-2-Clause",
        source="https://registry.npmjs.org/leaflet/-/leaflet-1.9.4.tgz (dist/ and LICENSE; "
        "sha512-nxS1ynzJOmOlHp+iL3FyWqK89GtNL8U8rvlMOsQdTTssxZwCXh8N2NB3GDQOL+YR3XnWyZAxwQixURb+FA74PA==)",
    ),
)


def judge_vendored(item: Vendored, root: Path = ROOT) -> Verdict:
    """A vendored directory passes with its LICENSE file and a permissive licence."""
    refused = None
    if not (root / item.path / "LICENSE").is_file():
        refused = f"no LICENSE file in {item.path}"
    elif copyleft_only(alternatives(item.licence)):
        refused = "GPL-family licence only"
    return Verdict(f"{item.name} (vendored)", item.version, item.licence, refused)


@dataclass(frozen=True)
class Verdict:
    name: str
    version: str
    licence: str
    refused: str | None  # the reason, or None if permissive


def alternatives(licence: str) -> list[str]:
    """The licences one may choose between: ``"MIT OR GPL-2.0"`` gives two."""
    flat = licence.replace("(", " ").replace(")", " ")
    return [part.strip() for part in re.split(r"\s+(?:OR|or)\s+", flat) if part.strip()]


def copyleft_only(choices: Iterable[str]) -> bool:
    """True when there is a choice and every one is GPL-family."""
    choices = list(choices)
    return bool(choices) and all(COPYLEFT.search(choice) for choice in choices)


def stated_licence(dist: metadata.Distribution) -> tuple[str, list[str]]:
    """The licence as shown, and the alternatives it offers (empty: not stated)."""
    fields = dist.metadata
    expression = fields.get("License-Expression")
    if expression:
        return expression, alternatives(expression)
    classifiers = [
        value.split("::")[-1].strip()
        for value in fields.get_all("Classifier") or []
        if value.startswith("License ::") and value.split("::")[-1].strip() != "OSI Approved"
    ]
    if classifiers:
        return "; ".join(classifiers), classifiers
    text = (fields.get("License") or "").strip()
    if text and len(text) <= LICENSE_NAME_MAX and "\n" not in text:
        return text, alternatives(text)
    return "not stated", []


def bundled_gpl(dist: metadata.Distribution) -> str | None:
    """The GPL library the distribution's files include, if any."""
    for path in dist.files or []:
        for prefix, library in GPL_LIBRARIES.items():
            if path.name.startswith(prefix):
                return library
    return None


def judge(dist: metadata.Distribution) -> Verdict:
    licence, choices = stated_licence(dist)
    refused = None
    if not choices:
        refused = "no licence stated"
    elif copyleft_only(choices):
        refused = "GPL-family licence only"
    else:
        library = bundled_gpl(dist)
        if library is not None:
            refused = f"bundles {library}"
    return Verdict(dist.metadata["Name"], dist.version, licence, refused)


def requirement_tree(
    root: str, extras: Sequence[str]
) -> tuple[dict[str, metadata.Distribution], list[str]]:
    """Every installed distribution ``root[extras]`` requires, transitively; and the names of
    required distributions that are not installed."""
    found: dict[str, metadata.Distribution] = {}
    wanted: dict[str, set[str]] = {}
    missing: list[str] = []
    pending = [(root, set(extras))]
    while pending:
        name, asked = pending.pop()
        key = canonicalize_name(name)
        if key in wanted and asked <= wanted[key]:
            continue
        wanted.setdefault(key, set()).update(asked)
        try:
            dist = found.get(key) or metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        found[key] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(
                marker.evaluate({"extra": extra}) for extra in ("", *sorted(wanted[key]))
            ):
                pending.append((requirement.name, set(requirement.extras)))
    return found, sorted(set(missing))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--extra",
        action="append",
        help=f"an extra of {PROJECT} to check (repeatable; default: aggregator)",
    )
    args = parser.parse_args(argv)
    extras = args.extra or ["aggregator"]
    found, missing = requirement_tree(PROJECT, extras)
    if missing:
        print(f"not installed, so not checked: {', '.join(missing)}", file=sys.stderr)
        return 2
    verdicts = sorted((judge(dist) for dist in found.values()), key=lambda v: v.name.lower())
    verdicts += [judge_vendored(item) for item in VENDORED]
    print(f"{PROJECT}[{','.join(extras)}]: {len(verdicts)} distributions")
    print("| distribution | version | licence | verdict |")
    print("|---|---|---|---|")
    for verdict in verdicts:
        outcome = "ok" if verdict.refused is None else f"REFUSED: {verdict.refused}"
        print(f"| {verdict.name} | {verdict.version} | {verdict.licence} | {outcome} |")
    refused = [v.name for v in verdicts if v.refused is not None]
    if refused:
        print(f"refused: {', '.join(refused)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
