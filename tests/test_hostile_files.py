"""Hostile and unlucky inputs, round 2 (issue 41), the file half: the token cache, the run folder,
long lines and special files. One test per cause; each refusal runs ``growtool`` as a real process (a
full disk is simulated inside one), hashes every file of its folder before and after, and checks the
exit code, exactly one stderr line, no traceback, nothing changed among the inputs and nothing left
of a run folder the failed command made. Runs that must finish run in-process (``trained``), but for
the one that reads FIFOs (a hang there meets the process's timeout) and the non-UTF-8 names (argv).
The run-folder lock (3), a sharded state's data files (8, 9), SIGTERM during its load (8) and native
BaseExceptions outside the corpus (7) are in test_hostile_processes.py, beside the torchrun run they
share.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import GROWTOOL, cli, make_config, refused, run, text_file, tree, write_ckpt

TRAIN = ("--steps", 4, "--batch", 2, "--seq", 8, "--eval-batches", 1, "--device", "cpu", "-q")


def workdir(tmp_path: Path) -> Path:
    """A working folder: a byte-level checkpoint (vocabulary 256) and a text file."""
    write_ckpt(tmp_path / "a.safetensors", make_config(width=16, heads=2, layers=1, vocab=256, context=8))
    text_file(tmp_path / "t.txt")
    return tmp_path


@pytest.fixture
def w(tmp_path):
    return workdir(tmp_path)


def train(w: Path, *args, out="run", env=None, timeout=1800):
    return run("train", w / "a.safetensors", *args, "--out", w / out, *TRAIN, env=env, timeout=timeout)


def trained(w: Path, *args, out="run", env=None) -> None:
    """A run that must finish (a case's set-up, or a run over what a case planted), in-process through
    the same entry point: the refusals' one line on the process's own standard error is what a real
    process is for, and each one costs seconds of start-up (torch, then torch._dynamo at the optimizer)."""
    r = cli("train", w / "a.safetensors", *args, "--out", w / out, *TRAIN, env=env)
    assert r.exit_code == 0, r.stderr


def refuses_cleanly(w: Path, code: int, *args, fragments=(), env=None, timeout=1800) -> str:
    """``train ... --out run`` (run not there before): exit ``code``, one line, the folder as before."""
    before = tree(w)
    r = train(w, *args, env=env, timeout=timeout)
    line = refused(r, code, *fragments)
    assert tree(w) == before  # nothing written, nothing changed, no run folder left
    return line


@pytest.fixture(scope="module")
def ref(tmp_path_factory) -> tuple[dict[str, str], dict[str, bytes]]:
    """The cache a clean run builds from ``w``'s checkpoint and text (the same bytes, so the same key),
    made once for the module: its file names and bytes by kind ('tokens', 'json', 'docs')."""
    d = workdir(tmp_path_factory.mktemp("ref"))
    trained(d, "--data", d / "t.txt", out="ref")
    files = {p.suffix.lstrip("."): p for p in (d / "ref" / "cache").iterdir()}
    files = {"tokens": files["uint16"], "json": files["json"], "docs": files["docs"]}
    return {k: p.name for k, p in files.items()}, {k: p.read_bytes() for k, p in files.items()}


def env_with(**kw) -> dict:
    return {**os.environ, **{k: str(v) for k, v in kw.items()}}


# ---- 1: nothing is written through a link planted in the run folder or cache ---------------------


def test_cache_partial_files_are_never_written_through_links(w, ref):
    """1. ``.tokens-KEY.uint16.partial`` and ``.tokens-KEY.docs.partial`` planted as links to a user's
    files: the run writes fresh files of its own, exit 0, and the linked files are unchanged. A run's
    ``cache`` folder that is a link out of the run folder is refused."""
    names, clean = ref
    victim, victim2 = w / "victim.txt", w / "victim2.txt"
    victim.write_text("precious\n")
    victim2.write_text("precious too\n")
    cache = w / "run" / "cache"
    cache.mkdir(parents=True)
    key = names["tokens"].rsplit(".", 1)[0]
    (cache / f".{names['tokens']}.partial").symlink_to(victim)
    (cache / f".{key}.docs.partial").symlink_to(victim2)
    trained(w, "--data", w / "t.txt")
    assert victim.read_text() == "precious\n" and victim2.read_text() == "precious too\n"
    made = cache / names["tokens"]
    assert not made.is_symlink() and made.is_file()
    assert made.read_bytes() == clean["tokens"]

    (w / "outside").mkdir()
    (w / "run2").mkdir()
    (w / "run2" / "cache").symlink_to(w / "outside")  # the run's cache folder linked out of the run folder
    before = tree(w)
    refused(train(w, "--data", w / "t.txt", out="run2"), 2, "cache", "link")
    assert tree(w) == before


# ---- 2: the cache and its progress record are checked against the inputs ------------------------


def _plant_partial(cache: Path, names: dict, record) -> None:
    ids = np.arange(10, dtype=np.uint16)
    key = names["tokens"].rsplit(".", 1)[0]
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f".{names['tokens']}.partial").write_bytes(ids.tobytes())
    (cache / f".{key}.docs.partial").write_bytes(np.array([], dtype=np.int64).tobytes())
    (cache / f".{key}.progress.json").write_text(json.dumps(record))


@pytest.mark.parametrize(
    "record",
    [
        {"file": 5, "marker": 0, "tokens": 10, "docs": 0, "max": 9},  # past the inputs
        {"file": 0, "marker": 10**9, "tokens": 10, "docs": 0, "max": 9},  # past the file's end
        {"file": 0, "marker": 0, "tokens": "10", "docs": 0, "max": 9},  # a wrong type
        {"file": 0, "marker": 0, "tokens": 10, "docs": 0, "max": 3},  # not the partial ids' largest
    ],
)
def test_progress_records_that_do_not_fit_are_rebuilt(w, record, ref):
    """2. A progress record pointing past the inputs (or of a wrong type, or disagreeing with its
    partial file) is not trusted: the cache is built from the start, as a clean run builds it."""
    names, clean = ref
    _plant_partial(w / "run" / "cache", names, record)
    trained(w, "--data", w / "t.txt")
    for k in ("tokens", "json", "docs"):
        assert (w / "run" / "cache" / names[k]).read_bytes() == clean[k]


def test_a_finished_cache_that_does_not_fit_is_rebuilt(w, ref):
    """2. Token ids edited beyond the vocabulary (the record unchanged), then a record whose ``max``
    has the wrong type: ``--resume`` rebuilds the cache each time and finishes, exit 0."""
    names, clean = ref
    trained(w, "--data", w / "t.txt", "--stop-at", 2)
    cache = w / "run" / "cache"
    ids = np.fromfile(cache / names["tokens"], dtype=np.uint16)
    ids[5] = 999
    ids.tofile(cache / names["tokens"])
    trained(w, "--data", w / "t.txt", "--resume", "--stop-at", 3)
    assert (cache / names["tokens"]).read_bytes() == clean["tokens"]
    meta = json.loads((cache / names["json"]).read_text())
    (cache / names["json"]).write_text(json.dumps({**meta, "max": "255"}))
    trained(w, "--data", w / "t.txt", "--resume")
    assert json.loads((cache / names["json"]).read_text()) == meta


# ---- 4: every input is in the overlap check -----------------------------------------------------


def test_val_data_tokenizer_and_data_folders_are_inputs_of_the_run(w):
    """4. ``--val-data work/README.md --out work`` (the card would replace the user's README) and
    ``--data corpus/ --out corpus/run`` (its own files would become data) are refused up front."""
    work = w / "work"
    work.mkdir()
    (work / "README.md").write_text("my notes " * 50)
    before = tree(w)
    r = run(
        "train", w / "a.safetensors", "--data", w / "t.txt", "--val-data", work / "README.md", "--out", work, *TRAIN
    )
    refused(r, 2, "holds the input")
    assert tree(w) == before
    corpus = w / "corpus"
    corpus.mkdir()
    text_file(corpus / "a.txt")
    before = tree(w)
    r = run("train", w / "a.safetensors", "--data", corpus, "--out", corpus / "run", *TRAIN)
    refused(r, 2, "inside the input folder")
    assert tree(w) == before


# ---- 5: JSONL lines are bounded ------------------------------------------------------------------


def test_a_jsonl_line_past_the_bound_is_one_line(w):
    """5. A line longer than ``GROWTOOL_MAX_LINE`` (plain, and a gzip file inflating to one) is refused
    with one line naming the bound; the bound is settable, and a bad setting is one line too."""
    long = json.dumps({"text": "x" * 5000}) + "\n"
    (w / "d.jsonl").write_text(json.dumps({"text": "short one"}) + "\n" + long)
    with gzip.open(w / "g.jsonl.gz", "wt") as fh:
        fh.write(long * 3)
    env = env_with(GROWTOOL_MAX_LINE=1000)
    line = refuses_cleanly(w, 2, "--data", w / "d.jsonl", fragments=("line 2", "1,000 bytes"), env=env)
    assert "GROWTOOL_MAX_LINE" in line
    refuses_cleanly(w, 2, "--data", w / "g.jsonl.gz", fragments=("line 1", "1,000 bytes"), env=env)
    refuses_cleanly(
        w, 2, "--data", w / "d.jsonl", fragments=("GROWTOOL_MAX_LINE",), env=env_with(GROWTOOL_MAX_LINE="x")
    )
    trained(w, "--data", w / "d.jsonl", env={"GROWTOOL_MAX_LINE": "10kb"})


# ---- 6: reader errors outside the caught set; cleanup of a new run folder -----------------------


def test_lone_surrogates_and_deep_nesting_are_bad_input(w):
    """6. A lone surrogate escape in a record's text and a record nested 200,000 deep: one line, exit 2,
    no run folder (with its ``.partial`` files) left."""
    (w / "s.jsonl").write_text('{"text": "fine"}\n{"text": "a\\ud800b"}\n')
    refuses_cleanly(w, 2, "--data", w / "s.jsonl", fragments=("line 2", "surrogate"))
    (w / "n.jsonl").write_text('{"text": "fine"}\n' + "[" * 200_000 + "]" * 200_000 + "\n")
    refuses_cleanly(w, 2, "--data", w / "n.jsonl", fragments=("line 2", "nested"))


FULL_DISK = """
import errno, os, sys
from growtool.training import loop
def save_bytes(path, obj):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
loop.save_bytes = save_bytes
sys.argv = ["growtool", *sys.argv[1:]]
from growtool.cli import run
run()
"""


def test_a_full_disk_leaves_no_new_run_folder(w):
    """6. The disk fills at the first save of a new run (simulated in a real process): one line,
    exit 2, and the run folder it made is gone (it was left behind)."""
    before = tree(w)
    args = ["train", w / "a.safetensors", "--data", w / "t.txt", "--out", w / "run", *TRAIN]
    r = subprocess.run([sys.executable, "-c", FULL_DISK, *map(str, args)], capture_output=True, timeout=1800)
    refused(r, 2, "no space left on device")
    assert tree(w) == before


# ---- 7: a native library's panic --------------------------------------------------------------


def test_a_tokenizer_panic_is_one_line(w):
    """7. A tokenizer whose pre-tokenizer regex runs past the regex engine's retry limit makes the
    tokenizers library panic (a BaseException, and a Rust message on standard error): one line, exit 2."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(a+)+c"), behavior="isolated")
    tok.save(str(w / "tokenizer.json"))
    write_ckpt(w / "a.safetensors", make_config(width=16, heads=2, layers=1, vocab=64, context=8))
    (w / "t.txt").write_text(("a" * 40 + "b ") * 40)
    env = env_with(RUST_BACKTRACE=1)
    refuses_cleanly(w, 2, "--data", w / "t.txt", "--tokenizer", w / "tokenizer.json", fragments=("tokenizer",), env=env)


