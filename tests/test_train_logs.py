"""The trainer's progress off a terminal (plain flushed lines in a log file, while the run runs), its
bar at 80 columns (step count and ETA never cut), and Ctrl-C naming the step a run resumes from and
the command that resumes it (growtool/training/progress.py, cli.resume_note)."""

from __future__ import annotations

import io
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
import torch
from rich.console import Console

from growtool.init import init_model
from growtool.io import checkpoint
from growtool.training.progress import Progress

from helpers import make_config

REC = {"loss": 4.123456, "lr": 3e-3, "gate": 0.5, "tok_s": 123456.0}
FIELDS = r"train step (\d+)/(\d+) \(\d+%\)  tokens [\d,]+  loss [\d.]+(  val [\d.]+)?  lr [\d.e+-]+  gate [\d.]+  "
LINE = re.compile(FIELDS + r"[\d,]+ tok/s  ETA \d+:\d\d:\d\d$")


def test_lines_off_a_terminal_at_each_eval_and_every_twentieth_of_the_run():
    buf = io.StringIO()
    p = Progress(True, 200, 0, terminal=False, stream=buf)
    for s in range(1, 201):
        p.update(s, {**REC, "tokens": 64 * s, **({"val_loss": 4.0} if s % 25 == 0 else {})})
    p.close()
    lines = buf.getvalue().splitlines()
    assert all(LINE.match(line) for line in lines), lines
    steps = [int(LINE.match(line).group(1)) for line in lines]
    assert steps == sorted(set(range(10, 201, 10)) | set(range(25, 201, 25)))  # every 200 // 20, and each eval
    assert " val " not in lines[0] and "  val 4.0000  " in lines[steps.index(25)]


def test_bar_at_80_columns_keeps_the_step_count_and_eta():
    for width in (80, 60):
        buf = io.StringIO()
        console = Console(file=buf, width=width, force_terminal=True, color_system=None)
        p = Progress(True, 2000, 0, terminal=True, console=console)
        for s in range(1, 13):
            time.sleep(0.01)
            p.update(s, {**REC, "tokens": 64 * s, "val_loss": 4.2})
        p.close()
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
        last = [line for line in re.split(r"[\r\n]", text) if line.strip()][-1]
        assert len(last) <= width and re.search(r"train +12/2000 \d+:\d\d:\d\d ", last), last
        assert "tok/s" in last  # the text after the bar is cut, not the count or the ETA


@pytest.fixture()
def model(tmp_path):
    cfg = make_config(width=32, layers=1, vocab=256, context=16)
    (tmp_path / "t.txt").write_text(" ".join(f"the cat {i % 9} sees the dog." for i in range(3000)))
    return checkpoint.save_tensors(str(tmp_path / "a.safetensors"), cfg, [], init_model(cfg).tensors())


def wait_for(path, pattern, proc, seconds=120):
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None:
        found = re.findall(pattern, path.read_text())
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {pattern!r} in {path.read_text()[-2000:]} (exit {proc.poll()})")


def test_train_logs_to_a_file_while_running_and_ctrl_c_says_how_to_resume(tmp_path, model):
    run, log = tmp_path / "run", tmp_path / "stderr.txt"
    args = [model, "--data", tmp_path / "t.txt", "--out", run, "--steps", 100000, "--batch", 2, "--seq", 16]
    args += ["--eval-every", 10, "--save-every", 7, "--eval-batches", 1, "--device", "cpu"]
    cmd = [sys.executable, "-m", "growtool.cli", "train", *map(str, args)]
    with open(log, "w") as fh:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=fh, env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            wait_for(log, r"train step \d+/100000 .* ETA ", p)  # a line in the file, flushed, while the run runs
            assert p.poll() is None
            wait_for(log, r"train step (3\d)/", p)  # a few saves later
            p.send_signal(signal.SIGINT)
            out, _ = p.communicate(timeout=1800)
        finally:
            if p.poll() is None:
                p.kill()
    assert p.returncode == 130 and out == b""
    text = log.read_text()
    assert "\x1b[" not in text and "Traceback" not in text  # plain lines, no bar
    last = text.strip().splitlines()[-1]
    m = re.fullmatch(
        r"growtool: interrupted \(SIGINT\); the run resumes from step (\d+) \(its last save\) with: (.*)", last
    )
    assert m, last
    saved = torch.load(run / "last.pt", weights_only=True)["step"]
    assert int(m.group(1)) == saved and saved % 7 == 0 and saved >= 28
    resume = shlex.split(m.group(2))
    assert resume[0] == "growtool" and resume[1:] == cmd[3:] + ["--resume"]
    again = subprocess.run(
        [sys.executable, "-m", "growtool.cli", *resume[1:], "--stop-at", str(saved + 2), "-q"], capture_output=True
    )
    assert again.returncode == 0 and f"stopped at step {saved + 2}" in again.stderr.decode(), again.stderr


def test_plan_table_at_80_columns_shortens_tensor_names_from_the_left():
    from growtool.grow import recipes
    from growtool.grow.plan import build_plan
    from growtool.views import plan_tables

    plan = build_plan(make_config(width=32, layers=2, attn_gate=True), recipes.load("srio"), 48)
    buf = io.StringIO()
    console = Console(file=buf, width=80, color_system=None)
    for table in plan_tables(plan, 80):
        console.print(table)
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= 80
    names = [line.split("│")[1].strip() for line in lines if line.startswith("│") and line.split("│")[1].strip()]
    assert len(names) == len(plan.rows()) and len(set(names)) == len(names)  # one line each, all distinct
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert [n for n in names if n.startswith("…") and n.endswith(f"self_attn.{proj}.weight")], names
    assert "model.embed_tokens.weight" in names  # short names are left whole


def test_the_resume_line_quotes_the_command_and_adds_resume_once(monkeypatch):
    from growtool.console import Growtool, resume_note

    monkeypatch.setattr(Growtool, "argv", ["train", "my model.safetensors", "--data", "t.txt", "--out", "r"])
    assert resume_note(30) == (
        "the run resumes from step 30 (its last save) with: "
        "growtool train 'my model.safetensors' --data t.txt --out r --resume"
    )
    monkeypatch.setattr(Growtool, "argv", ["train", "a.safetensors", "--resume", "--out", "r"])
    assert resume_note(8).endswith("with: growtool train a.safetensors --resume --out r")
    assert resume_note(None) == "nothing saved yet: run the same command again to start over"


def test_a_line_at_least_every_thirty_seconds(monkeypatch):
    import time

    clock = iter(range(0, 10_000, 31))  # each update 31 s after the one before: a line for every one
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    buf = io.StringIO()
    p = Progress(True, 10_000, 0, terminal=False, stream=buf)
    for s in range(1, 6):
        p.update(s, {**REC, "tokens": 64 * s})
    assert [int(LINE.match(line).group(1)) for line in buf.getvalue().splitlines()] == [1, 2, 3, 4, 5]
