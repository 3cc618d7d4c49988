"""Smoke runs of bench/data.py and bench/schedules.py (``--quick``): they exit 0 and write numbers
that hang together (no speed or memory targets here: those are the benchmarks' business)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a bench smoke run: `python -m pytest -m slow` (CI's second command)

ROOT = Path(__file__).resolve().parent.parent


def run(name: str, out: Path, *extra) -> dict:
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py"), "--quick", "--out", str(out), *extra],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads((out / name / f"{name}.json").read_text())


def test_data_bench_quick(tmp_path):
    res = run("data", tmp_path, "--work", str(tmp_path / "work"))
    rows = {r["corpus"]: r for r in res["rows"]}
    assert set(rows) == {"jsonl", "text"}
    for r in rows.values():
        assert r["tokens"] > 0 and r["docs"] >= 1 and 0 < r["growtool_peak_rss_MB"] < 4096
        assert math.isclose(r["ratio"], r["growtool_MB_s"] / r["encode_batch_MB_s"])
        assert r["baseline_MB"] > 0.4  # the baselines encoded the whole (quick) corpus
    small, big = res["training"]
    assert big["peak_rss_MB"] > 0 and math.isclose(big["rss_vs_small"], big["peak_rss_MB"] / small["peak_rss_MB"])
    assert (tmp_path / "work").is_dir() and not list((tmp_path / "work").glob("corpus-*"))  # corpora removed


def test_schedules_bench_quick(tmp_path):
    src = tmp_path / "docs.jsonl"  # its own documents: the tests never read ../shared
    words = "the growth of a model keeps its function while the width and depth change".split()
    docs = [" ".join(words[(i + j) % len(words)] for j in range(400)) for i in range(40)]
    src.write_text("".join(json.dumps({"source": f"d{i}", "text": t}) + "\n" for i, t in enumerate(docs)))
    res = run("schedules", tmp_path, "--seeds", "0", "--source", src)
    (row,) = res["rows"]
    assert row["wsd_minus_cosine"] == row["wsd_val"] - row["cosine_val"]
    assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("wsd_val", "cosine_val"))
