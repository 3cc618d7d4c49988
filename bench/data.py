"""Tokenising real-sized corpora in bounded memory, and training from their token files.

For each size (default 0.2 and 2 GB) two corpora are generated under ``--work`` (a temporary folder
by default, deleted at the end): a JSONL corpus (the records of ``--source``, default
../shared/data/docs.jsonl, reshuffled pass after pass) and a plain-text one (the same documents in
256 MB text files, a blank line between them; synthetic words when there is no source). A GPT-2-sized
byte-level BPE (``--vocab``, default 50,257) is trained in the bench on the first ``--train-mb`` MB
of text. Then, each in its own process (peak RSS from ``os.wait4``):

* ``growtool`` : ``growtool.training.corpus.load`` from the files to the finished token cache
  (hashing, reading, parsing, encoding, writing), end to end;
* ``encode_batch``: the tokenizers library's own ``Tokenizer.encode_batch`` (and ``ids`` of each
  encoding) on the same documents (text files: the same pieces), in batches of the same size,
  timing the encode calls only, on the first ``--baseline-mb`` MB (default: all of it);
  ``encode_batch_fast`` likewise, for reference.
* training: ``growtool train`` for a few steps (GPT-2 d64, 4 layers) from the largest corpus' token
  file (as ``.bin``) and from its first 20 MB; peak RSS of both.

Writes ``<out>/data/data.json`` and ``data.csv`` and prints the table.

    nice -n 10 python bench/data.py                 # 0.2 and 2 GB
    python bench/data.py --sizes 0.2,1              # what fits a busy machine
    python bench/data.py --quick                    # a smoke run (tests/test_bench_data.py)
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import MB, machine, parse_args, run_measured, table, write_csv, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GB = 1 << 30
WORDS = "the of and to in is was for that with as on by at from it an be this which or are have not but".split()


def source_docs(path: Path | None):
    """An endless stream of documents: the source's records reshuffled each pass, or synthetic."""
    if path is not None and path.is_file():
        lines = path.read_bytes().splitlines()
        r = random.Random(0)
        while True:
            r.shuffle(lines)
            for line in lines:
                yield json.loads(line)["text"]
    r = random.Random(0)
    while True:
        yield "\n".join(" ".join(r.choice(WORDS) for _ in range(r.randint(5, 20))) for _ in range(r.randint(3, 30)))


def generate(work: Path, size: int, source: Path | None, kinds=("jsonl", "text")) -> dict:
    """``size`` bytes of JSONL (one file) and of plain text (files of up to 256 MB)."""
    jl, txt = work / f"corpus-{size}.jsonl", work / f"text-{size}"
    txt.mkdir()
    docs = source_docs(source)
    with open(jl, "w", encoding="utf-8") as f:
        n = 0 if "jsonl" in kinds else size
        while n < size:
            line = json.dumps({"text": next(docs)}) + "\n"
            f.write(line)
            n += len(line.encode())
    part, n, fh = 1, 0 if "text" in kinds else size, open(txt / "000.txt", "wb")
    while n < size:
        if fh.tell() >= 256 * MB:
            fh.close()
            fh = open(txt / f"{part:03d}.txt", "wb")
            part += 1
        b = (next(docs) + "\n\n").encode()
        fh.write(b)
        n += len(b)
    fh.close()
    return {"jsonl": jl, "text": txt}


def train_tokenizer(work: Path, source: Path | None, vocab: int, train_mb: float) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    docs, sample, n = source_docs(source), [], 0
    while n < train_mb * MB:
        sample.append(next(docs))
        n += len(sample[-1])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sample, trainer)
    (work / "tok").mkdir(exist_ok=True)
    tok.save(str(work / "tok" / "tokenizer.json"))
    return work / "tok" / "tokenizer.json"


# ---- the measured children ------------------------------------------------------------------------


def child_tokenise(tok_path: str, data: str, cache: str) -> dict:
    from growtool.tokenizer import get_tokenizer
    from growtool.training import corpus
    from growtool.training.readers import expand_inputs

    tok = get_tokenizer(tok_path)
    t0 = time.perf_counter()
    c = corpus.load([data], tok, cache, tok.vocab_size)
    secs = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in expand_inputs([data]))
    return {"seconds": secs, "bytes": size, "tokens": int(len(c.tokens)), "file": str(c.path), "docs": len(c.doc_ends)}


