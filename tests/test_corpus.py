"""Training corpora (growtool.training.corpus): every input kind gives the ids of a plain reference
encoding of the same documents, separators sit after each document, token files train like text,
an interrupted tokenisation resumes to the same cache, bad input is one line and exit 2 with
nothing left behind, and the wsd / constant schedules."""

import gzip
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from growtool.init import init_model
from growtool.io import checkpoint
from growtool.nn.errors import GrowError
from growtool.tokenizer import get_tokenizer
from growtool.training import cache as token_cache
from growtool.training import corpus, data, schedule
from growtool.training.loop import train
from growtool.training.readers import expand_inputs, line_safe, read_text
from growtool.training.run_folder import read_metrics
from growtool.training.schedule import lr_at

from helpers import cli, make_config

ROOT = Path(__file__).resolve().parent.parent
WORDS = "the a cat dog fox king bird sees likes finds helps über naïve café 42 1999 (x) [y] {z} ok! why? yes.".split()
KW = dict(batch=4, seq=16, eval_batches=2, device="cpu", progress=False)


@pytest.fixture
def small_sizes(monkeypatch):
    """Blocks, pieces, batches and checkpoints a few hundred units long, so small files cross them."""
    for name, v in (("BLOCK", 700), ("PIECE", 120), ("BATCH", 900), ("CHECKPOINT", 50)):
        monkeypatch.setattr(corpus, name, v)
    monkeypatch.setattr(token_cache, "SCAN", 64)


def make_docs(n: int, seed: int = 0) -> list[str]:
    """Documents of a few lines each: words, punctuation, blank lines, indented lines, non-ASCII."""
    r = random.Random(seed)
    docs = []
    for _ in range(n):
        lines = []
        for _ in range(r.randint(1, 8)):
            line = " ".join(r.choice(WORDS) for _ in range(r.randint(0, 12)))
            lines.append(r.choice(["", "  ", "\t", "* "]) + line if r.random() < 0.3 else line)
        docs.append("\n".join(lines) + r.choice(["", "\n", "\n\n"]))
    return docs


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A GPT-2-style byte-level BPE (with <|endoftext|>) trained on generated documents."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d = tmp_path_factory.mktemp("bpe")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(make_docs(300, seed=9), trainer)
    tok.save(str(d / "tokenizer.json"))
    return get_tokenizer(str(d / "tokenizer.json"))


def write_kind(folder: Path, kind: str, docs: list[str], key: str = "text") -> Path:
    if kind == "text":  # one document per file, in a folder
        sub = folder / "txt"
        sub.mkdir()
        for i, d in enumerate(docs):
            (sub / f"{i:03d}.txt").write_text(d, encoding="utf-8")
        return sub
    if kind in ("jsonl", "jsonl.gz"):
        body = "".join(json.dumps({key: d, "id": i}) + "\n" for i, d in enumerate(docs))
        p = folder / f"d.{kind}"
        if kind == "jsonl":
            p.write_text(body, encoding="utf-8")
        else:
            with gzip.open(p, "wt", encoding="utf-8") as f:
                f.write(body)
        return p
    p = folder / "d.parquet"
    pq.write_table(pa.table({key: docs, "n": list(range(len(docs)))}), p, row_group_size=7)
    return p


def reference(tok, docs: list[str], sep) -> list[int]:
    out = []
    for d in docs:
        if not d:
            continue
        out += tok.hf.encode(d, add_special_tokens=False).ids if tok.hf else list(d.encode("utf-8"))
        out += [] if sep is None else [sep]
    return out


