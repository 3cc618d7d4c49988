"""The README and docs/ cannot go stale: every `$ growtool ...` line in their ```console blocks is
re-run (in order, in a fresh folder holding a copy of fixtures/) and must exit with the code the
page shows (an `exit N` line after its output, else 0). The README stays short, and its first
screen holds the two fresh-machine commands, the test command being exactly what .ci/run runs."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from growtool.cli import main

from helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def sessions(text: str) -> list[tuple[str, int]]:
    """(command line, expected exit code) for every `$ ` line of the page's console blocks."""
    out = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("$ "):
                continue
            code = 0
            for after in lines[i + 1 :]:
                if after.startswith("$ "):
                    break
                if m := re.fullmatch(r"exit (\d+)", after):
                    code = int(m.group(1))
            out.append((line[2:], code))
    return out


def run_line(line: str) -> int:
    """A growtool command, or a pipeline of them, in-process (stdout bytes feed the next stage);
    anything else through the shell."""
    stages = [shlex.split(s) for s in line.split(" | ")]
    if any(s[0] != "growtool" for s in stages):
        return subprocess.run(line, shell=True, capture_output=True).returncode
    data = None
    for args in stages:
        r = CliRunner().invoke(main, args[1:], input=data, prog_name="growtool")
        assert r.exception is None or isinstance(r.exception, SystemExit), (line, repr(r.exception))
        if r.exit_code and args is not stages[-1]:
            return r.exit_code
        data = r.stdout_bytes
    return r.exit_code


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_example_command_exits_as_shown(page, tmp_path, monkeypatch):
    found = sessions(page.read_text())
    if page.name in ("README.md", "commands.md"):
        assert len(found) >= 5, page
    shutil.copytree(ROOT / "fixtures", tmp_path / "fixtures")
    monkeypatch.chdir(tmp_path)
    for line, code in found:
        assert run_line(line) == code, f"{page.name}: {line}"


def test_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) < 20_000  # the architecture table lists every family (25 and growing)
    first_screen = text.splitlines()[:25]
    blocks = re.findall(r"```bash\n(.*?)\n```", "\n".join(first_screen), re.S)
    assert len(blocks) == 2 and "pip install" in blocks[0] and "growtool demo" in blocks[0]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert blocks[1] == ci[-1] == "python -m pytest"
    assert "## Supported architectures" in text
    for link in re.findall(r"\]\(((?:docs|bench)/[^)#]+)", text):
        assert (ROOT / link).exists(), link
