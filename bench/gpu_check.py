"""The trainer on a CUDA GPU, through the CLI a user runs: the checks CPU machines cannot make.

On a text file it creates a small gated Llama (``growtool init``), then, each step a subprocess
with a time limit, and every result kept (one failure does not stop the rest):

1. ``full``: ``growtool train --device cuda --deterministic`` for 60 steps with a growth inside the
   run (``--grow-at 0.5:192``, optimizer carried): val loss first -> last, seconds, tokens/s;
2. ``again``: the same command again: the final checkpoint must be bitwise the same (sha256);
3. ``resume``: the same run stopped at step 25 (``--stop-at``) and resumed (``--resume``): bitwise
   the same final checkpoint as ``full`` (the claim of ``--deterministic``);
4. ``torchrun``: the same run under ``torchrun --nproc_per_node 1`` (NCCL process group, DDP):
   completes; whether it equals ``full`` is reported, not required;
5. ``compile`` (not with ``--quick``): 20 steps with ``--compile``: completes, loss falls;
6. ``sample``: ``growtool sample --device cuda`` of the final checkpoint: text comes out;
7. ``throughput`` (not with ``--quick``): a GPT-2-small-shaped model (d768, 12 layers, byte
   vocabulary) for 40 steps of 32 x 512 tokens, bf16 autocast: median tokens/s after step 5 and
   the model FLOPs utilisation against ``--peak-tflops`` (6 x parameters + attention per token).

``--device cpu`` runs the same checks on the CPU (a dry run of this script; ``--deterministic`` is
left out there: CPU runs repeat without it). ``--quick``: 12 steps of 8 x 64 tokens (growth at step
6, stop at 5), no ``--compile`` and no throughput run (``tests/test_bench_gpu_check.py`` runs it).
Writes ``gpu_check.json`` under ``--out`` and prints a table.

    python bench/gpu_check.py --data ../shared/data/tinyshakespeare.txt            # on the GPU machine
    python bench/gpu_check.py --data ../shared/data/tinyshakespeare.txt --device cpu --quick
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
GROWTOOL = [str(BIN / "growtool")] if (BIN / "growtool").exists() else [sys.executable, "-m", "growtool.cli"]
TRAIN = ["--steps", "60", "--batch", "16", "--seq", "128", "--grow-at", "0.5:192", "--eval-every", "10"]
QUICK = ["--steps", "12", "--batch", "8", "--seq", "64", "--grow-at", "0.5:192", "--eval-every", "4"]


def sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run(cmd: list[str], timeout: float) -> dict:
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", e.stdout or "", e.stderr or ""
        out, err = (x.decode() if isinstance(x, bytes) else x for x in (out, err))
    return {"rc": rc, "seconds": round(time.time() - t0, 2), "stdout": out.strip(), "stderr_tail": err.strip()[-1500:]}


def metrics(folder: Path) -> dict:
    recs = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    val = [r["val_loss"] for r in recs if "val_loss" in r]
    tok = [r["tok_s"] for r in recs if "tok_s" in r][5:] or [0.0]
    return {"first_val": val[0], "last_val": val[-1], "median_tok_s": round(statistics.median(tok))}


def train(base: Path, data: str, out: Path, extra: list[str], device: str, timeout: float, launcher=()) -> dict:
    cmd = [*launcher, *(GROWTOOL if not launcher else ["-m", "growtool.cli"]), "train", str(base), "--data", data]
    r = run([*cmd, *extra, "--device", device, "--out", str(out), "-q"], timeout)
    final = r["stdout"].splitlines()[-1] if r["rc"] == 0 and r["stdout"] else None
    if final and Path(final).exists():
        r.update(metrics(out), final=final, sha256=sha(final))
    return r


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/gpu_check.py", description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="a text file")
    p.add_argument("--out", default="bench/results/gpu_check")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="12 steps; no --compile or throughput run")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for MFU (H100/H200 SXM: 989)")
    a = p.parse_args()
    out = Path(a.out)
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    dev, res = a.device, {}
    det = ["--deterministic"] if dev == "cuda" else []
    try:
        import torch

        res["machine"] = {
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        }
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        res["machine"] = {"error": repr(e)}
    try:
        base = work / "base.safetensors"
        init = [*GROWTOOL, "init", "--family", "llama", "--width", "128", "--layers", "4", "--heads", "4"]
        res["init"] = run([*init, "--kv-heads", "2", "--vocab", "256", "--context", "256", "-o", str(base)], 120)
        args, stop_at = ([*QUICK, *det], "5") if a.quick else ([*TRAIN, *det], "25")
        res["full"] = train(base, a.data, work / "full", args, dev, 300)
        res["again"] = train(base, a.data, work / "again", args, dev, 300)
        stop = train(base, a.data, work / "resume", [*args, "--stop-at", stop_at], dev, 300)
        res["resume"] = train(base, a.data, work / "resume", [*args, "--resume"], dev, 300)
        res["resume"]["first_part_rc"] = stop["rc"]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
        res["torchrun"] = train(base, a.data, work / "torchrun", args, dev, 300, launcher=torchrun)
        if not a.quick:
            compile_args = ["--steps", "20", "--batch", "16", "--seq", "128", "--eval-every", "10", "--compile"]
            res["compile"] = train(base, a.data, work / "compile", compile_args, dev, 400)
        if res["full"].get("final"):
            s = [*GROWTOOL, "sample", res["full"]["final"], "--prompt", "ROMEO:", "--max-tokens", "40", "--device", dev]
            res["sample"] = run(s, 120)
        if not a.quick:
            big = work / "gpt2.safetensors"
            res["throughput_init"] = run(
                [*GROWTOOL, "init", "--family", "gpt2", "--width", "768", "--layers", "12", "--heads", "12"]
                + ["--vocab", "256", "--context", "512", "--no-attn-gate", "-o", str(big)],
                120,
            )
            t_args = [
                "--steps",
                "40",
                "--batch",
                "32",
                "--seq",
                "512",
                "--lr",
                "6e-4",
                "--eval-every",
                "40",
                "--save-every",
                "40",
            ]
            t = res["throughput"] = train(big, a.data, work / "throughput", t_args, dev, 400)
            if t.get("median_tok_s"):
                from growtool.io import checkpoint

                cfg = checkpoint.load(str(big)).config
                t["params"] = cfg.n_params()
                per_token = 6 * t["params"] + 12 * cfg.layers * cfg.width * 512  # PaLM's count: weights + attention
                t["mfu"] = round(t["median_tok_s"] * per_token / (a.peak_tflops * 1e12), 4)
    finally:  # also after Ctrl-C / timeout -s INT: what ran is reported
        report(res, out)


def report(res: dict, out: Path) -> None:
    def r(k: str) -> dict:
        return res.get(k, {})

    checks = {
        "full trains (loss falls)": r("full").get("last_val", 9) < r("full").get("first_val", 0),
        "again: bitwise equal": r("again").get("sha256") == r("full").get("sha256") is not None,
        "resume: bitwise equal": r("resume").get("sha256") == r("full").get("sha256") is not None,
        "torchrun (1 process) completes": r("torchrun").get("sha256") is not None,
        "torchrun equals full": r("torchrun").get("sha256") == r("full").get("sha256") is not None,
        "compile completes, loss falls": r("compile").get("last_val", 9) < r("compile").get("first_val", 0)
        if "compile" in res
        else None,
        "sample prints text": bool(r("sample").get("stdout")),
    }
    res["checks"] = checks
    (out / "gpu_check.json").write_text(json.dumps(res, indent=2) + "\n")
    print(f"{'check':34} result")
    for k, v in checks.items():
        print(f"{k:34} {'not run' if v is None else 'yes' if v else 'NO'}")
    for k in ("full", "again", "resume", "torchrun", "compile", "throughput"):
        x = res.get(k)
        if x:
            fig = f"val {x.get('first_val', float('nan')):.3f} -> {x.get('last_val', float('nan')):.3f}"
            print(f"{k:10} rc {x['rc']} {x['seconds']:7.1f} s  {fig}  {x.get('median_tok_s', 0):,} tok/s", end="")
            print(f"  MFU {x['mfu']:.1%}" if "mfu" in x else "")
            if x["rc"] != 0:
                print("   " + x["stderr_tail"][-600:].replace("\n", "\n   "))


if __name__ == "__main__":
    main()