@pytest.mark.parametrize("kind", ["text", "jsonl", "jsonl.gz", "parquet"])
def test_each_document_kind_gives_the_reference_ids(tmp_path, bpe, small_sizes, kind):
    docs = make_docs(40) + [""]  # an empty document gives nothing, not a lone separator
    src = write_kind(tmp_path, kind, docs)
    eot = bpe.hf.token_to_id("<|endoftext|>")
    c = corpus.load([src], bpe, tmp_path / "cache", bpe.vocab_size)
    assert c.tokens.tolist() == reference(bpe, docs, eot)
    assert isinstance(c.tokens, np.memmap) and c.sep == eot
    # a separator after each document, and the documents end right after them
    assert len(c.doc_ends) == 40 and c.doc_ends[-1] == len(c.tokens)
    assert all(c.tokens[e - 1] == eot for e in c.doc_ends)
    assert int((c.tokens == eot).sum()) == 40
    # the cache is reused (same key), and another separator is another cache
    again = corpus.load([src], bpe, tmp_path / "cache", bpe.vocab_size)
    assert again.tokens.tolist() == c.tokens.tolist()
    none = corpus.load([src], bpe, tmp_path / "cache", bpe.vocab_size, reading=corpus.Reading(doc_sep="none"))
    assert none.tokens.tolist() == reference(bpe, docs, None)
    assert len(list((tmp_path / "cache").glob("tokens-*.uint16"))) == 2
    assert not list((tmp_path / "cache").glob(".*"))  # no partial files left


def test_long_text_file_in_blocks_equals_the_whole_file(tmp_path, bpe, small_sizes):
    text = "".join(make_docs(200, seed=3))
    (tmp_path / "big.txt").write_text(text)
    assert len(text.encode()) > 30 * corpus.BLOCK  # many blocks, many pieces
    c = corpus.load([tmp_path / "big.txt"], bpe, tmp_path / "cache", bpe.vocab_size)
    assert c.tokens.tolist() == bpe.hf.encode(text, add_special_tokens=False).ids + [0]
    assert line_safe(bpe)


@pytest.mark.parametrize("shape", ["lines", "one line", "paragraphs"])
def test_a_text_file_is_read_and_encoded_in_bounded_pieces(tmp_path, bpe, small_sizes, shape):
    """Whatever a text file's line lengths, no block is much over BLOCK bytes and no encoded piece
    much over PIECE characters (a block once grew by half a block per read, and a file without
    ``x\\nY`` lines was one piece), and the ids are still the whole file's."""
    words = " ".join(make_docs(150, seed=4)).split()
    text = {
        "lines": "".join(make_docs(150, seed=4)),
        "one line": " ".join(words),
        "paragraphs": "\n\n".join(" ".join(words[i : i + 9]) for i in range(0, len(words), 9)),
    }[shape]
    (tmp_path / "t.txt").write_text(text)
    size = len(text.encode())
    assert size > 20 * corpus.BLOCK
    blocks = [p for _, p, *_ in read_text(tmp_path / "t.txt", 0, corpus.BLOCK)]
    assert b"".join(blocks) == text.encode() and len(blocks) > 15
    assert max(map(len, blocks)) <= corpus.BLOCK + 200
    pieces = [q for b in blocks for q in corpus._pieces(b.decode(), corpus.PIECE)]
    assert max(map(len, pieces)) <= 2 * corpus.PIECE + 50
    c = corpus.load([tmp_path / "t.txt"], bpe, tmp_path / "cache", bpe.vocab_size)
    assert c.tokens.tolist() == bpe.hf.encode(text, add_special_tokens=False).ids + [0]


