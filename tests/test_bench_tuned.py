"""``bench/tuned.py`` on two ``bench/growth_pays.py --quick`` runs at different peak LRs: it picks each
variant's best LR by mean final loss and measures compute saved against scratch at scratch's best LR;
runs of other sizes are refused."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a bench smoke run: `python -m pytest -m slow` (CI's second command)

ROOT = Path(__file__).resolve().parent.parent


def _bench(*args, cwd):
    p = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True)
    return p


def test_tuned_picks_the_best_lr_per_variant(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("".join(f"line {i}: a small text {i % 5} about {i % 9} things.\n" for i in range(600)))
    files = []
    for lr in ("0.003", "0.03"):
        p = _bench(
            ROOT / "bench" / "growth_pays.py", text, "--quick", "--lr", lr, "--out", tmp_path / lr,
            "--variants", "carry_srio_rewarm,scratch", "--multi-family", "", cwd=ROOT,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr[-2000:]
        files.append(tmp_path / lr / "growth_pays" / "results.json")
    p = _bench(ROOT / "bench" / "tuned.py", *files, "--out", tmp_path, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "tuned" / "results.csv")))
    assert {(r["family"], r["variant"], r["lr"]) for r in rows} == {
        (f, v, lr) for f in ("gpt2", "llama") for v in ("carry_srio_rewarm", "scratch") for lr in ("0.003", "0.03")
    }
    for fam in ("gpt2", "llama"):
        for v in ("carry_srio_rewarm", "scratch"):
            mine = [r for r in rows if r["family"] == fam and r["variant"] == v]
            best = min(mine, key=lambda r: float(r["val_mean"]))
            assert [r["best"] for r in mine].count("True") == 1 and best["best"] == "True", mine
        grown = [r for r in rows if r["family"] == fam and r["variant"] == "carry_srio_rewarm"]
        scratch_best = next(
            r["lr"] for r in rows if r["family"] == fam and r["variant"] == "scratch" and r["best"] == "True"
        )
        assert all(r["vs"] == f"scratch @ {scratch_best}" for r in grown)
        for r in grown:  # one seed: the per-seed figure is the mean, or "n.r." (not reached)
            assert (
                r["saved_per_seed"] == "n.r."
                or abs(float(r["saved_per_seed"][:-1]) / 100 - float(r["saved_mean"])) < 1e-3
            )
    other = json.loads(files[1].read_text())
    other["settings"]["width"] = 999
    (tmp_path / "other.json").write_text(json.dumps(other))
    p = _bench(ROOT / "bench" / "tuned.py", files[0], tmp_path / "other.json", "--out", tmp_path, cwd=ROOT)
    assert p.returncode != 0 and "other sizes" in p.stderr
