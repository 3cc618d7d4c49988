"""Issue 40's pilot (``python bench/capacity.py --quick``) on a small generated .jsonl: scratch and each
variant run once, cached, and a second invocation runs nothing; every variant names real options."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from capacity import VARIANTS  # noqa: E402

from growtool.grow import recipes  # noqa: E402
from growtool.training.settings import Settings  # noqa: E402


def bench(*args):
    cmd = [sys.executable, str(ROOT / "bench" / "capacity.py"), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1800)


def test_every_variant_is_a_valid_recipe_and_train_options():
    for base, over, kw in VARIANTS.values():
        recipes.load(base, over)  # refuses unknown keys and bad values
        s = Settings(**kw)
        s.check()


def test_bench_capacity_quick(tmp_path):
    docs = tmp_path / "docs.jsonl"
    lines = [f"line {i}: the quick brown fox {i % 7} jumps over the lazy dog {i % 11}." for i in range(600)]
    docs.write_text("".join(json.dumps({"text": " ".join(lines[i : i + 30])}) + "\n" for i in range(0, 600, 30)))
    p = bench(docs, "--quick", "--out", tmp_path, "--variants", "srio,copy_pairs,srio_newopt")
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "capacity" / "results.json").read_text())
    runs = {r["run"]: r for r in res["rows"]}
    assert set(runs) == {"scratch", "srio", "copy_pairs", "srio_newopt"}
    for name, r in runs.items():
        assert r["val"] > 0 and r["flops"] > 0
        if name != "scratch":
            assert r["cos_median"] is not None and r["ffn_update_ratio"] is not None, r
            # equal FLOPs, up to whole steps (12 steps here: one step of the target is 1/12 of its run)
            assert abs(r["flops"] - runs["scratch"]["flops"]) / runs["scratch"]["flops"] < 0.1
    assert runs["copy_pairs"]["cos_median"] < 1.0  # cancelling pairs: copies are not clones
    cached = list((tmp_path / "capacity" / "cached").glob("*.json"))
    assert len(cached) == 4
    again = bench(docs, "--quick", "--out", tmp_path, "--variants", "srio,copy_pairs,srio_newopt")
    assert again.returncode == 0 and len(list((tmp_path / "capacity" / "cached").glob("*.json"))) == 4
    assert json.loads((tmp_path / "capacity" / "results.json").read_text())["rows"] == res["rows"]
