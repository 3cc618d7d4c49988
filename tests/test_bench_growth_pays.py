"""The growth-pays benchmark's CI smoke run: ``python bench/growth_pays.py --quick`` on a small generated text."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from growth_pays import DEFAULT_VARIANTS  # noqa: E402

pytestmark = pytest.mark.slow  # a bench smoke run: `python -m pytest -m slow` (CI's second command)


def test_bench_growth_pays_quick(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text(
        "".join(f"line {i}: the quick brown fox {i % 7} jumps over the lazy dog {i % 11}.\n" for i in range(800))
    )
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "growth_pays.py"), str(text), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    d = tmp_path / "growth_pays"
    for f in ("results.csv", "runs.csv", "results.json", "curves.png"):
        assert (d / f).is_file() and (d / f).stat().st_size > 0, f
    rows = list(csv.DictReader(open(d / "results.csv")))
    one = DEFAULT_VARIANTS.split(",")
    assert [(r["family"], r["variant"]) for r in rows] == [("gpt2", v) for v in one] + [
        ("llama", v) for v in one + ["multi", "one_2x", "scratch_2x"]
    ]
    res = json.loads((d / "results.json").read_text())
    runs = {(r["family"], r["variant"]): r for r in res["runs"]}
    P, n = res["settings"], res["settings"]["params"]
    # FLOPs count the base phase: a carried run costs T tokens at each width, scratch the same FLOPs
    for fam in ("llama", "gpt2"):
        want = 6 * P["tokens"] * (n[fam]["32"] + n[fam]["48"])
        assert abs(runs[(fam, "carry_srio")]["flops"] - want) / want < 1e-3
        step = 6 * n[fam]["48"] * P["batch"] * P["seq"]  # scratch's tokens are rounded up to whole steps
        assert 0 <= runs[(fam, "scratch")]["flops"] - want < step
        assert abs(runs[(fam, "reset_srio")]["flops"] - want) / want < 1e-3
    multi = runs[("llama", "multi")]
    want = 6 * P["tokens"] * (n["llama"]["32"] + n["llama"]["48"] + n["llama"]["64"])
    assert abs(multi["flops"] - want) / want < 1e-3
    # the curves are cumulative FLOPs: increasing
    for r in res["runs"]:
        f = [c[0] for c in r["curve"]]
        assert all(b > a for a, b in zip(f, f[1:])), (r["family"], r["variant"])
