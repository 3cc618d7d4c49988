"""The benchmarks and docs work from any checkout: no file in bench/, docs/, recipes/ or the README
names a folder of one machine (/work, /root, /home, a tempfile folder /tmp/tmp..., a worktree
/tmp/wtN), every relative link in the pages reaches its file and heading, and bench/README.md
stays a summary of at most 450 lines (400 the aim) (the logs live beside their results under bench/results/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import ROOT

# An absolute path starts a word: not preceded by a path character (so `out/rfull/work` and
# `<out>/tmp/x` are relative and pass).
START = r"(?<![\w.~/<>-])"
MACHINE_PATHS = re.compile(START + r"(/(?:work|root|home)(?![\w.-])|/tmp/tmp\w|/tmp/wt\d)")

# Allowed, and why: what a bench script wrote about the run that made it (bench/results/**/*.json,
# .csv, .log, .txt: the interpreter, the package's and the data's paths, a profile's file names,
# beside its load average) is the record of that run, kept as written; the prose and code a
# reader follows (.md, .py, .yaml) are all checked.
RUN_RECORDS = {".json", ".csv", ".log", ".txt"}
IGNORED_DIRS = {"tmp", "runs", "work", "cache", "__pycache__"}  # git-ignored working files


def checked_files() -> list[Path]:
    roots = [ROOT / "bench", ROOT / "docs", ROOT / "recipes"]
    files = [ROOT / "README.md"]
    for r in roots:
        for p in sorted(r.rglob("*")):
            rel = p.relative_to(ROOT)
            if not p.is_file() or IGNORED_DIRS & set(rel.parts[:-1]):
                continue
            if rel.parts[:2] == ("bench", "results") and p.suffix in RUN_RECORDS:
                continue
            if b"\0" in p.read_bytes()[:8192]:  # images
                continue
            files.append(p)
    return files


def test_the_pattern_finds_machine_paths_and_only_those():
    bad = [
        "DATA = '/work/shared/data/x.txt'",
        "`/work/venv/bin/python bench/x.py`",
        "out in /tmp/tmpab12cd/d96.safetensors",
        "the tokenizer from /tmp/wt14/docrun/run-a",
        "cd /root/growtool",
        "(/home/me/x)",
        "see /work",
    ]
    good = [
        "../shared/data/tinyshakespeare.txt",
        "--work out/rfull/work",
        "`<out>/tmp/small_init/runs/<name>/`",
        "/path/to/docrun/grown",
        "written to /dev/shm; /proc/diskstats every 50 ms",
        "bench/results/tmp/quick",
        "growtool demo --out /tmp/demo",
        "a homework /workspace",
    ]
    assert [s for s in bad if not MACHINE_PATHS.search(s)] == []
    assert [s for s in good if MACHINE_PATHS.search(s)] == []


def test_no_file_names_a_folder_of_one_machine():
    files = checked_files()
    assert ROOT / "bench" / "README.md" in files and ROOT / "bench" / "recipes.py" in files
    found = []
    for p in files:
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if m := MACHINE_PATHS.search(line):
                found.append(f"{p.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert found == []


def test_bench_readme_is_a_summary():
    lines = (ROOT / "bench" / "README.md").read_text().splitlines()
    assert len(lines) <= 450, len(lines)
    scripts = sorted(p.name for p in (ROOT / "bench").glob("*.py"))
    text = "\n".join(lines)
    assert [s for s in scripts if f"`{s}`" not in text] == []  # every script is described


def slugs(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings (lower case, punctuation dropped, spaces to -)."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for h in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        s = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGES += [p for p in sorted((ROOT / "bench").rglob("*.md")) if not IGNORED_DIRS & set(p.parts)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_reaches_its_file_and_heading(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in slugs(dest):
            broken.append(target)
    assert broken == [], page
