"""The README and docs/ cannot go stale: every fenced block of README.md and docs/*.md is run, in
page order, in a fresh folder holding a copy of fixtures/ and the small inputs the pages take as
given (given() below). A ```console block's `$ ` lines must exit with the code the page shows (an
`exit N` line after its output, else 0); a ```bash block runs line by line and every line must exit
0; a ```python block runs and must not raise. A block that is not run says why in an HTML comment
on the line before it, `<!-- not run: REASON -->`; that comment is the one list of exceptions.
Training lines run shortened (SHORTER below): the pages show runs of hundreds of steps, the test
runs the same commands with a few. The README stays short, and its first screen holds the two
fresh-machine commands, the test command being exactly .ci/run's first (its second runs the slow
bench smoke runs)."""

from __future__ import annotations

import json
import random
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from growtool.cli import main

from helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = ("console", "bash", "python")
FENCE = re.compile(r"(?:^<!-- not run: (?P<why>.+?) -->\n)?^```(?P<lang>\S*)\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)

# Training lines run with a few steps (the pages' runs take minutes), evaluating and saving seldom.
SHORTER = [
    (re.compile(r"--steps \d+"), "--steps 4"),
    (re.compile(r"--tokens 196608"), "--tokens 6144"),  # 6 steps of 16 x 64: grows at steps 2 and 4
    (re.compile(r"--tokens 131072"), "--tokens 8192"),  # 4 steps of 16 x 128 (the context) ...
    (re.compile(r"--stop-at 32"), "--stop-at 2"),  # ... stopped at step 2 (the page: 32 of 64)
    # and evaluate on 2 batches, save and measure every 4 steps, not every step (the defaults' share of a 4-step run)
    (
        re.compile(r"^(growtool train .*)$", re.S),
        r"\1 --eval-every 4 --save-every 4 --metrics-every 4 --eval-batches 2",
    ),
]


def blocks(text: str) -> list[tuple[str, str, str | None, int]]:
    """(language, body, reason it is not run or None, line number) for every fenced block of a page."""
    return [(m["lang"], m["body"], m["why"], text.count("\n", 0, m.start("lang")) + 1) for m in FENCE.finditer(text)]


def given(folder: Path) -> None:
    """The inputs the pages name without making them: plain text, JSONL documents, a checkpoint."""
    r = random.Random(0)
    words = "the a cat dog fox king bird sees likes finds helps runs over under with".split()
    lines = [" ".join(r.choice(words) for _ in range(12)) + "." for _ in range(1500)]
    (folder / "input.txt").write_text("\n".join(lines) + "\n")
    (folder / "corpus.txt").write_text("\n".join(lines[:800]) + "\n")
    docs = [json.dumps({"source": f"doc{i}", "text": " ".join(lines[i * 5 : i * 5 + 5])}) for i in range(200)]
    (folder / "docs.jsonl").write_text("\n".join(docs) + "\n")
    shutil.copy(folder / "fixtures" / "llama-gated.safetensors", folder / "model.safetensors")


def complete(lines: list[str], i: int) -> tuple[str, int]:
    """The command starting at lines[i] with the lines it continues onto (a trailing backslash, an
    open quote, a here-document); returns it and the index after it."""
    cmd, j = lines[i], i + 1
    while True:
        if cmd.endswith("\\"):
            cmd = cmd[:-1].rstrip() + " " + lines[j].strip()
        elif m := re.search(r"<<'?(\w+)'?", cmd):
            end = lines.index(m[1], j)
            return "\n".join([cmd, *lines[j : end + 1]]), end + 1
        else:
            try:
                shlex.split(cmd)
                return cmd, j
            except ValueError:  # an open quote: the command goes on
                cmd += "\n" + lines[j]
        j += 1


def sessions(text: str) -> list[tuple[str, int]]:
    """(command, expected exit code) for every `$ ` command of the page's console blocks."""
    out = []
    for lang, body, why, _ in blocks(text):
        if lang != "console" or why:
            continue
        lines = body.splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("$ "):
                continue
            cmd, after = complete([line[2:], *lines[i + 1 :]], 0)
            code = 0
            for rest in lines[i + after :]:
                if rest.startswith("$ "):
                    break
                if m := re.fullmatch(r"exit (\d+)", rest):
                    code = int(m.group(1))
            out.append((cmd, code))
    return out


def commands(body: str) -> list[str]:
    """The commands of a ```bash block (comments dropped, continuation lines joined)."""
    lines = [re.sub(r"\s+#\s.*$", "", line) for line in body.splitlines()]
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() and not lines[i].lstrip().startswith("#"):
            cmd, i = complete(lines, i)
            out.append(cmd)
        else:
            i += 1
    return out


def growtool(args: list[str], data: bytes | None = None):
    r = CliRunner().invoke(main, args, input=data, prog_name="growtool")
    print(f"$ growtool {shlex.join(args)} (exit {r.exit_code})\n{r.output[-2000:]}")  # shown on a failure
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, repr(r.exception), r.output[-2000:])
    return r