def test_other_tokenizers_encode_documents_whole(tmp_path, small_sizes):
    """A tokenizer that is not line-safe (a prefix space) still gives each document's own ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.train_from_iterator(make_docs(100), trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"]))
    tok.save(str(tmp_path / "tok.json"))
    t = get_tokenizer(str(tmp_path / "tok.json"))
    assert not line_safe(t)
    docs = make_docs(20, seed=5) + ["x" * 50 + "\n" + "y " * 200]  # one document longer than 2 pieces
    src = write_kind(tmp_path, "jsonl", docs)
    c = corpus.load([src], t, tmp_path / "cache", t.vocab_size)
    assert c.sep == tok.token_to_id("</s>")
    assert c.tokens.tolist() == reference(t, docs, c.sep)


def test_byte_tokenizer_documents_and_separator(tmp_path, small_sizes):
    byte = get_tokenizer("byte")
    docs = make_docs(10)
    src = write_kind(tmp_path, "jsonl", docs)
    c = corpus.load([src], byte, tmp_path / "cache", 256)
    assert c.sep is None and c.tokens.tolist() == reference(byte, docs, None)  # auto: nothing between
    nl = corpus.load([src], byte, tmp_path / "cache", 256, reading=corpus.Reading(doc_sep="\n"))
    assert nl.tokens.tolist() == reference(byte, docs, 10)
    with pytest.raises(GrowError, match="one byte"):
        corpus.load([src], byte, tmp_path / "cache", 256, reading=corpus.Reading(doc_sep="<|endoftext|>"))


@pytest.mark.parametrize("kind", ["bin", "npy"])
def test_token_files_are_taken_as_they_are(tmp_path, bpe, small_sizes, kind):
    ids = np.random.default_rng(0).integers(0, bpe.vocab_size, 1000)
    p = tmp_path / f"t.{kind}"
    if kind == "bin":
        ids.astype(np.uint16).tofile(p)
    else:
        np.save(p, ids.astype(np.int32))
    one = corpus.load([p], bpe, tmp_path / "cache", bpe.vocab_size)
    assert one.tokens.tolist() == ids.tolist() and one.path == p  # used in place: no copy
    assert not (tmp_path / "cache").exists()
    # with text after it: copied into a cache, text documents separated, the token file not
    (tmp_path / "z.txt").write_text("the cat sees\nthe dog")
    both = corpus.load([p, tmp_path / "z.txt"], bpe, tmp_path / "cache", bpe.vocab_size)
    assert both.tokens.tolist() == ids.tolist() + reference(bpe, ["the cat sees\nthe dog"], 0)
    # uint32 by --data-dtype
    (tmp_path / "w.bin").write_bytes(ids.astype(np.uint32).tobytes())
    w = corpus.load(
        [tmp_path / "w.bin"], bpe, tmp_path / "cache", bpe.vocab_size, reading=corpus.Reading(data_dtype="uint32")
    )
    assert w.tokens.tolist() == ids.tolist()


def test_folders_and_globs_expand_in_order(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/2.txt", "a/b/1.txt", "a/1.txt", "a/.hidden", "x.jsonl", "y.jsonl"):
        (tmp_path / name).write_text("x")
    got = expand_inputs([tmp_path / "a", str(tmp_path / "*.jsonl")])
    assert [p.relative_to(tmp_path).as_posix() for p in got] == [
        "a/1.txt",
        "a/2.txt",
        "a/b/1.txt",
        "x.jsonl",
        "y.jsonl",
    ]
    with pytest.raises(GrowError, match="no file matches"):
        expand_inputs([str(tmp_path / "*.parquet")])


def test_validation_split_falls_on_a_document_boundary():
    toks = np.arange(4000) % 200
    ends = np.array([900, 2000, 3500, 3800, 4000])
    ds = data.Dataset(toks, 16, 8, doc_ends=ends)
    # today's tail would be max(4000 // 20, 8 * 16 + 1) = 200 tokens; the whole documents holding it
    assert ds.n_train == 3800 and ds.n_val == 200
    ds = data.Dataset(toks, 16, 8, doc_ends=np.array([2000, 3950, 4000]))
    assert ds.n_train == 2000  # the last whole documents holding the 200 tokens start at 2000
    one = data.Dataset(toks, 16, 8, doc_ends=np.array([4000]))  # one long document: the token split
    assert one.n_train == 3800
    held = data.Dataset(toks, 16, 8, val=np.arange(300))
    assert held.n_train == 4000 and all(int(x.max()) < 300 for x, _ in held.val_batches(2))


def tiny_model(path: Path, vocab: int) -> str:
    cfg = make_config(width=32, layers=1, vocab=vocab, context=16)
    return checkpoint.save_tensors(str(path), cfg, [], init_model(cfg, seed=0).tensors())


def test_training_on_a_nanogpt_train_bin_equals_training_on_the_text(tmp_path):
    text = "".join(make_docs(120, seed=1))
    val = "".join(make_docs(20, seed=2))
    (tmp_path / "t.txt").write_text(text)
    (tmp_path / "v.txt").write_text(val)
    np.frombuffer(text.encode(), dtype=np.uint8).astype(np.uint16).tofile(tmp_path / "train.bin")
    np.frombuffer(val.encode(), dtype=np.uint8).astype(np.uint16).tofile(tmp_path / "val.bin")
    base = tiny_model(tmp_path / "b.safetensors", 256)
    kw = dict(steps=8, lr=3e-3, eval_every=2, **KW)
    a = train(base, [tmp_path / "t.txt"], tmp_path / "ra", val_data=[tmp_path / "v.txt"], **kw)
    b = train(base, [tmp_path / "train.bin"], tmp_path / "rb", val_data=[tmp_path / "val.bin"], **kw)
    ma, mb = read_metrics(Path(a["metrics"])), read_metrics(Path(b["metrics"]))
    losses = lambda m: [(r["step"], r.get("loss"), r.get("val_loss")) for r in m]  # noqa: E731
    assert losses(ma) == losses(mb) and len([r for r in ma if "val_loss" in r]) == 5
    assert a["settings"]["val_sha256"] == [data.file_sha256(tmp_path / "v.txt")]


def interrupted(tmp_path, src, tok, after_tokens):
    def hook(n):
        if n >= after_tokens:
            raise KeyboardInterrupt

    corpus.HOOK = hook
    try:
        with pytest.raises(KeyboardInterrupt):
            corpus.load([src], tok, tmp_path / "cache", tok.vocab_size)
    finally:
        corpus.HOOK = None


def test_an_interrupted_tokenisation_resumes_to_the_same_cache(tmp_path, bpe, small_sizes, monkeypatch):
    src = write_kind(tmp_path, "jsonl", make_docs(80))
    clean = corpus.load([src], bpe, tmp_path / "clean", bpe.vocab_size)
    interrupted(tmp_path, src, bpe, len(clean.tokens) // 2)
    cache = tmp_path / "cache"
    assert not list(cache.glob("tokens-*")), "no cache file before the tokenisation is complete"
    progress = json.loads(next(cache.glob(".*.progress.json")).read_text())
    assert 0 < progress["tokens"] < len(clean.tokens)
    encoded = []
    real = corpus.Encoder.encode
    monkeypatch.setattr(corpus.Encoder, "encode", lambda self, items: encoded.append(len(items)) or real(self, items))
    again = corpus.load([src], bpe, cache, bpe.vocab_size)
    assert again.path.read_bytes() == clean.path.read_bytes()
    assert again.doc_ends.tolist() == clean.doc_ends.tolist()
    assert sum(encoded) < 80 - progress["docs"] + 10  # it continued where the record says, not from the start
    assert not list(cache.glob(".*"))


def test_a_cut_short_cache_is_rebuilt(tmp_path, bpe, small_sizes):
    src = write_kind(tmp_path, "jsonl", make_docs(20))
    c = corpus.load([src], bpe, tmp_path / "cache", bpe.vocab_size)
    whole = c.path.read_bytes()
    c.path.write_bytes(whole[:-2])
    again = corpus.load([src], bpe, tmp_path / "cache", bpe.vocab_size)
    assert again.path.read_bytes() == whole


def test_a_killed_tokenisation_resumes_to_the_same_cache(tmp_path, bpe):
    docs = make_docs(200)
    src = write_kind(tmp_path, "text", docs)  # 200 files: the record points into the file list
    clean = corpus.load([src], bpe, tmp_path / "clean", bpe.vocab_size)
    script = (
        "import os, signal, sys; from growtool.training import corpus; from growtool.tokenizer import get_tokenizer\n"
        "corpus.BATCH, corpus.CHECKPOINT = 500, 40\n"
        f"corpus.HOOK = lambda n: n >= {len(clean.tokens) // 2} and os.kill(os.getpid(), signal.SIGKILL)\n"
        f"tok = get_tokenizer({str(bpe.name)!r})\n"
        f"corpus.load([{str(src)!r}], tok, {str(tmp_path / 'cache')!r}, tok.vocab_size)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=1800)
    assert p.returncode == -9, p.stderr.decode()[-2000:]
    assert not list((tmp_path / "cache").glob("tokens-*")) and list((tmp_path / "cache").glob(".*.partial"))
    again = corpus.load([src], bpe, tmp_path / "cache", bpe.vocab_size)
    assert again.path.read_bytes() == clean.path.read_bytes()


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory, bpe):
    d = tmp_path_factory.mktemp("bpe_model")
    return tiny_model(d / "m.safetensors", bpe.vocab_size)


def bad(tmp_path: Path, case: str) -> tuple[list, str]:
    """(--data arguments, what the one line must say) for each bad input."""
    good = [json.dumps({"text": d}) for d in make_docs(30)]
    f = tmp_path / "d.jsonl"
    if case == "not-json":
        f.write_text("\n".join(good[:4] + ["{not json"] + good[4:]) + "\n")
        return [f], f"{f}: line 5: not JSON"
    if case == "no-key":
        f.write_text("\n".join(good[:2] + [json.dumps({"body": "x"})] + good[2:]) + "\n")
        return [f], f"{f}: line 3: no 'text' key"
    if case == "not-object":
        f.write_text("\n".join(good + ["[1, 2]"]) + "\n")
        return [f], f"{f}: line 31: not a JSON object"
    if case == "parquet-column":
        p = tmp_path / "d.parquet"
        pq.write_table(pa.table({"body": make_docs(5)}), p)
        return [p], f"{p}: no column 'text'"
    if case == "bin-size":
        p = tmp_path / "d.bin"
        p.write_bytes(b"\x01\x00\x02")
        return [p], f"{p}: 3 bytes is not a whole number of uint16 ids"
    if case == "bin-vocab":
        p = tmp_path / "d.bin"
        ids = np.arange(2000) % 300
        ids[1234] = 60000
        ids.astype(np.uint16).tofile(p)
        return [p], f"{p}: token 60000 at position 1,234 does not fit the vocabulary"
    if case == "empty":
        f.write_text("\n\n")
        return [f], "no tokens (the data is empty)"
    if case == "utf8":
        p = tmp_path / "d.txt"
        p.write_bytes("".join(make_docs(20)).encode() + b"\nbad \xff byte\n" + b"more\n" * 3)
        line = p.read_bytes().count(b"\n", 0, p.read_bytes().index(b"\xff")) + 1
        return [p], f"{p}: line {line}: not UTF-8 text"
    if case == "glob":
        return [str(tmp_path / "*.parquet")], "no file matches"
    raise AssertionError(case)


CASES = ["not-json", "no-key", "not-object", "parquet-column", "bin-size", "bin-vocab", "empty", "utf8", "glob"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(tmp_path, bpe, bpe_model, small_sizes, case):
    files, msg = bad(tmp_path, case)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [a for f in files for a in ("--data", f)]
    r = cli("train", bpe_model, *args, "--tokenizer", bpe.name, "--steps", 2, "--out", tmp_path / "run")
    assert r.exit_code == 2, r.output
    assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "run").exists() and sorted(p.name for p in tmp_path.iterdir()) == before
    # into an existing cache folder: nothing left there either
    (tmp_path / "cache").mkdir()
    with pytest.raises(GrowError, match="."):
        corpus.load(files, bpe, tmp_path / "cache", 300)
    assert list((tmp_path / "cache").iterdir()) == []


def test_wsd_and_constant_schedules():
    s = {"lr": 1.0, "warmup": 4, "steps": 20, "min_lr_ratio": 0.1, "decay_fraction": 0.25, "schedule": "wsd"}
    lrs = [lr_at(i, s) for i in range(20)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0] and lrs[4:15] == [1.0] * 11  # warm-up, then stable
    assert lrs[15:] == pytest.approx([1 - 0.9 * k / 5 for k in range(5)])  # 5 = 25% of 20: linear to 0.1
    assert [lr_at(i, {**s, "schedule": "constant"}) for i in range(20)] == lrs[:4] + [1.0] * 16
    sqrt = [lr_at(i, {**s, "decay_shape": "sqrt"}) for i in range(20)]  # 1 - sqrt (Hägele et al. 2024)
    assert sqrt[:15] == lrs[:15] and sqrt[15:] == pytest.approx([1 - 0.9 * math.sqrt(k / 5) for k in range(5)])
    assert all(a < b for a, b in zip(sqrt[16:], lrs[16:]))  # below the linear decay after its first step
    # re-warmed after a growth at step 8 (--grow-schedule rewarm): the same shape over the 12 steps left
    assert [lr_at(i, s, start=8) for i in range(8, 20)] == pytest.approx(
        [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1 - 0.9 / 3, 1 - 1.8 / 3]
    )
    # cosine unchanged (the default; runs saved before --schedule were cosine)
    cos = {**s, "schedule": "cosine"}
    assert lr_at(19, cos) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 15 / 16)))
    assert schedule.lr_at(19, {k: v for k, v in cos.items() if k != "schedule"}) == lr_at(19, cos)


def test_wsd_run_logs_its_schedule_with_a_growth_and_resume_checks_it(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("".join(make_docs(150)))
    cfg = make_config(width=32, layers=1, vocab=256, context=16, attn_gate=True)
    base = checkpoint.save_tensors(str(tmp_path / "b.safetensors"), cfg, [], init_model(cfg).tensors())
    kw = dict(steps=20, warmup=2, schedule="wsd", decay_fraction=0.25, grow_at=("0.5:48",), **KW)
    kw["gate_warmup_tokens"] = 64
    r = train(base, [text], tmp_path / "run", stop_at=12, save_every=4, **kw)
    assert r["settings"]["schedule"] == "wsd" and r["settings"]["decay_fraction"] == 0.25
    with pytest.raises(GrowError, match="--schedule cosine differs from the run's wsd"):
        train(base, [text], tmp_path / "run", resume=True, **{**kw, "schedule": "cosine"})
    done = train(base, [text], tmp_path / "run", resume=True, **kw)
    recs = [x for x in read_metrics(Path(done["metrics"])) if "loss" in x]
    s = done["settings"]
    # growth at step 10 re-warms: the schedule restarts over the 10 steps left (decay over the last 2 or 3)
    assert [x["lr"] for x in recs] == pytest.approx([lr_at(i, s, 10 if i >= 10 else 0) for i in range(20)])
    assert recs[10]["width"] == 48 and recs[10]["lr"] < recs[9]["lr"] == pytest.approx(s["lr"])  # the peak


def test_a_shared_cache_folder_is_built_by_one_process_at_a_time(tmp_path, bpe):
    """Bench workers and several runs share cache folders: a load waits while another holds the
    folder's lock (it would otherwise remove or rebuild a cache the other is building or reading)."""
    import threading
    import time

    src = write_kind(tmp_path, "jsonl", make_docs(10))
    cache = tmp_path / "cache"
    cache.mkdir()
    out = {}
    with corpus._locked(cache):
        t = threading.Thread(target=lambda: out.setdefault("c", corpus.load([src], bpe, cache, bpe.vocab_size)))
        t.start()
        time.sleep(0.5)
        assert t.is_alive() and not list(cache.iterdir())  # waiting: it has not started a build
    t.join(timeout=1800)  # a guard against a hang: the build runs once the lock is let go
    assert not t.is_alive() and len(out["c"].tokens) > 0
    assert out["c"].tokens.tolist() == corpus.load([src], bpe, tmp_path / "other", bpe.vocab_size).tokens.tolist()
