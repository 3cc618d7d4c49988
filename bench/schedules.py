"""Warmup-stable-decay against cosine at equal tokens, on a real corpus.

A byte-level BPE (``--vocab``, default 2,048) is trained on the whole of ``--source`` (default
../shared/data/docs.jsonl: 3,338 documents, 32 MB); the corpus is tokenised once
(growtool.training.corpus: each record followed by <|endoftext|>, the validation part its last
whole documents). For each seed a GPT-2 (what ``growtool init --family gpt2 --width 64 --layers 4
--heads 4 --vocab 2048 --context 128 --seed SEED`` makes) is trained ``--steps`` steps (``--batch``
8 x ``--seq`` 64 tokens, peak lr 3e-3, 5% warm-up, one torch thread) with ``--schedule cosine`` and
with ``--schedule wsd --decay-fraction 0.2``: the same batches, the same tokens. Reports the final
validation loss of each and the paired difference.

    python bench/schedules.py --steps 200               # 3 seeds x 200 steps (bench/README.md)
    python bench/schedules.py --quick                   # a smoke run (tests/test_bench_data.py)
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, parse_args, table, write_csv, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def extra(p) -> None:
    p.add_argument("--source", default=str(ROOT.parent / "shared" / "data" / "docs.jsonl"))
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--decay-fraction", type=float, default=0.2)
    p.add_argument("--work", default=None, help="folder for the tokenizer, cache and runs (default: temporary)")


def tokenizer(source: Path, vocab: int, out: Path, limit: int | None) -> Path:
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    docs = [json.loads(line)["text"] for line in source.read_text().splitlines()[:limit]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        docs,
        trainers.BpeTrainer(
            vocab_size=vocab,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return out / "tokenizer.json"


def main() -> None:
    args = parse_args("schedules", __doc__.splitlines()[0], extra)
    import torch

    from growtool.init import init_model
    from growtool.io import checkpoint
    from growtool.nn.config import ModelConfig
    from growtool.training.loop import train

    torch.set_num_threads(1)  # a shared machine: one thread per run is steadier than two
    source = Path(args.source)
    if not source.is_file():
        source = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "docs.jsonl"
    own = args.work is None
    work = Path(tempfile.mkdtemp(prefix="growtool-bench-sched-") if own else args.work)
    steps, vocab = (6, 300) if args.quick else (args.steps, args.vocab)
    limit = 30 if args.quick else None
    rows = []
    try:
        data, tok = work / "docs.jsonl", work / "tok" / "tokenizer.json"
        if not (data.is_file() and tok.is_file()):  # a --work folder from an earlier run keeps its tokenizer
            data.write_text("".join(line + "\n" for line in source.read_text().splitlines()[:limit]))
            tok = tokenizer(data, vocab, work / "tok", None)
        for seed in [int(s) for s in args.seeds.split(",")]:
            cfg = ModelConfig("gpt2", vocab, 64, 4, 4, 4, 16, 256, context=128, norm_eps=1e-12, attn_gate=True)
            base = checkpoint.save_tensors(
                str(work / f"base-{seed}.safetensors"), cfg, [], init_model(cfg, seed=seed).tensors(), force=True
            )
            row = {"seed": seed, "steps": steps, "tokens": steps * args.batch * args.seq}
            for sched in ("cosine", "wsd"):
                t0 = time.perf_counter()
                r = train(
                    base,
                    [data],
                    work / f"run-{sched}-{seed}",
                    tokenizer=str(tok),
                    steps=steps,
                    batch=args.batch,
                    seq=args.seq,
                    lr=args.lr,
                    schedule=sched,
                    decay_fraction=args.decay_fraction,
                    eval_every=max(1, steps // 10),
                    eval_batches=2 if args.quick else 8,
                    metrics_every=10**9,
                    seed=seed,
                    device="cpu",
                    progress=False,
                    cache_dir=work / "cache",
                )
                row[f"{sched}_val"] = r["val_loss"]
                row[f"{sched}_s"] = time.perf_counter() - t0
            row["wsd_minus_cosine"] = row["wsd_val"] - row["cosine_val"]
            rows.append(row)
            print(table([row]), flush=True)
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    d = [r["wsd_minus_cosine"] for r in rows]
    summary = {
        "mean_wsd_minus_cosine": statistics.mean(d),
        "std": statistics.stdev(d) if len(d) > 1 else 0.0,
        "wsd_lower_in": sum(x < 0 for x in d),
        "seeds": len(d),
    }
    write_json(args.dir / "schedules.json", {"rows": rows, "summary": summary, "machine": machine()})
    write_csv(args.dir / "schedules.csv", rows)
    print(table(rows, "schedules: final validation loss, cosine vs wsd at equal tokens"))
    print(table([summary]))
    print(f"wrote {args.dir}")


if __name__ == "__main__":
    main()