def run_line(line: str) -> int:
    """A growtool command, a pipeline of them, or one with `$(growtool ...)` in it: in-process
    (stdout bytes feed the next stage); anything else through the shell, with this Python's
    `growtool` and `python` first on the PATH."""
    for pattern, short in SHORTER:
        line = pattern.sub(short, line)
    while m := re.search(r'"\$\((growtool [^()$]*)\)"', line):
        r = growtool(shlex.split(m[1])[1:])
        if r.exit_code:
            return r.exit_code
        line = line[: m.start()] + shlex.quote(r.stdout.strip()) + line[m.end() :]
    shell = re.search(r"[$<>&;`\n]", line) or "|" in line.replace(" | growtool ", "")
    stages = [shlex.split(s) for s in line.split(" | ")]
    if shell or any(s[0] != "growtool" for s in stages):
        env_path = f"{Path(sys.executable).parent}:{subprocess.os.environ['PATH']}"
        r = subprocess.run(["bash", "-c", line], capture_output=True, env={**subprocess.os.environ, "PATH": env_path})
        print(f"$ {line} (exit {r.returncode})\n{r.stdout.decode()[-1000:]}{r.stderr.decode()[-2000:]}")
        return r.returncode
    data = None
    for args in stages:
        r = growtool(args[1:], data)
        if r.exit_code and args is not stages[-1]:
            return r.exit_code
        data = r.stdout_bytes
    return r.exit_code


def run_block(page: str, lang: str, body: str, line: int) -> None:
    where, t0 = f"{page}:{line}", time.process_time()
    if lang == "python":
        exec(compile(body, where, "exec"), {"__name__": "__main__"})
    elif lang == "bash":
        for cmd in commands(body):
            assert run_line(cmd) == 0, f"{where}: {cmd}"
    else:
        for cmd, code in sessions(f"```console\n{body}```\n"):
            assert run_line(cmd) == code, f"{where}: {cmd}"
    print(f"{where}: {time.process_time() - t0:.1f} s of CPU in this process")


def test_every_block_runs_or_says_why_not():
    """The one list of exceptions is the `not run` comments; every other block is of a kind the test runs."""
    skipped = []
    for page in PAGES:
        for lang, _, why, line in blocks(page.read_text()):
            where = f"{page.relative_to(ROOT)}:{line}"
            assert why or lang in RUNNABLE, f"{where}: a ```{lang} block, neither run nor marked <!-- not run: ... -->"
            if why:
                assert len(why.split()) >= 3, f"{where}: give a reason, not {why!r}"
                skipped.append(where)
    assert sum(len(blocks(p.read_text())) for p in PAGES) > 2 * len(skipped), skipped  # most blocks run


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_block_runs_as_shown(page, tmp_path, monkeypatch):
    found = [b for b in blocks(page.read_text()) if not b[2]]
    if page.name in ("README.md", "commands.md"):
        assert len(sessions(page.read_text())) >= 5, page
    shutil.copytree(ROOT / "fixtures", tmp_path / "fixtures")
    given(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the shell lines' processes too
    for lang, body, _, line in found:
        run_block(page.name, lang, body, line)


def test_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) < 20_000  # the architecture table lists every family (25 and growing)
    first_screen = text.splitlines()[:25]
    blocks = re.findall(r"```bash\n(.*?)\n```", "\n".join(first_screen), re.S)
    assert len(blocks) == 2 and "pip install" in blocks[0] and "growtool demo" in blocks[0]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert blocks[1] == ci[-2] == "python -m pytest" and ci[-1] == "python -m pytest -m slow"
    assert "## Supported architectures" in text
    for link in re.findall(r"\]\(((?:docs|bench)/[^)#]+)", text):
        assert (ROOT / link).exists(), link
