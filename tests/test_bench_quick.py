"""CI smoke runs of the speed benchmarks: ``python bench/<name>.py --quick --out TMP`` exits 0 and
writes its result files with numbers that hang together (no timing targets here: those are the
benchmarks' business, on a quiet machine)."""

import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from growtool.check import FLOAT32_K

pytestmark = pytest.mark.slow  # a bench smoke run: `python -m pytest -m slow` (CI's second command)

ROOT = Path(__file__).resolve().parent.parent


def run_bench(name: str, out: Path) -> Path:
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert name in p.stdout or "wrote" in p.stdout  # the table went to stdout
    return out / name


def files_ok(d: Path, names) -> None:
    for f in names:
        assert (d / f).is_file() and (d / f).stat().st_size > 0, f


def positive(*vals) -> bool:
    return all(math.isfinite(v) and v > 0 for v in vals)


def test_surgery_quick(tmp_path):
    d = run_bench("surgery", tmp_path)
    files_ok(d, ["surgery.csv", "steps.csv", "surgery.json", "surgery.png"])
    res = json.loads((d / "surgery.json").read_text())
    rows = {r["dtype"]: r for r in res["rows"]}
    assert set(rows) == {"float32", "bfloat16"}
    assert [r["dtype"] for r in csv.DictReader(open(d / "surgery.csv"))] == ["float32", "bfloat16"]
    for dt, size in (("float32", 4), ("bfloat16", 2)):
        r = rows[dt]
        # files hold the planned tensors: parameter count x dtype size, plus a header under 1 MB
        assert 0 < r["src_MB"] * 2**20 - r["params"] * size < 2**20
        assert 0 < r["out_MB"] * 2**20 - r["grown_params"] * size < 2**20
        assert 1.5 * r["params"] < r["grown_params"] < 2.25 * r["params"]  # 1.5x width
        assert positive(r["expand_s"], r["copy_s"], r["startup_s"], r["peak_rss_MB"])
        assert math.isclose(r["ratio"], r["expand_s"] / r["copy_s"])
        assert math.isclose(r["ratio_no_startup"], (r["expand_s"] - r["startup_s"]) / r["copy_s"])
        assert positive(r["pair_ratio"], r["growtool_startup_s"])  # the median of the per-pair ratios
        assert positive(r["import_only_s"])  # start-up without the interpreter's exit
        imports = r["import_runs_s"].split(";")  # timed in each pair, just before its expand
        assert len(imports) == len(r["expand_runs_s"].split(";")) == 1  # --quick: one pair
        assert math.isclose(r["pair_ratio_no_import"], (r["expand_s"] - r["import_only_s"]) / r["copy_s"])
        assert r["target_ok"] == (r["pair_ratio_no_import"] <= r["target"])
        assert r["rss_ok"] == (r["peak_rss_MB"] <= r["rss_target_MB"])
        # the expanding process held at least its largest output tensor
        assert r["peak_rss_MB"] > r["largest_out_MB"]
        assert math.isclose(r["rss_target_MB"], 3 * r["largest_out_MB"] + 512)
    assert rows["float32"]["params"] == rows["bfloat16"]["params"]
    for s in res["steps"]:  # the library's own expand, timed by its hook (growtool.surgery.run_expand)
        assert all(s[k] >= 0 for k in ("sha256_wait", "read", "grow", "save", "setup")) and s["grow"] > 0
        assert s["sha256_wait"] <= s["save"] <= s["total"] and math.isclose(
            s["setup"], s["total"] - s["save"], abs_tol=2e-3
        )
        assert s["read"] + s["grow"] <= s["producers"] * s["save"] + 1e-3  # thread time within the save's wall
    assert not list((tmp_path / "tmp").rglob("*.safetensors"))  # generated checkpoints removed


def test_throughput_quick(tmp_path):
    d = run_bench("throughput", tmp_path)
    files_ok(d, ["throughput.csv", "gates.csv", "throughput.json", "throughput.png"])
    res = json.loads((d / "throughput.json").read_text())
    sz = res["sizes"]
    assert res["threads"] >= 1
    rows = res["rows"]
    assert {(r["family"], r["impl"]) for r in rows} == {
        (f, i) for f in ("llama", "gpt2") for i in ("growtool.training.train", "growtool loop", "transformers loop")
    }
    for r in rows:
        assert positive(r["tok_s"], r["step_ms"], r["vs_transformers"])
        assert abs(r["tok_s"] * r["step_ms"] / 1000 - sz["batch"] * sz["seq"]) < 1e-6 * sz["batch"] * sz["seq"]
        assert r["steps_timed"] == sz["steps"] * sz["repeats"]
        if r["impl"] == "transformers loop":
            assert r["vs_transformers"] == 1.0
    assert len(list(csv.DictReader(open(d / "throughput.csv")))) == 6
    gates = res["gates"]
    assert [g["family"] for g in gates] == ["llama", "gpt2"]
    for g in gates:
        assert positive(g["gated_tok_s"], g["folded_tok_s"]) and math.isfinite(g["overhead"])
        assert g["overhead_ok"] == (g["overhead"] <= 0.10)
    detail = {(x["family"], "max_logit_diff_vs_hf" in x): x for x in res["detail"]}
    for fam in ("llama", "gpt2"):
        # the timed models compute the same function: ours vs transformers, gated at 0.5 vs folded at 0.5
        assert detail[(fam, True)]["max_logit_diff_vs_hf"] < 1e-4
        assert detail[(fam, False)]["max_logit_diff_gated_vs_folded"] < 1e-4


