"""docs/client.md's command-line example runs as written against a real server."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "client.md").read_text(encoding="utf-8")
DOC_URL = "http://127.0.0.1:8000"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def block(language: str) -> str:
    [found] = re.findall(rf"^```{language}\n(.*?)^```", DOC, flags=re.M | re.S)
    return found


def sessions(console: str) -> list[tuple[str, list[str]]]:
    """The ``$ command`` lines of a console block, each with the lines it printed."""
    steps: list[tuple[str, list[str]]] = []
    for line in console.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def normalized(lines: list[str], labels: list[str]) -> list[str]:
    """What may differ between runs: the report id and the noisy value."""
    value = re.compile(rf'^(\s*"value": )"({"|".join(map(re.escape, labels))})",$')
    return [value.sub(r'\1"<label>",', UUID.sub("<uuid>", line)) for line in lines]


def test_the_command_line_example_prints_what_the_doc_shows(live_server, tmp_path):
    spec = json.loads(block("json"))
    served = live_server.create_campaign(spec)
    assert served["spec_hash"] in block("console")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_")}
    env["LDP_CLIENT_HOME"] = str(tmp_path / "state")
    for command, shown in sessions(block("console")):
        words = shlex.split(command.replace(DOC_URL, live_server.url))
        if words[0] == "export":
            name, value = words[1].split("=", 1)
            env[name] = value
            continue
        assert words[0] == "ldp-client"
        result = subprocess.run(
            [sys.executable, "-m", "client.cli", *words[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        printed = result.stdout.replace(live_server.url, DOC_URL).splitlines()
        assert normalized(printed, spec["domain"]) == normalized(shown, spec["domain"]), command
