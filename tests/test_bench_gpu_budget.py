"""bench/gpu_budget.py --quick on the CPU: the GPU study's own dry run (a BPE tokenizer trained on the
text; at each peak LR scratch at two budgets and a grown run at scratch's FLOPs with the base counted;
every run cached; --deadline skips what would not fit)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a bench smoke run: `python -m pytest -m slow`

ROOT = Path(__file__).resolve().parents[1]


def gpu_budget(data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_budget.py"), "--quick", "--data", str(data), "--out", str(out)]
    return subprocess.run([*cmd, *extra], capture_output=True, text=True)


def test_gpu_budget_dry_run_on_cpu(tmp_path):
    docs = tmp_path / "docs.jsonl"
    words = "the quick brown fox jumps over a lazy dog while the kernel module returns a value".split()
    docs.write_text("".join(json.dumps({"text": " ".join(words[(i + j) % len(words)] for j in range(150))}) + "\n"
                            for i in range(200)))  # fmt: skip
    p = gpu_budget(docs, tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "gpu_budget" / "results.json").read_text())
    runs, rows = res["runs"], res["rows"]
    names = ("scratch", "scratch_half", "grown")
    assert sorted(runs) == sorted(f"{n}@{lr}" for n in names for lr in ("0.003", "0.006"))
    for lr in ("0.003", "0.006"):  # both arms at each LR of --lrs
        full, half, grown = (runs[f"{n}@{lr}"] for n in names)
        assert abs(half["flops"] / full["flops"] - 0.5) < 0.05
        assert abs(grown["flops"] / full["flops"] - 1) < 0.05  # the base phase counted
    assert [r["lr"] for r in rows[:2]] == ["0.003", "0.006"] and rows[2]["lr"].startswith("tuned ")
    best = min(runs[f"grown@{lr}"]["val"] for lr in ("0.003", "0.006"))
    assert rows[2]["grown_val"] == best and all(r["saved"].rstrip("%").lstrip("<>") for r in rows)
    assert rows[0]["grow_at"] == "0.12:layers=2,method=stack"  # the best schedule: stacking 1 -> 2 layers at 12%
    assert res["machine"]["epochs"] > 0 and res["machine"]["corpus_tokens"] > 0
    assert len(list((tmp_path / "gpu_budget" / "cached").glob("*.json"))) == 6
    assert any(f.name.startswith("bpe-300-") for f in (tmp_path / "gpu_budget" / "cache").iterdir())
    p = gpu_budget(docs, tmp_path)  # every run cached: nothing trains again
    assert p.returncode == 0 and json.loads((tmp_path / "gpu_budget" / "results.json").read_text())["runs"] == runs


def test_gpu_budget_deadline_skips_what_would_not_fit(tmp_path):
    docs = tmp_path / "docs.txt"
    docs.write_text(" ".join("the quick brown fox jumps over a lazy dog".split()[i % 9] for i in range(3000)))
    p = gpu_budget(docs, tmp_path, "--deadline", "1e-9")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "skipped" in p.stdout  # the first run always runs; the next would end past the deadline
    runs = json.loads((tmp_path / "gpu_budget" / "results.json").read_text())["runs"]
    assert list(runs) == ["scratch@0.003"]
