"""Refactors keep every byte: expand and fold outputs for 3 fixtures x 3 recipes x 2 dtypes hash the
same as those recorded on the reference commit (bench/results/byte_identity.json, recorded at
be6d48a, before the package moved into folders)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_outputs_hash_as_recorded_on_the_reference_commit():
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "byte_identity.py"),
            "--check",
            str(ROOT / "bench/results/byte_identity.json"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "27 of 27 outputs byte-identical" in r.stdout