def test_verify_memory_quick(tmp_path):
    d = run_bench("verify_memory", tmp_path)
    row = json.loads((d / "verify_memory.json").read_text())["row"]
    assert row["pass"] and positive(row["verify_s"], row["verify_peak_rss_MB"])
    # the streamed figures are the whole-model ones up to float32 round-off: both are round-off here, so
    # another process summing in another order may move them by up to the multiple of the floor verify
    # allows (seen: 2.6e-6 against a floor of 4.8e-6); a streaming error would be orders larger
    assert row["whole_rel"] <= row["limit"], row
    assert abs(row["streamed_rel"] - row["whole_rel"]) <= FLOAT32_K * row["floor"], row


def test_write_small_quick(tmp_path):
    d = run_bench("write_small", tmp_path)
    files_ok(d, ["results.csv", "results.json"])
    res = json.loads((d / "results.json").read_text())
    assert res["inline_below_MB"] == 4 and [(r["width"], r["layers"]) for r in res["rows"]] == [(64, 2), (128, 4)]
    assert all(positive(r["output_MB"], r["writer_thread_ms"], r["producers_ms"]) for r in res["rows"])
    assert not list(d.glob("tmp-*"))  # its checkpoints are removed


def test_write_chunks_quick(tmp_path):
    d = run_bench("write_chunks", tmp_path)
    files_ok(d, ["results.csv", "results.json"])
    rows = json.loads((d / "results.json").read_text())["rows"]
    assert [r["how"] for r in rows[:5]] == [f"write() of {k} KB" for k in (256, 1024, 4096, 16384)] + [
        "shutil.copyfile"
    ]
    assert len(rows) == 10 and positive(*(r["seconds"] for r in rows))
    assert not list(d.glob("tmp-*"))  # the written files are removed


def test_surgery_against_another_growtool_quick(tmp_path):
    """``--against``: alternating expands, then folds, by two growtool programs (here the same one
    twice), with per-arm medians, per-pair gains and a check that both wrote the same bytes."""
    grow = str(Path(sys.executable).with_name("growtool"))
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "surgery.py"), "--quick", "--against", grow, "--repeats", "2"]
        + ["--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    d = tmp_path / "surgery"
    files_ok(d, ["against.csv", "against.json"])
    rows = json.loads((d / "against.json").read_text())["rows"]
    assert [r["command"] for r in rows] == ["expand", "fold"]
    for row in rows:
        assert row["pairs"] == 2 and row["other"] == grow and row["same_bytes"] is True
        for arm in ("this", "other"):
            assert positive(row[f"{arm}_wall_s"], row[f"{arm}_cpu_s"], row[f"{arm}_minflt"])
            assert len(row[f"{arm}_runs_s"].split(";")) == 2
    shm = Path("/dev/shm")
    assert not (list(shm.glob("growtool-against-*")) if shm.is_dir() else [])  # outputs removed


def test_fused_probe_quick(tmp_path):
    """bench/fused_probe.py: the C loop it times computes what growtool's torch path computes (all
    but a few elements equal, those within a rounding of the sums' order); its exact variants (torch's
    sums between two C passes; one loop with torch's summation order mirrored) give every byte; and
    each takes time."""
    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler")
    res = json.loads((run_bench("fused_probe", tmp_path) / "fused_probe.json").read_text())
    assert positive(res["torch_ms"], res["fused_ms"], res["output_rms"])
    assert res["elements_differing"] <= res["of"] // 1000
    assert res["max_abs_difference"] <= 0.05 * res["output_rms"]
    assert positive(res["exact_ms"], res["exact_fused_ms"])
    assert res["exact_elements_differing"] == 0
    assert res["lanes"] in (8, 16) and res["mirrored_sums_differing"] == 0 and res["mirrored_sums_of"] > 1000
    assert res["exact_fused_elements_differing"] == 0
