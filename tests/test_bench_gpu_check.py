"""bench/gpu_check.py --device cpu --quick: the GPU check's own dry run, so that the script a lent GPU
machine runs works before one is lent. Its checks (bitwise reruns, stop/resume and torchrun, a
growth inside the run) hold on the CPU too."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a bench smoke run: `python -m pytest -m slow` (CI's second command)

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_on_cpu(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(
        " ".join(
            f"the {w} went to the {v} on day {i % 9}."
            for i, (w, v) in enumerate(zip(["cat", "dog", "owl", "fox"] * 150, ["sea", "hill", "town"] * 200))
        )
    )
    out = tmp_path / "out"
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_check.py"),
            "--data",
            str(text),
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((out / "gpu_check.json").read_text())
    checks = res["checks"]
    assert checks["compile completes, loss falls"] is None  # not run with --quick
    ran = {k: v for k, v in checks.items() if v is not None}
    assert len(ran) == 6 and all(ran.values()), (ran, p.stdout[-2000:])
    assert res["full"]["sha256"] == res["resume"]["sha256"]
    assert "throughput" not in res
