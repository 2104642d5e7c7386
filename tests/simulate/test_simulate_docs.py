"""The ``ldp-simulate`` commands the docs and the help show are valid commands of the CLI."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from simulate.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "simulation.md"]
DATA_FILE = "../shared/data/gowalla_sf_downtown.csv"


def shown_commands() -> list[str]:
    """Every ``ldp-simulate`` command of a shell block, a run shown inline, or a help example."""
    texts = [path.read_text(encoding="utf-8") for path in DOCS]
    texts += [command.help or "" for command in main.commands.values()]
    found = []
    for text in texts:
        blocks = re.findall(r"^```sh\n(.*?)^```", text, flags=re.M | re.S)
        blocks += [example for example in text.split("\n\n") if "Example" in example]
        for block in blocks:
            for line in block.replace("\\\n", " ").splitlines():
                if "ldp-simulate " in line:
                    found.append(line[line.index("ldp-simulate ") :].split(" #")[0])
        # Inline runs (not placeholders such as `ldp-simulate via --server URL`).
        for span in re.findall(r"`(ldp-simulate [^`]*--population[^`]*)`", text):
            found.append(span.replace("\n", " "))
    return found


COMMANDS = shown_commands()


def test_the_docs_show_every_subcommand():
    assert {shlex.split(command)[1] for command in COMMANDS} == {
        "run",
        "via",
        "reproduce",
        "advise",
    }
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("command", COMMANDS)
def test_a_shown_command_parses(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "campaign.json").write_text("{}")  # --spec opens its file while parsing
    (tmp_path / "check_ins.csv").write_text("user_id,lat,lon,unix_time\n")
    args = ["check_ins.csv" if arg == DATA_FILE else arg for arg in shlex.split(command)[1:]]
    subcommand = main.commands[args[0]]
    # Under the group's context, as the command line runs it: click keeps each command's help
    # option from its first context, and a context without the group's settings would leave
    # the subcommands without -h for the tests that follow.
    parent = click.Context(main, info_name="ldp-simulate", **main.context_settings)
    try:
        subcommand.make_context(args[0], args[1:], parent=parent)
    except click.UsageError as exc:
        pytest.fail(f"{command}: {exc.format_message()}")
