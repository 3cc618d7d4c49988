"""verify in bounded memory: ``growtool verify`` of a ~1 GB float32 Llama checkpoint (d1024, 16
layers, untied 32,000-token vocabulary: the embedding and head are its largest tensors) against its
1.5x growth (~1.9 GB), peak RSS of the command (target <= 1.0 GB), and its figures against a
whole-model comparison (both models in memory, in this process) on the same inputs; with the
float32 floor verify measured (the source's own float32 round-off) and its limit.

``--quick`` uses a ~10 MB checkpoint (a smoke run for the tests).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from common import MB, machine, parse_args, run_measured, table, write_json
from surgery import GROWTOOL, llama_config, write_random_checkpoint

from growtool.check import compare, random_batches
from growtool.io import checkpoint
from growtool.nn.config import ModelConfig

GB = 1024**3


def main():
    args = parse_args("verify_memory", __doc__)
    cfg = llama_config(False)  # 246M parameters, 0.98 GB in float32
    if args.quick:
        cfg = ModelConfig("llama", 4000, 256, 4, 4, 2, 64, 704, context=256, norm_eps=1e-5, tie=False)
    width = cfg.width * 3 // 2
    tmp = Path(args.out) / "tmp" / "verify_memory"
    tmp.mkdir(parents=True, exist_ok=True)
    src, out = tmp / "src.safetensors", tmp / "grown.safetensors"
    try:
        write_random_checkpoint(src, cfg, torch.float32)
        m = run_measured([GROWTOOL, "expand", str(src), "--width", str(width), "-o", str(out), "-q"])
        if m["rc"]:
            raise SystemExit(f"expand failed: {m['stderr'][-2000:]}")
        v = run_measured([GROWTOOL, "verify", str(src), str(out), "--samples", "16", "--json", "-q"])
        if v["rc"] not in (0, 1):
            raise SystemExit(f"verify failed: {v['stderr'][-2000:]}")
        rep = json.loads(v["stdout"])
        streamed = rep["results"][0]
        a, b = checkpoint.load(str(src)), checkpoint.load(str(out))
        x = random_batches(cfg.vocab_size, min(a.config.context, b.config.context), 16, 0)
        whole = compare(a.model(), b.model(), x, 0.0)
        row = {
            "src_MB": src.stat().st_size / MB,
            "grown_MB": out.stat().st_size / MB,
            "verify_s": v["wall_s"],
            "verify_peak_rss_MB": v["peak_rss"] / MB,
            "target_MB": 1.0 * GB / MB,
            "rss_ok": v["peak_rss"] <= 1.0 * GB,
            "pass": rep["pass"],
            "floor": rep["floor"],
            "limit": rep["limit"],
            "streamed_max_dlogit": streamed["max_dlogit"],
            "whole_max_dlogit": whole.max_dlogit,
            "streamed_rel": streamed["rel"],
            "whole_rel": whole.rel,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_json(args.dir / "verify_memory.json", {"quick": args.quick, "machine": machine(), "row": row})
    print(table([row], f"growtool verify d{cfg.width} ({cfg.n_params():,} params) against its d{width} growth"))
    print(f"\nwrote {args.dir}/verify_memory.json")


if __name__ == "__main__":
    main()