def baseline_batches(data: str, limit: int):
    """The documents (text files: the pieces corpus encodes) in batches of corpus.BATCH characters,
    up to ``limit`` bytes of text."""
    from growtool.training import corpus
    from growtool.training.readers import expand_inputs, kind_of, read_jsonl, read_text

    batch, chars, total = [], 0, 0
    for path in expand_inputs([data]):
        kind = kind_of(path)
        reader = read_jsonl(path, 0, "text") if kind == "jsonl" else read_text(path, 0, corpus.BLOCK)
        for _, payload, *_ in reader:
            text = payload if isinstance(payload, str) else payload.decode("utf-8")
            for piece in corpus._pieces(text, corpus.PIECE):
                batch.append(piece)
                chars += len(piece)
                total += len(piece.encode())
            if chars >= corpus.BATCH:
                yield batch
                batch, chars = [], 0
            if total >= limit:
                break
        if total >= limit:
            break
    if batch:
        yield batch


def child_baseline(tok_path: str, data: str, limit: int, fast: bool) -> dict:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    enc = tok.encode_batch_fast if fast else tok.encode_batch
    secs, nbytes, tokens = 0.0, 0, 0
    for batch in baseline_batches(data, limit):
        t0 = time.perf_counter()
        ids = [e.ids for e in enc(batch, add_special_tokens=False)]
        secs += time.perf_counter() - t0
        nbytes += sum(len(t.encode()) for t in batch)
        tokens += sum(len(i) for i in ids)
    return {"seconds": secs, "bytes": nbytes, "tokens": tokens}


def child(argv: list[str]) -> None:
    what = argv[0]
    if what == "tokenise":
        out = child_tokenise(*argv[1:4])
    else:
        out = child_baseline(argv[1], argv[2], int(argv[3]), what == "fast")
    print(json.dumps(out))


def measured(args: list[str]) -> dict:
    r = run_measured([sys.executable, __file__, "--child", *args])
    if r["rc"] != 0:
        raise SystemExit(f"bench child {args[0]} failed:\n{r['stderr'][-3000:]}")
    return {**json.loads(r["stdout"].strip().splitlines()[-1]), "peak_rss": r["peak_rss"], "cpu_s": r["cpu_s"]}


