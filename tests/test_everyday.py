"""Everyday use: dry runs, progress bars only on a terminal, the exit-code contract for each error
class (usage 2, bad value 2, internal 3, SIGINT 130, SIGTERM 143: one line, no traceback, nothing
left behind, inputs untouched), --version and shell completion."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import time

import pytest

from growtool import console
from growtool.grow import engine
from growtool.io import checkpoint

from helpers import cli, listing, make_config, run, sha256, write_ckpt


def bar(text: str) -> bool:
    """The bars' count column ("12/23 tensors") is in the text; no other output has it."""
    return re.search(r"\d+/\d+ tensors", text) is not None


def one_error_line(stderr: str, start: str = "growtool: error: ") -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(start), lines[0]
    assert "Traceback" not in stderr
    return lines[0]


# ---- expand --dry-run / --plan-json -------------------------------------------------------


@pytest.mark.parametrize("gated", [False, True])
def test_dry_run_reads_no_weights_writes_nothing_and_shows_the_real_runs_plan(tmp_path, monkeypatch, gated):
    src = write_ckpt(tmp_path / "a.safetensors", make_config(attn_gate=True))
    if gated:  # a grown source: the dry run reads its gate scalars (to refuse open gates), nothing else
        assert cli("expand", src, "--width", 48, "-q", "-o", tmp_path / "g.safetensors").exit_code == 0
        src = tmp_path / "g.safetensors"
    read = []
    real_read = checkpoint.read_tensor
    monkeypatch.setattr(checkpoint, "read_tensor", lambda *a: read.append(a[3]) or real_read(*a))
    before, digest = listing(tmp_path), sha256(src)
    out = tmp_path / "b.safetensors"

    dry = cli("expand", src, "--width", 64, "--dry-run", "-o", out)
    assert dry.exit_code == 0, dry.stderr
    assert dry.stdout == "" and listing(tmp_path) == before and sha256(src) == digest
    assert all(n.endswith("growth_gate") for n in read) and len(read) == (2 if gated else 0)
    assert "dry run: exact at gate 0" in dry.stderr and f"would write {out}" in " ".join(dry.stderr.split())

    real = cli("expand", src, "--width", 64, "-o", out)
    assert real.exit_code == 0, real.stderr
    plan_part = dry.stderr[: dry.stderr.index("dry run:")]
    assert "growth plan:" in plan_part and real.stderr.startswith(plan_part)

    # --plan-json: the same JSON with and without --dry-run (the real run names its output), path after it
    dj = cli("expand", src, "--width", 64, "--dry-run", "--plan-json", "-q")
    rj = cli("expand", src, "--width", 64, "--plan-json", "-q", "-o", tmp_path / "c.safetensors")
    assert dj.exit_code == 0 and rj.exit_code == 0, (dj.stderr, rj.stderr)
    plan_dry, (line, path) = json.loads(dj.stdout), rj.stdout.splitlines()
    plan_real = json.loads(line)
    assert path == str(tmp_path / "c.safetensors")
    assert plan_real.pop("out") == path and plan_dry.pop("out") is None and plan_dry == plan_real
    assert plan_dry["exact"] is True and plan_dry["lossy"] == [] and plan_dry["target"]["width"] == 64
    assert plan_dry["outputs"]["tensors"] == len(checkpoint.load(path).names())
    assert [t["pattern"] for t in plan_dry["tensors"]][0] == "model.embed_tokens.weight"


