"""The small-init bench runs end to end in --quick mode on its own tiny text."""

import csv
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a bench smoke run: `python -m pytest -m slow` (CI's second command)

ROOT = Path(__file__).resolve().parent.parent


def test_small_init_quick(tmp_path):
    r = random.Random(0)
    words = ["the", "king", "shall", "not", "go", "to", "war", "my", "lord", "and", "her", "love", "is", "true"]
    text = "\n".join(" ".join(r.choice(words) for _ in range(r.randint(4, 12))) + "." for _ in range(600))
    data = tmp_path / "text.txt"
    data.write_text(text)
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "small_init.py"), "--quick", "--out", str(tmp_path), "--data", str(data)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    d = tmp_path / "small_init"
    for f in (
        "results.csv",
        "results.json",
        "summary.csv",
        "condensation.csv",
        "condensation.png",
        "token_compare.csv",
        "token_compare.png",
    ):
        assert (d / f).is_file() and (d / f).stat().st_size > 0, f
    res = json.loads((d / "results.json").read_text())
    runs = res["runs"]
    assert len(runs) == 4 and {r["gamma"] for r in runs} == {0.5, 1.0}
    for run in runs:
        assert run["steps"] == 20 and 0 < run["val_loss"] < 10
        assert (tmp_path / "tmp" / "small_init" / "runs" / run["name"] / "train" / "final.safetensors").is_file()
    rows = list(csv.DictReader(open(d / "token_compare.csv")))
    assert {r["setting"] for r in rows} == {"eps 1e-12, gate on", "eps 1e-05, gate off"}
    for setting in {r["setting"] for r in rows}:
        rs = [r for r in rows if r["setting"] == setting]
        assert [r["bin"] for r in rs] == ["0", "1", "2", "3", "4", "all"]
        assert sum(int(r["tokens"]) for r in rs[:-1]) == int(rs[-1]["tokens"])
        # the "all" row agrees with the trained models' own losses in results.json
        la = next(x["val_loss"] for x in runs if x["gamma"] == 0.5 and (x["gate"] == (setting.endswith("on"))))
        assert abs(float(rs[-1]["loss_a"]) - la) < 0.05
