"""bench/attn_gates.py: the gate statistics on hand-set gates, the refusal of an ungated target, and
(slow) its run on a small generated text."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from attn_gates import openness  # noqa: E402
from budget import QUICK  # noqa: E402
from growth_pays import _config  # noqa: E402

from growtool.init import init_model  # noqa: E402
from growtool.io import checkpoint  # noqa: E402


def _docs(tmp_path) -> Path:
    docs = tmp_path / "docs.jsonl"
    lines = [f"line {i}: the quick brown fox {i % 7} jumps over the lazy dog {i % 11}." for i in range(900)]
    docs.write_text("".join(json.dumps({"text": " ".join(lines[i : i + 30])}) + "\n" for i in range(0, 900, 30)))
    return docs


def test_openness_reads_each_blocks_gates_for_old_and_new_heads(tmp_path):
    """Gates with W_g = 0 are sigmoid(b): 0.5 where b = 0, under 0.1 everywhere where b = -20 (the heads
    from index 2 on here, as new heads), block by block."""
    cfg = _config({**QUICK, "gpt2_gate": 1}, "gpt2", 32)  # 4 heads of 8, biases on
    m = init_model(cfg, gamma=0.5, seed=0)
    with torch.no_grad():
        for layer, b in enumerate(m.blocks):
            b.slot["g"].weight.zero_()
            b.slot["g"].bias.zero_()
            if layer == 1:
                b.slot["g"].bias[2:] = -20.0
    path = checkpoint.save_tensors(str(tmp_path / "g.safetensors"), cfg, [{"op": "init"}], m.tensors(), force=True)
    ids = torch.randint(0, cfg.vocab_size, (3, 16), generator=torch.Generator().manual_seed(0))
    rows = openness(path, ids, old=2)
    assert [r["block"] for r in rows] == list(range(cfg.layers))
    assert rows[0] == {"block": 0, "old_mean": 0.5, "old_closed": 0.0, "new_mean": 0.5, "new_closed": 0.0}
    assert rows[1]["old_mean"] == 0.5 and rows[1]["new_mean"] < 1e-4 and rows[1]["new_closed"] == 1.0
    assert openness(path, ids, old=cfg.heads)[0]["new_mean"] is None  # no new heads: nothing to report


def test_an_ungated_target_is_refused(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "attn_gates.py"), str(_docs(tmp_path)), "--quick", "--out", str(tmp_path)]
        + ["--families", "gpt2", "--variants", "width2x@0.3/paper"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "gpt2: this target has no gated attention" in r.stderr, r.stderr[-500:]


@pytest.mark.slow  # trains: `python -m pytest -m slow`
def test_attn_gates_quick_follows_one_width_growth(tmp_path):
    args = ["--quick", "--out", str(tmp_path), "--families", "llama", "--budgets", "0.04"]
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "attn_gates.py"), str(_docs(tmp_path)), *args]
        + ["--variants", "width2x@0.3/paper"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "attn_gates" / "gates.csv")))
    models = ["at the growth (narrow)", "just grown", "grown, end", "scratch, end"]
    assert [r["model"] for r in rows] == [m for m in models for _ in range(QUICK["layers"])]
    narrow, grown = rows[: QUICK["layers"]], rows[QUICK["layers"] : 2 * QUICK["layers"]]
    assert all(r["new_mean"] == "" for r in narrow) and all(r["new_mean"] != "" for r in grown)
    for a, b in zip(narrow, grown):  # one step apart: the old heads' gates barely move
        assert abs(float(a["old_mean"]) - float(b["old_mean"])) < 0.02
    assert not (tmp_path / "attn_gates" / "work").exists()
