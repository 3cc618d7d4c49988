"""The recipes benchmark's CI smoke run: ``python bench/recipes.py --quick`` on a small generated text."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a bench smoke run: `python -m pytest -m slow` (CI's second command)

ROOT = Path(__file__).resolve().parent.parent


def test_bench_recipes_quick(tmp_path):
    text = tmp_path / "corpus.txt"
    lines = [f"line {i}: the quick brown fox {i % 7} jumps over the lazy dog {i % 11}.\n" for i in range(800)]
    text.write_text("".join(lines))
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "recipes.py"), str(text), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    d = tmp_path / "recipes"
    for f in ("results.csv", "runs.csv", "results.json", "curves.png"):
        assert (d / f).is_file() and (d / f).stat().st_size > 0, f
    rows = list(csv.DictReader(open(d / "results.csv")))
    assert [r["recipe"] for r in rows] == ["nrio", "srio", "srio_lo", "ligo", "scratch"]
    res = json.loads((d / "results.json").read_text())
    assert res["settings"]["quick"] and res["best_recipe"] in {"nrio", "srio", "srio_lo", "ligo"}
    by = {r["recipe"]: r for r in res["rows"]}
    # function-preserving recipes start the growth phase at the base model's final validation loss
    base_val = res["base"][0]["val"]
    for name in ("nrio", "srio", "srio_lo"):
        assert abs(by[name]["start_val_mean"] - base_val) < 1e-4, name
    assert 0.0 < by["srio_lo"]["eps_mean"] < 1.0 and by["srio"]["eps_mean"] == (32 / 48) ** 0.5
    # the scratch model gets the same FLOPs as base + growth phase
    s = res["settings"]
    assert (
        abs(s["scratch_tokens"] * s["params_wide"] - s["phase_tokens"] * (s["params_small"] + s["params_wide"]))
        <= s["params_wide"]
    )