def test_dry_run_of_a_lossy_plan_says_so_and_a_refused_one_fails_like_the_real_run(tmp_path):
    src = write_ckpt(tmp_path / "a.safetensors", make_config(family="gpt2", tie=True))
    r = cli("expand", src, "--width", 48, "--recipe", "nrio", "--dry-run", "--plan-json", "-q")
    assert r.exit_code == 0 and json.loads(r.stdout)["exact"] is False
    assert "lossy:" in r.stderr and "dry run: lossy" in r.stderr
    args = ["expand", src, "--width", 48, "--set", "rotation.eps=0.9", "-o", tmp_path / "b.safetensors"]
    dry, real = cli(*args, "--dry-run"), cli(*args)
    assert dry.exit_code == real.exit_code == 2 and dry.stderr == real.stderr
    assert "refused" in one_error_line(dry.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors"]


def test_plan_json_and_stdout_output_conflict_is_one_line(tmp_path):
    src = write_ckpt(tmp_path / "a.safetensors", make_config())
    r = cli("expand", src, "--width", 48, "--plan-json", "-o", "-")
    assert r.exit_code == 2 and "--plan-json" in one_error_line(r.stderr) and r.stdout == ""


# ---- progress -----------------------------------------------------------------------------


def on_a_terminal(*args, delay: float = 0.0) -> tuple[int, str]:
    """Run growtool in a real process with its stderr on a pseudo-terminal; (exit code, terminal text)."""
    code = f"import growtool.cli as c, growtool.console as f; f.PROGRESS_DELAY = {delay}; c.main()"
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    text = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        text += chunk
    os.close(master)
    p.stdout.close()
    return p.wait(timeout=1800), text.decode(errors="replace")


def test_progress_bar_only_on_a_terminal_and_not_with_quiet(tmp_path):
    src = write_ckpt(tmp_path / "a.safetensors", make_config())
    code, tty = on_a_terminal("expand", src, "--width", 48, "-o", tmp_path / "b.safetensors")
    assert code == 0 and "expand" in tty and bar(tty) and "/s" in tty  # bytes, tensors, rate
    code, quiet = on_a_terminal("expand", src, "--width", 48, "-q", "-o", tmp_path / "c.safetensors")
    assert code == 0 and not bar(quiet) and "grew llama" in quiet
    code, quick = on_a_terminal("expand", src, "--width", 48, "-o", tmp_path / "d.safetensors", delay=30)
    assert code == 0 and not bar(quick) and "grow" in quick  # work shorter than the delay: no bar
    p = run("expand", src, "--width", 48, "-o", tmp_path / "e.safetensors")  # stderr a pipe
    assert p.returncode == 0 and not bar(p.stderr.decode()) and "growth plan" in p.stderr.decode()


def test_progress_bars_of_fold_and_verify(tmp_path, monkeypatch):
    src = write_ckpt(tmp_path / "a.safetensors", make_config(attn_gate=True))
    g, f = tmp_path / "g.safetensors", tmp_path / "f.safetensors"
    assert cli("expand", src, "--width", 48, "-q", "-o", g).exit_code == 0
    r = cli("verify", src, g, "--samples", 4)
    assert r.exit_code == 0 and not bar(r.stderr)  # CliRunner's stderr is no terminal
    monkeypatch.setattr(console, "stderr_is_terminal", lambda: True)
    monkeypatch.setattr(console, "PROGRESS_DELAY", 0.0)
    r = cli("verify", src, g, "--samples", 4)  # streamed: the source once, the grown at gates 0 and 1
    assert r.exit_code == 0 and re.search(r"verify .* (\d+)/\1 tensors", r.stderr)
    r = cli("fold", g, "--alpha", 1, "-o", f)
    k = len(checkpoint.load(f).names())
    assert r.exit_code == 0 and f"{k}/{k} tensors" in r.stderr
    r = cli("fold", g, "--alpha", 1, "-o", f, "--force", "-q")
    assert r.exit_code == 0 and not bar(r.stderr)


# ---- errors -------------------------------------------------------------------------------


def test_usage_errors_are_one_line_exit_2(tmp_path):
    src = write_ckpt(tmp_path / "a.safetensors", make_config())
    for args, frag in (
        (["expand", src], "Missing option '--width'"),
        (["expand", src, "--width", 48, "--bogus"], "No such option '--bogus'"),
        (["grow", src], "No such command 'grow'"),
        (["expand", src, "--width", "wide"], "'wide' is not a valid integer"),
    ):
        r = cli(*args)
        assert r.exit_code == 2 and frag in one_error_line(r.stderr) and r.stdout == "", r.stderr
    p = run("expand", src)  # the same in a real process
    assert p.returncode == 2 and "--width" in one_error_line(p.stderr.decode()) and p.stdout == b""


@pytest.mark.parametrize(
    "args, frag",
    [
        (["verify", "{a}", "{a}", "--samples", 0], "--samples must be positive, got 0"),
        (["verify", "{a}", "{a}", "--alpha", 2], "--alpha must be in [0, 1], got 2"),
        (["verify", "{a}", "{a}", "--tol", -1], "--tol must be at least 0"),
        (["verify", "{a}", "{a}", "--alpha", "nan"], "--alpha must be in [0, 1], got nan"),
        (["expand", "{a}", "--width", 0], "--width must be positive, got 0"),
        (["expand", "{a}", "--width", 48, "--heads", -2], "--heads must be positive"),
        (["expand", "{a}", "--width", 48, "--seed", -1], "--seed must be at least 0"),
        (["fold", "{a}", "--alpha", -0.5, "-o", "{out}"], "--alpha must be in [0, 1]"),
        (
            ["init", "--family", "llama", "--width", 32, "--layers", 0, "--heads", 4, "-o", "{out}"],
            "--layers must be positive",
        ),
        (
            ["init", "--family", "llama", "--width", 32, "--layers", 1, "--heads", 4, "--gamma", 0, "-o", "{out}"],
            "--gamma must be positive",
        ),
        (["train", "{a}", "--data", "{a}", "--batch", 0, "--out", "{run}"], "--batch must be positive, got 0"),
        (["train", "{a}", "--data", "{a}", "--lr", -1, "--out", "{run}"], "--lr must be positive"),
        (["train", "{a}", "--data", "{a}", "--min-lr-ratio", 2, "--out", "{run}"], "--min-lr-ratio must be in [0, 1]"),
    ],
)
def test_out_of_range_numbers_are_one_line_exit_2(tmp_path, args, frag):
    src = write_ckpt(tmp_path / "a.safetensors", make_config())
    names = {"{a}": src, "{out}": tmp_path / "o.safetensors", "{run}": tmp_path / "run"}
    before = listing(tmp_path)
    r = cli(*[names.get(a, a) for a in args])
    assert r.exit_code == 2 and frag in one_error_line(r.stderr), r.stderr
    assert r.stdout == "" and listing(tmp_path) == before


def boom(*a, **kw):
    raise ZeroDivisionError("division by zero")


def test_internal_error_is_exit_3_names_itself_and_leaves_nothing(tmp_path, monkeypatch):
    src = write_ckpt(tmp_path / "a.safetensors", make_config())
    work = tmp_path / "work"
    work.mkdir()
    tb_dir = tmp_path / "tmp"
    tb_dir.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tb_dir))
    monkeypatch.setattr(engine, "grow_tensor", boom)  # a bug in the middle of writing the output
    digest = sha256(src)
    r = cli("expand", src, "--width", 48, "-q", "-o", work / "b.safetensors")
    line = one_error_line(r.stderr, "growtool: internal error: ZeroDivisionError: division by zero")
    assert r.exit_code == 3 and "a bug in growtool" in line and r.stdout == ""
    assert list(work.iterdir()) == [] and sha256(src) == digest
    (tb,) = tb_dir.glob("growtool-traceback-*.txt")
    assert str(tb) in line and "Traceback" in tb.read_text() and "grow_tensor" not in line
    assert "ZeroDivisionError" in tb.read_text()
    expand = ["expand", src, "--width", 48, "-q", "-o", work / "b.safetensors"]
    monkeypatch.delenv("GROWTOOL_DEBUG", raising=False)
    with_flag = cli("--debug", *expand)
    monkeypatch.setenv("GROWTOOL_DEBUG", "1")
    with_env = cli(*expand)
    for r in (with_flag, with_env):  # the traceback on stderr, then the same line
        assert r.exit_code == 3 and "Traceback" in r.stderr and "in boom" in r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("growtool: internal error: ZeroDivisionError")
    assert list(work.iterdir()) == [] and len(list(tb_dir.iterdir())) == 1