# ---- 8, 9: special files and links in a run folder ---------------------------------------------


def test_fifos_in_a_run_folder_never_hang(w, ref):
    """8, 9. A FIFO as ``last.pt`` makes ``--resume`` one line, exit 2 (it hung), and so does a
    ``last.safetensors`` linked out of the run folder; a FIFO as the cache's progress record or a
    partial file is not read: the cache is built afresh, exit 0."""
    trained(w, "--data", w / "t.txt", "--stop-at", 2)
    (w / "run" / "last.pt").unlink()
    os.mkfifo(w / "run" / "last.pt")
    before = tree(w)
    refused(train(w, "--data", w / "t.txt", "--resume", timeout=1800), 2, "last.pt", "not a regular file")
    assert tree(w) == before

    trained(w, "--data", w / "t.txt", "--stop-at", 2, out="run3")
    (w / "run3" / "last.safetensors").rename(w / "elsewhere.safetensors")
    (w / "run3" / "last.safetensors").symlink_to(w / "elsewhere.safetensors")  # 9: a link out of the folder
    before = tree(w)
    refused(train(w, "--data", w / "t.txt", "--resume", out="run3"), 2, "last.safetensors", "not a regular file")
    assert tree(w) == before

    names, clean = ref
    key = names["tokens"].rsplit(".", 1)[0]
    cache = w / "fresh" / "cache"
    cache.mkdir(parents=True)
    os.mkfifo(cache / f".{key}.progress.json")
    os.mkfifo(cache / f".{names['tokens']}.partial")
    r = train(w, "--data", w / "t.txt", out="fresh", timeout=1800)
    assert r.returncode == 0, r.stderr
    assert (cache / names["tokens"]).read_bytes() == clean["tokens"]


