"""bench/gpu_budget.py --quick on the CPU: the GPU study's own dry run (a BPE tokenizer trained on the
text, scratch at two budgets, one grown run at scratch's FLOPs with the base counted, every run cached)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a bench smoke run: `python -m pytest -m slow`

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_budget_dry_run_on_cpu(tmp_path):
    docs = tmp_path / "docs.jsonl"
    words = "the quick brown fox jumps over a lazy dog while the kernel module returns a value".split()
    docs.write_text("".join(json.dumps({"text": " ".join(words[(i + j) % len(words)] for j in range(150))}) + "\n"
                            for i in range(200)))  # fmt: skip
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "gpu_budget.py"),
        "--quick",
        "--data",
        str(docs),
        "--out",
        str(tmp_path),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "gpu_budget" / "results.json").read_text())
    runs, row = res["runs"], res["row"]
    assert abs(runs["scratch_half"]["flops"] / runs["scratch"]["flops"] - 0.5) < 0.05
    assert abs(runs["grown"]["flops"] / runs["scratch"]["flops"] - 1) < 0.05  # the base phase counted
    assert row["saved"].rstrip("%").lstrip("<>") and row["grown_val"] == runs["grown"]["val"]
    assert row["grow_at"] == "0.12:layers=2,method=stack"  # the best schedule: stacking 1 -> 2 layers at 12%
    assert len(list((tmp_path / "gpu_budget" / "cached").glob("*.json"))) == 3
    assert any(f.name.startswith("bpe-300-") for f in (tmp_path / "gpu_budget" / "cache").iterdir())
    p = subprocess.run(cmd, capture_output=True, text=True)  # every run cached: nothing trains again
    assert p.returncode == 0 and json.loads((tmp_path / "gpu_budget" / "results.json").read_text())["runs"] == runs
