"""``growtool demo --quick``: the whole story runs, verify passes after each growth, and story.png
draws it (its content: tests/test_story.py)."""

import json
import math

import pytest

from growtool.demo import make_corpus
from growtool.io import checkpoint

from helpers import cli


def test_demo_quick(tmp_path):
    r = cli("demo", "--quick", "--out", tmp_path / "demo")
    assert r.exit_code == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "demo" / "summary.json").read_text())
    stages = s["stages"]
    assert s["ok"] and [x["stage"].split()[0] for x in stages] == [
        "init",
        "train",
        "expand",
        "train",
        "expand",
        "train",
    ]
    widths = [x["width"] for x in stages]
    assert widths[0] < widths[2] < widths[4] and widths[2:4] == [widths[2]] * 2
    for i, x in enumerate(stages):
        if x["stage"].startswith("expand"):
            assert x["pass"] == "PASS" and x["verify_rel"] <= 1e-4
            assert x["val_loss"] == pytest.approx(stages[i - 1]["val_loss"], rel=1e-5)  # function kept
            assert checkpoint.load(x["path"]).config.gated
        if x["stage"].startswith("train"):
            assert not checkpoint.load(x["path"]).config.gated  # gates folded away
    losses = [x["val_loss"] for x in stages]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[1] < losses[0]
    # the table on stderr says the same
    rows = [line for line in r.stderr.splitlines() if "expand" in line and "│" in line]
    assert len(rows) == 2 and all("PASS" in line for line in rows)
    # the whole story in one picture: story.png, named in the summary
    story = tmp_path / "demo" / "story.png"
    assert s["story"] == str(story) and story.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "story.png" in r.stderr.replace("\n", "")
    # and refuses to overwrite a previous demo
    again = cli("demo", "--quick", "--out", tmp_path / "demo")
    assert again.exit_code == 2 and "not empty" in again.stderr


def test_corpus_is_deterministic_text():
    a, b = make_corpus(5000, seed=0), make_corpus(5000, seed=0)
    assert a == b and a != make_corpus(5000, seed=1) and len(a) >= 5000
    assert a.isascii() and a.count(".") > 50
