"""Byte identity of growtool's outputs across code changes: the sha256 of every expand (and a fold of
each) for the fixtures x recipes x dtypes, recorded once and checked after a refactor.

    python bench/byte_identity.py --record bench/results/byte_identity.json   # on the reference commit
    python bench/byte_identity.py --check bench/results/byte_identity.json    # after the change

The commands run in this process through growtool's command line (``growtool.cli.main``), so the
script works on any checkout whose command line takes these flags. ``--checkout DIR`` imports the
growtool of another checkout (put first on ``sys.path``) instead of the installed one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ("gpt2-tied", "llama-gated", "llama-gqa")
RECIPES = ("srio", "nrio", "copy")
DTYPES = ("float32", "bfloat16")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def outputs(work: Path) -> dict[str, str]:
    """Run every case; returns case name -> sha256 of its output file."""
    from growtool.cli import main

    def grow(args: list[str]) -> None:
        code = main.main(args, standalone_mode=False)
        if code not in (None, 0):
            raise SystemExit(f"growtool {' '.join(args)} exited with {code}")

    found = {}
    for fx in FIXTURES:
        src = ROOT / "fixtures" / f"{fx}.safetensors"
        for recipe in RECIPES:
            for dtype in DTYPES:
                name = f"{fx}-{recipe}-{dtype}"
                out = work / f"{name}.safetensors"
                grow(["expand", str(src), "--width", "96", "--recipe", recipe, "--dtype", dtype, "-o", str(out), "-q"])
                found[name] = sha256(out)
                if dtype == "float32":
                    folded = work / f"{name}-fold.safetensors"
                    grow(["fold", str(out), "--alpha", "0.5", "-o", str(folded), "-q"])
                    found[f"{name}-fold"] = sha256(folded)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--record", type=Path, help="write the hashes to this JSON file")
    group.add_argument("--check", type=Path, help="compare against the hashes in this JSON file")
    ap.add_argument("--checkout", type=Path, help="import growtool from this checkout")
    args = ap.parse_args()
    if args.checkout:
        sys.path.insert(0, str(args.checkout.resolve()))
    with tempfile.TemporaryDirectory() as tmp:
        found = outputs(Path(tmp))
    if args.record:
        args.record.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(found)} hashes in {args.record}")
        return 0
    want = json.loads(args.check.read_text())
    differ = sorted(k for k in want if found.get(k) != want[k])
    for k in differ:
        print(f"DIFFERENT {k}: {found.get(k)} != {want[k]}")
    print(f"{len(want) - len(differ)} of {len(want)} outputs byte-identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
