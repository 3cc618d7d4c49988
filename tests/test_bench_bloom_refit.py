"""bench/bloom_refit.py --quick: a BLOOM grown by the refit (1.5x, --untie) and by the copy (2x) starts
training at its source's validation loss (growth kept the function), the runs are the seven the
bench names, and a second invocation reuses every run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a bench smoke run: `python -m pytest -m slow` (CI's second command)

ROOT = Path(__file__).resolve().parent.parent
GPT2 = ["gpt2-base-phase", "gpt2-grown", "gpt2-scratch-flops"]


def run(out, data):
    cmd = [sys.executable, str(ROOT / "bench" / "bloom_refit.py"), "--quick", "--out", str(out), "--data", str(data)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads((out / "bloom_refit" / "results.json").read_text())


def test_bloom_refit_quick(tmp_path):
    data = tmp_path / "t.txt"
    data.write_text("".join(f"line {i} of a small text, with words to learn.\n" for i in range(3000)))
    res = run(tmp_path, data)
    rows, base, gpt2 = {r["run"]: r for r in res["rows"]}, res["bases"]["0"]["bloom"], res["bases"]["0"]["gpt2"]
    runs = tmp_path / "tmp" / "bloom_refit" / "seed0"
    assert set(rows) == {"refit", "copy", "base", "scratch", "scratch-flops", "gpt2-grown", "gpt2-scratch-flops"}
    assert abs(rows["gpt2-grown"]["start_val_loss"] - gpt2) <= 1e-4
    assert abs(rows["scratch-flops"]["flops"] / rows["refit"]["flops"] - 1) <= 0.05
    assert not rows["refit"]["tied"] and rows["copy"]["tied"]
    for name in ("refit", "copy", "base"):  # the first evaluation of a grown run is its source's function
        assert abs(rows[name]["start_val_loss"] - base) <= 1e-4
    assert abs(rows["scratch"]["start_val_loss"] - base) > 1e-2
    assert rows["refit"]["params"] == rows["scratch"]["params"]
    folders = sorted(p.parent.name for p in runs.glob("*/summary.json"))
    assert folders == sorted(["base", "base-phase", "copy", "refit", "scratch", "scratch-flops"] + GPT2)
    stamps = {f: (runs / f / "summary.json").stat().st_mtime_ns for f in folders}
    assert run(tmp_path, data)["rows"] == res["rows"]  # every run reused
    assert stamps == {f: (runs / f / "summary.json").stat().st_mtime_ns for f in folders}