SLOW = """
import sys, time
from growtool.grow import engine
import growtool.cli as c
grow = engine.grow_tensor
made = []
def slow(*a):  # a stand-in for a big checkpoint: each tensor takes a while, and a minute in all,
    made.append(1)  # so that a signal sent mid-write cannot meet the end of the run
    time.sleep(0.05 if len(made) < 5 else 1.0)
    return grow(*a)
engine.grow_tensor = slow
c.main()
"""


@pytest.mark.parametrize("sig, target", [(signal.SIGINT, "b.safetensors"), (signal.SIGTERM, "folder")])
def test_interrupt_mid_write_is_one_line_and_leaves_nothing(tmp_path, sig, target):
    src = write_ckpt(tmp_path / "a.safetensors", make_config(layers=8))
    work = tmp_path / "work"
    work.mkdir()
    digest = sha256(src)
    extra = ["--shard-size", "20KB"] if target == "folder" else []
    p = subprocess.Popen(
        [sys.executable, "-c", SLOW, "expand", str(src), "--width", "48", "-q", "-o", str(work / target), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 30
    while not any(work.iterdir()) and time.time() < deadline:  # the temporary output exists: mid-write
        time.sleep(0.02)
    time.sleep(0.2)
    assert p.poll() is None, p.stderr.read()
    p.send_signal(sig)
    out, err = p.communicate(timeout=1800)
    assert p.returncode == 128 + sig, (p.returncode, out, err.decode()[-2000:])  # what happened instead
    line = one_error_line(err.decode(), "growtool: interrupted")
    assert sig.name in line and out == b""
    assert list(work.iterdir()) == [] and sha256(src) == digest


def test_version_and_shell_completion():
    from click.testing import CliRunner

    from growtool.cli import main

    r = CliRunner().invoke(main, ["--version"], prog_name="growtool")
    assert r.exit_code == 0 and r.stdout.startswith("growtool, version ")
    r = CliRunner().invoke(main, [], prog_name="growtool", env={"_GROWTOOL_COMPLETE": "bash_source"})
    assert r.exit_code == 0 and "_growtool_completion" in r.stdout and "complete " in r.stdout
    env = {"COMP_WORDS": "growtool ex", "COMP_CWORD": "1", "_GROWTOOL_COMPLETE": "bash_complete"}
    r = CliRunner().invoke(main, [], prog_name="growtool", env=env)
    assert r.exit_code == 0 and "expand" in r.stdout