def train_rss(work: Path, tokens_file: Path, vocab: int, mb: int | None, quick: bool) -> dict:
    """Peak RSS of ``growtool train`` for a few steps from a token file (or its first ``mb`` MB)."""
    import numpy as np

    from growtool.init import init_model
    from growtool.io import checkpoint
    from growtool.nn.config import ModelConfig

    model = work / "gpt2-d64.safetensors"
    if not model.exists():
        cfg = ModelConfig("gpt2", vocab, 64, 4, 4, 4, 16, 256, context=128)
        checkpoint.save_tensors(str(model), cfg, [], init_model(cfg, seed=0).tensors())
    name = f"train-{mb or 'all'}-{tokens_file.stat().st_size}"
    data = work / f"{name}.bin"
    if mb is None:
        os.symlink(tokens_file, data)
    else:
        src = np.memmap(tokens_file, dtype=np.uint16, mode="r")
        np.asarray(src[: mb * MB // 2]).tofile(data)
    steps = "1" if quick else "10"
    cmd = [sys.executable, "-m", "growtool.cli", "train", str(model), "--data", str(data), "--tokenizer"]
    cmd += [str(work / "tok" / "tokenizer.json"), "--steps", steps, "--batch", "8", "--seq", "128"]
    cmd += ["--device", "cpu", "--out", str(work / name), "-q"]
    r = run_measured(cmd)
    if r["rc"] != 0:
        raise SystemExit(f"growtool train failed:\n{r['stderr'][-3000:]}")
    return {"data_MB": data.stat().st_size / MB, "peak_rss_MB": r["peak_rss"] / MB, "wall_s": r["wall_s"]}


def extra(p) -> None:
    p.add_argument("--work", default=None, help="folder for corpora and caches (default: a temporary one, removed)")
    p.add_argument("--sizes", default="0.2,2", help="corpus sizes in GB, comma-separated")
    p.add_argument("--source", default=str(ROOT.parent / "shared" / "data" / "docs.jsonl"))
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--train-mb", type=float, default=12.0, help="MB of text the BPE is trained on")
    p.add_argument("--baseline-mb", type=float, default=None, help="MB of text the baselines encode (default: all)")
    p.add_argument("--kinds", default="jsonl,text", help="corpora to generate and tokenise (jsonl, text)")
    p.add_argument("--fast-baseline", action="store_true", help="also time encode_batch_fast")


def main() -> None:
    if "--child" in sys.argv:
        child(sys.argv[sys.argv.index("--child") + 1 :])
        return
    args = parse_args("data", __doc__.splitlines()[0], extra)
    sizes = [0.0005] if args.quick else [float(s) for s in args.sizes.split(",")]
    vocab, train_mb = (1000, 0.5) if args.quick else (args.vocab, args.train_mb)
    source = Path(args.source)
    if (
        not source.is_file()
        and (Path(__file__).resolve().parents[1].parent / "shared" / "data" / "docs.jsonl").is_file()
    ):
        source = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "docs.jsonl"
    source = source if source.is_file() else None
    own = args.work is None
    work = Path(tempfile.mkdtemp(prefix="growtool-bench-data-") if own else args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows, training = [], []
    try:
        t0 = time.perf_counter()
        tok = train_tokenizer(work, source, vocab, train_mb)
        from tokenizers import Tokenizer

        print(f"BPE: {Tokenizer.from_file(str(tok)).get_vocab_size():,} ids in {time.perf_counter() - t0:.1f} s")
        for gb in sizes:
            size = int(gb * GB)
            corpora = generate(work, size, source, args.kinds.split(","))
            for kind, path in corpora.items():
                if kind not in args.kinds.split(","):
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
                    continue
                limit = int(args.baseline_mb * MB) if args.baseline_mb else size * 2
                base = measured(["slow", str(tok), str(path), str(limit)])
                fast = measured(["fast", str(tok), str(path), str(limit)]) if args.fast_baseline or args.quick else None
                ours = measured(["tokenise", str(tok), str(path), str(work / f"cache-{gb}-{kind}")])
                mbs = lambda r: r["bytes"] / MB / r["seconds"]  # noqa: E731
                row = {
                    "corpus": kind,
                    "GB": gb,
                    "tokens": ours["tokens"],
                    "docs": ours["docs"],
                    "growtool_MB_s": mbs(ours),
                    "encode_batch_MB_s": mbs(base),
                    "ratio": mbs(ours) / mbs(base),
                    "encode_batch_fast_MB_s": mbs(fast) if fast else None,
                    "baseline_MB": base["bytes"] / MB,
                    "growtool_peak_rss_MB": ours["peak_rss"] / MB,
                    "baseline_peak_rss_MB": base["peak_rss"] / MB,
                    "growtool_s": ours["seconds"],
                    "growtool_cpu_s": ours["cpu_s"],
                    "baseline_cpu_s": base["cpu_s"],
                }
                rows.append(row)
                print(table([row]), flush=True)
                shutil.rmtree(path) if path.is_dir() else path.unlink()  # keep the disk use at one corpus
                if kind == "jsonl" or "jsonl" not in args.kinds:
                    tokens_file, tokens_kind = Path(ours["file"]), kind
            small = train_rss(work, tokens_file, vocab, 1 if args.quick else 20, args.quick)
            big = train_rss(work, tokens_file, vocab, None, args.quick)
            training.append({"token_file": "first 1 MB" if args.quick else "first 20 MB", "GB": gb, **small})
            training.append({"token_file": f"{gb} GB {tokens_kind} corpus", "GB": gb, **big})
            training[-1]["rss_vs_small"] = big["peak_rss_MB"] / small["peak_rss_MB"]
            print(table(training[-2:]), flush=True)
            write_json(args.dir / "data.json", {"rows": rows, "training": training, "machine": machine()})
            for f in work.glob("cache-*"):
                shutil.rmtree(f)
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    out = {"rows": rows, "training": training, "machine": machine()}
    write_json(args.dir / "data.json", out)
    write_csv(args.dir / "data.csv", rows)
    print(table(rows, "data: tokenising (peak RSS per process)"))
    print(table(training, "data: training 10 steps from a token file"))
    print(f"wrote {args.dir}")


if __name__ == "__main__":
    main()