# ---- 14, 15 ---------------------------------------------------------------------------------


def test_a_dictionary_encoded_parquet_column_is_read(w):
    """14. A Parquet string column stored dictionary-encoded (pandas' categorical) trains on the same
    tokens as the plain column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [f"the cat {i % 7} sees the dog." for i in range(200)]
    pq.write_table(pa.table({"text": pa.array(rows)}), w / "plain.parquet")
    pq.write_table(pa.table({"text": pa.array(rows).dictionary_encode()}), w / "dict.parquet")
    assert pa.types.is_dictionary(pq.read_schema(w / "dict.parquet").field("text").type)
    for name in ("plain", "dict"):
        trained(w, "--data", w / f"{name}.parquet", out=name)
    assert (
        json.loads((w / "dict" / "metrics.jsonl").read_text().splitlines()[-1])["loss"]
        == json.loads((w / "plain" / "metrics.jsonl").read_text().splitlines()[-1])["loss"]
    )


def test_a_non_utf8_file_name_reaches_the_model_card(w):
    """15. A checkpoint and data file whose names are not UTF-8: the run finishes (exit 0) and the
    card shows the name's odd byte escaped."""
    src = os.fsdecode(bytes(w / "a.safetensors").replace(b"a.safe", b"a\xff.safe"))
    data = os.fsdecode(bytes(w / "t.txt").replace(b"t.txt", b"t\xff.txt"))
    os.rename(w / "a.safetensors", src)
    os.rename(w / "t.txt", data)
    r = subprocess.run(
        [GROWTOOL, "train", src, "--data", data, "--out", str(w / "run"), *map(str, TRAIN)], capture_output=True
    )
    assert r.returncode == 0, r.stderr
    card = (w / "run" / "README.md").read_text()
    assert "a\\\\udcff.safetensors" in card
