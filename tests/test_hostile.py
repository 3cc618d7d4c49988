"""Hostile and unlucky inputs (issue 30): nothing a run folder, checkpoint, recipe or config holds
ever executes; writes to standard output are checked; reads stay in the input; outputs never touch
an input; one config per folder; run folders survive a failed write; every bad input is one line.

Each case asserts the exit code, exactly one stderr line, no traceback, and that no file was left
behind or changed (the whole working folder hashed before and after). Most run as real processes
(``growtool`` with this checkout on PYTHONPATH); a few run in-process where a fault is simulated.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from helpers import GROWTOOL, cli, make_config, raw_safetensors, read_raw, refused, run, text_file, tree, write_ckpt

TRAIN = ("--steps", 4, "--batch", 2, "--seq", 8, "--eval-batches", 1, "--device", "cpu", "-q")


# ---- 1: no code execution from a run folder ---------------------------------------------------


class Payload:
    """Unpickling this runs ``touch MARKER`` (what a crafted .metadata would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """A real one-process --fsdp run stopped at step 2 (its state in last-2.dcp), and its inputs."""
    d = tmp_path_factory.mktemp("sharded")
    src = write_ckpt(d / "a.safetensors", make_config(width=16, heads=2, layers=1, vocab=256, context=8))
    text = text_file(d / "t.txt")
    r = cli("train", src, "--data", text, "--out", d / "run", "--fsdp", "--stop-at", 2, *TRAIN)
    assert r.exit_code == 0, r.stderr
    state = torch.load(d / "run" / "last.pt", weights_only=True)
    assert state["sharded"] == "last-2.dcp" and len(state["sharded_sha256"]) == 64
    return d, src, text


def _crafted(tmp_path, sharded_run, metadata: bytes | None, sharded=None, record_sha=True):
    """A copy of the run whose last-2.dcp/.metadata is ``metadata`` and whose last.pt names
    ``sharded`` and (``record_sha``) the new .metadata's sha256, as an attacker would write it."""
    d, src, text = sharded_run
    run_dir = tmp_path / "run"
    shutil.copytree(d / "run", run_dir)
    if metadata is not None:
        (run_dir / "last-2.dcp" / ".metadata").write_bytes(metadata)
    state = torch.load(run_dir / "last.pt", weights_only=True)
    if sharded is not None:
        state["sharded"] = sharded
    if record_sha:
        state["sharded_sha256"] = hashlib.sha256(metadata or b"").hexdigest()
    torch.save(state, run_dir / "last.pt")
    return run_dir, src, text


def test_resume_never_unpickles_a_crafted_sharded_state(tmp_path, sharded_run):
    """1. A .metadata pickle that would run a command: refused before anything runs, whether last.pt
    records its sha256 (the attacker rewrote it) or not; names out of the run folder refused; a
    garbage .metadata is one line (it was a BaseException escaping with a traceback)."""
    marker = tmp_path / "pwned"
    evil = pickle.dumps(Payload(marker))
    pickle.loads(pickle.dumps(Payload(tmp_path / "selftest")))  # the payload does run when unpickled
    assert (tmp_path / "selftest").exists()
    (tmp_path / "selftest").unlink()
    cases = [
        (dict(metadata=evil), ["not a growtool sharded state", "refused global"]),
        (dict(metadata=evil, record_sha=False), ["changed since last.pt was written"]),
        (dict(metadata=b"\x80\x04garbage"), ["not a growtool sharded state"]),
        (dict(metadata=None, sharded="../outside.dcp", record_sha=False), ["not last-<step>.dcp"]),
        (dict(metadata=None, sharded="/etc", record_sha=False), ["not last-<step>.dcp"]),
    ]
    for i, (kw, frags) in enumerate(cases):
        case_dir = tmp_path / f"c{i}"
        case_dir.mkdir()
        if kw.get("record_sha") is False and kw["metadata"] is not None:
            run_dir, src, text = _crafted(case_dir, sharded_run, kw["metadata"], record_sha=False)
            state = torch.load(run_dir / "last.pt", weights_only=True)
            state["sharded_sha256"] = "0" * 64
            torch.save(state, run_dir / "last.pt")
        else:
            run_dir, src, text = _crafted(case_dir, sharded_run, **kw)
        before = tree(case_dir)
        for fsdp in ("--fsdp",) if i else ("--fsdp", None):  # with or without --fsdp
            args = ["train", src, "--data", text, "--out", run_dir, "--resume", *TRAIN] + ([fsdp] if fsdp else [])
            r = (run if i == 0 else cli)(*args)  # the payload in a real process, the rest in-process
            refused(r, 2, *frags, folder=case_dir, before=before)
            assert not marker.exists()


# ---- 2: standard output is checked ----------------------------------------------------------


def proc(*args, env=None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [GROWTOOL, *map(str, args)], stderr=subprocess.PIPE, env={**os.environ, **(env or {})}, **kw
    )


@pytest.fixture
def src(tmp_path):
    """A small llama checkpoint in its own folder (200 KB grown to width 48: more than a pipe holds)."""
    (tmp_path / "in").mkdir()
    return write_ckpt(tmp_path / "in" / "a.safetensors", make_config(width=32, vocab=64))


def test_standard_output_short_writes_and_closed_pipes_are_errors(tmp_path, src):
    """2. ``-o -`` to a full disk (/dev/full) with PYTHONUNBUFFERED=1, into a pipe the reader closes
    after 100 bytes, and with standard output closed: exit 2 (not 0, not 1), one line, nothing left."""
    before = tree(tmp_path)
    with open("/dev/full", "wb") as full:
        p = proc("expand", src, "--width", 48, "-q", "-o", "-", stdout=full, env={"PYTHONUNBUFFERED": "1"})
        p.wait(timeout=1800)
    refused(_done(p), 2, "standard output", "no space left", "incomplete", folder=tmp_path, before=before)

    p = proc("expand", src, "--width", 48, "-q", "-o", "-", stdout=subprocess.PIPE, env={"PYTHONUNBUFFERED": "1"})
    assert len(p.stdout.read(100)) == 100  # | head -c 100
    p.stdout.close()
    p.wait(timeout=1800)
    refused(_done(p), 2, "standard output", "broken pipe", folder=tmp_path, before=before)

    p = proc("inspect", src, "--json", stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    p.wait(timeout=1800)
    refused(_done(p), 2, "standard output is closed", folder=tmp_path, before=before)


def _done(p: subprocess.Popen) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(p.args, p.returncode, b"", p.stderr.read())


def test_standard_output_short_writes_are_retried(tmp_path, src):
    """2. A non-blocking pipe takes only what fits (a short write): the rest is written once it drains,
    so what the reader gets is the whole checkpoint, byte for byte (copyfileobj dropped the rest)."""
    ref = tmp_path / "ref.safetensors"
    assert cli("expand", src, "--width", 48, "-q", "-o", ref).exit_code == 0
    r, w = os.pipe()
    os.set_blocking(w, False)
    p = proc("expand", src, "--width", 48, "-q", "-o", "-", stdout=w, env={"PYTHONUNBUFFERED": "1"})
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        got = fh.read()
    assert p.wait(timeout=1800) == 0, p.stderr.read()
    assert got == ref.read_bytes() and len(got) > 65536


# ---- 3: reads stay inside the input ---------------------------------------------------------


def test_reads_are_confined_to_the_input_folder(tmp_path):
    """3. An index naming ../outside or an absolute system file, a shard linked out of the folder, a
    tokenizer file linked out of it: one line each, nothing written. A Hugging Face cache snapshot
    (every file a link into ../../blobs) still grows, its tokenizer carried."""
    hf = write_ckpt(tmp_path / "hf", make_config(), shard_size=20_000)
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    (tmp_path / "outside").mkdir()
    (tmp_path / "secret.txt").write_text("not for publishing")

    def variant(name, edit):
        d = tmp_path / name
        shutil.copytree(hf, d)
        edit(d)
        return d

    def remap(target):
        def edit(d):
            idx = json.loads((d / "model.safetensors.index.json").read_text())
            idx["weight_map"] = {n: (target if f == shards[0] else f) for n, f in idx["weight_map"].items()}
            (d / "model.safetensors.index.json").write_text(json.dumps(idx))

        return edit

    def moved_out(d):
        shutil.move(d / shards[0], tmp_path / "outside" / (d.name + ".safetensors"))
        remap(f"../outside/{d.name}.safetensors")(d)

    def linked_out(d):
        shutil.move(d / shards[0], tmp_path / "outside" / (d.name + ".safetensors"))
        (d / shards[0]).symlink_to(tmp_path / "outside" / (d.name + ".safetensors"))

    def tokenizer_link(d):
        (d / "tokenizer.json").symlink_to(tmp_path / "secret.txt")

    cases = [
        (variant("dotdot", moved_out), ["outside its folder"]),
        (variant("absolute", remap("/etc/passwd")), ["outside its folder", "/etc/passwd"]),
        (variant("shardlink", linked_out), ["outside", "a shard in its index"]),
        (variant("toklink", tokenizer_link), ["tokenizer.json", "outside", "refused"]),
    ]
    before = tree(tmp_path)
    for d, frags in cases:
        r = cli("expand", d, "--width", 48, "-q", "-o", tmp_path / f"{d.name}-out")
        refused(r, 2, *frags, folder=tmp_path, before=before)

    cache = tmp_path / "models--org--tiny"
    snap = cache / "snapshots" / "abc123"
    (cache / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    single = write_ckpt(tmp_path / "single", make_config())
    (single / "tokenizer.json").write_text('{"version": "1.0"}')
    for f in single.iterdir():
        blob = cache / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    r = cli("expand", snap, "--width", 48, "-q", "-o", tmp_path / "grown")
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "grown" / "tokenizer.json").read_text() == '{"version": "1.0"}'


# ---- 4: outputs never touch an input --------------------------------------------------------


def test_outputs_never_overlap_inputs(tmp_path, monkeypatch, sharded_run):
    """4. An output onto the folder's config.json (--force), inside the input folder (no --force
    needed before), a run folder holding its own checkpoint or an HF input folder: refused before
    any work; and an output that appears while this one is written is not replaced at the rename."""
    hf = write_ckpt(tmp_path / "hf", make_config())
    work = tmp_path / "work"
    work.mkdir()
    final = write_ckpt(work / "final.safetensors", make_config(vocab=256, context=8))
    text = text_file(tmp_path / "t.txt")
    before = tree(tmp_path)
    for args in (
        ["expand", hf / "model.safetensors", "--width", 48, "-o", hf / "config.json", "--force"],
        ["expand", hf, "--width", 48, "-o", hf / "model.safetensors.index.json"],
        ["fold", hf, "--alpha", 1, "-o", hf / "sub"],
        ["train", final, "--data", text, "--out", work, *TRAIN],
        ["train", hf, "--data", text, "--out", hf, *TRAIN],
    ):
        r = cli(*args)
        refused(r, 2, "input", folder=tmp_path, before=before)

    run_dir = sharded_run[0] / "run"
    run_before = tree(run_dir)
    refused(
        cli("expand", run_dir, "--width", 48, "-o", run_dir / "grown"),
        2,
        "would overwrite the input",
        folder=run_dir,
        before=run_before,
    )

    from growtool.io import checkpoint
    from growtool.io.stream import write_stream

    real = write_stream
    out = tmp_path / "race.safetensors"

    def racing(fh, *a, **kw):  # another growtool finishes the same output meanwhile
        real(fh, *a, **kw)
        out.write_bytes(b"the other one")

    monkeypatch.setattr(checkpoint, "write_stream", racing)
    r = cli("expand", hf, "--width", 48, "-q", "-o", out)
    refused(
        r,
        2,
        "appeared while this one was written",
        folder=tmp_path,
        before={**before, out.name: tree(tmp_path)[out.name]},
    )
    assert out.read_bytes() == b"the other one"


# ---- 5: one config per folder ----------------------------------------------------------------


def test_a_folders_config_json_is_the_config(tmp_path):
    """5. An edit to config.json that changes the function (norm eps) and that the weights' metadata
    contradicts is refused (it was silently ignored); an edit elsewhere (a token id) is what the
    output carries (it was rewritten from the stale copy). And (9) a float32 expand of a bfloat16
    folder says float32 in its config.json."""
    import dataclasses

    cfg = dataclasses.replace(make_config(), extra={"dtype": "bfloat16", "bos_token_id": 1})
    hf = write_ckpt(tmp_path / "hf", cfg, dtype=torch.bfloat16)
    c = json.loads((hf / "config.json").read_text())
    c["rms_norm_eps"] = 1e-2
    (hf / "config.json").write_text(json.dumps(c))
    before = tree(tmp_path)
    r = cli("expand", hf, "--width", 48, "-q", "-o", tmp_path / "out")
    refused(r, 2, "config.json", "norm_eps", "metadata", folder=tmp_path, before=before)

    c["rms_norm_eps"], c["bos_token_id"] = 1e-5, 7
    (hf / "config.json").write_text(json.dumps(c))
    r = cli("expand", hf, "--width", 48, "-q", "--dtype", "float32", "-o", tmp_path / "out")
    assert r.exit_code == 0, r.stderr
    out = json.loads((tmp_path / "out" / "config.json").read_text())
    assert out["bos_token_id"] == 7 and out["dtype"] == "float32"
    header, _ = read_raw(tmp_path / "out" / "model.safetensors")
    assert header["lm_head.weight"]["dtype"] == "F32"
    assert json.loads(header["__metadata__"]["config"])["dtype"] == "float32"


# ---- 6: run folders survive a failed write ---------------------------------------------------


def test_a_full_disk_during_train_leaves_a_run_that_resumes_or_restarts(tmp_path, monkeypatch):
    """6. The disk fills while the state of step 4 is written: one line, exit 2, the step-2 pair
    untouched and nothing pending left; ``--resume`` then finishes the run. A disk full at the very
    first save of a new run folder removes the folder (issue 41); the run then starts over. A metrics
    line cut short is dropped on resume."""
    import errno

    from growtool.training import loop as train_mod
    from growtool.training.run_folder import save_bytes as real

    src = write_ckpt(tmp_path / "a.safetensors", make_config(width=16, heads=2, layers=1, vocab=256, context=8))
    text = text_file(tmp_path / "t.txt")
    calls, pair = [], {}

    def full_disk_at(n):
        def save_bytes(path, obj):
            calls.append(path)
            if len(calls) == n:
                pair.update({k: tree(tmp_path / "run").get(k) for k in ("last.pt", "last.safetensors")})
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return real(path, obj)

        return save_bytes

    args = ["train", src, "--data", text, "--out", tmp_path / "run", "--save-every", 2, *TRAIN]
    monkeypatch.setattr(train_mod, "save_bytes", full_disk_at(3))  # steps 2, 3 (pre-decay/: wsd decays at 3), 4
    refused(cli(*args), 2, "no space left on device")
    after = tree(tmp_path / "run")
    assert pair["last.pt"] is not None and {k: after[k] for k in pair} == pair  # the step-2 pair, as it was
    assert not [n for n in after if n.startswith(".") or "pending" in n or n.endswith(".tmp")]
    with open(tmp_path / "run" / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 9, "lo')  # cut short
    monkeypatch.setattr(train_mod, "save_bytes", real)
    r = cli(*args, "--resume")
    assert r.exit_code == 0, r.stderr
    assert [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [
        0,
        1,
        2,
        3,
        4,
    ]

    calls.clear()
    args[args.index("--out") + 1] = tmp_path / "run2"
    monkeypatch.setattr(train_mod, "save_bytes", full_disk_at(1))
    refused(cli(*args), 2, "no space left on device")
    assert not (tmp_path / "run2").exists()  # issue 41: a run folder this failed run made is not left behind
    monkeypatch.setattr(train_mod, "save_bytes", real)
    r = cli(*args)  # starts over
    assert r.exit_code == 0, r.stderr


# ---- 7: a YAML alias bomb --------------------------------------------------------------------


def test_a_recipe_alias_bomb_is_refused_at_once(tmp_path, src):
    """7. A 1 KB recipe of nested aliases (10^9 values once expanded) is refused in a moment, in little
    memory, with one line (the error message used to format the expanded value)."""
    levels = ['&a ["x","x","x","x","x","x","x","x","x","x"]']
    for k in "bcdefghi":
        levels.append(f"&{k} [" + ",".join([f"*{chr(ord(k) - 1)}"] * 10) + "]")
    lines = ["description: [" + ", ".join(levels) + "]"]  # a known key whose bad value is 10^9 strings
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    assert bomb.stat().st_size < 1024
    before = tree(tmp_path)
    cmd = [GROWTOOL, "expand", src, "--width", 48, "--recipe", bomb, "-o", tmp_path / "o.safetensors"]
    limited = 'ulimit -v 8000000; exec "$0" "$@"'  # 8 GB of address space: the bomb may not take the machine
    r = subprocess.run(["bash", "-c", limited, *map(str, cmd)], capture_output=True, timeout=1800)
    refused(r, 2, "bomb.yaml", "aliases", folder=tmp_path, before=before)


# ---- 8: bad input is exit 2, not 3 -----------------------------------------------------------


def _edit_meta(src: Path, dst: Path, fn) -> Path:
    h, data = read_raw(src)
    fn(h["__metadata__"])
    dst.write_bytes(raw_safetensors(h, data))
    return dst


def test_malformed_inputs_are_bad_input_not_bugs(tmp_path, src, sharded_run, monkeypatch):
    """8. Malformed metadata lineage, tokenizer record and config values; a malformed nanoGPT file; a
    truncated or incomplete last.pt; verify --data on an empty file; closed standard input; torch's
    out-of-memory; absurd widths (``--width 10**20 --dry-run`` hung): each exit 2 and one line (each
    was exit 3, "a bug in growtool", or a hang). A cut-short token cache is rebuilt."""

    def config_edit(**kw):
        def fn(m):
            c = json.loads(m["config"])
            c.update(kw)
            m["config"] = json.dumps(c).replace('"INF"', "1e400")

        return fn

    bad = {
        "lineage": (lambda m: m.update(lineage='{"op": "init"}'), ["lineage", "not a list"]),
        "tokens": (lambda m: m.update(lineage='[{"op": "train", "tokens": "many"}]'), ["lineage entry 0", "tokens"]),
        "tokrec": (lambda m: m.update(tokenizer='{"from": "x", "files": ["a"]}'), ["tokenizer record"]),
        "overflow": (config_edit(hidden_size="INF"), ["malformed value"]),
        "rope": (config_edit(rope_parameters=[1]), ["rope_parameters must be a JSON object"]),
    }
    d = tmp_path / "bad"
    d.mkdir()
    files = {k: _edit_meta(src, d / f"{k}.safetensors", fn) for k, (fn, _) in bad.items()}
    torch.save({"model": {}, "model_args": [1, 2]}, d / "nano.pt")
    (d / "empty.txt").write_bytes(b"")
    run_dir, _, text = _crafted(tmp_path / "r", sharded_run, None, record_sha=False)
    state = torch.load(run_dir / "last.pt", weights_only=True)
    truncated = run_dir / "last.pt"
    truncated.write_bytes(truncated.read_bytes()[:300])
    incomplete = _crafted(tmp_path / "r2", sharded_run, None, record_sha=False)[0]
    torch.save({"step": state["step"]}, incomplete / "last.pt")
    before = tree(tmp_path)
    resume = ["--data", text, "--resume", "--fsdp", *TRAIN]
    cases = [(["expand", files[k], "--width", 48, "-o", tmp_path / "o"], frags) for k, (_, frags) in bad.items()]
    cases += [
        (["inspect", d / "nano.pt"], ["malformed nanoGPT"]),
        (["train", sharded_run[1], "--out", run_dir, *resume], ["last.pt", "not a readable training state"]),
        (["train", sharded_run[1], "--out", incomplete, *resume], ["last.pt", "incomplete training state"]),
        (["verify", src, src, "--data", d / "empty.txt"], ["empty.txt", "empty file"]),
    ]
    for args, frags in cases:
        refused(cli(*args), 2, *frags, folder=tmp_path, before=before)

    p = subprocess.run(
        [GROWTOOL, "expand", "-", "--width", "48", "-o", str(tmp_path / "o")],
        capture_output=True,
        preexec_fn=lambda: os.close(0),
        timeout=1800,
    )
    refused(p, 2, "standard input is closed", folder=tmp_path, before=before)
    for width, runner in ((10**20, run), (10**9, cli)):  # the one that hung in a process with a timeout
        r = runner("expand", src, "--width", width, "--dry-run", "-q", **({"timeout": 60} if runner is run else {}))
        refused(r, 2, f"--width {width}", "beyond any machine", folder=tmp_path, before=before)

    from growtool.grow import engine

    def oom(*a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(engine, "grow_tensor", oom)
    refused(
        cli("expand", src, "--width", 48, "-q", "-o", tmp_path / "o.safetensors"),
        2,
        "out of memory",
        folder=tmp_path,
        before=before,
    )
    monkeypatch.undo()

    ok = _crafted(tmp_path / "r3", sharded_run, None, record_sha=False)[0]
    state["sharded_sha256"] = hashlib.sha256((ok / "last-2.dcp" / ".metadata").read_bytes()).hexdigest()
    torch.save(state, ok / "last.pt")
    (cache,) = (ok / "cache").glob("tokens-*.uint16")  # beside it its .json and .docs records
    cache.write_bytes(cache.read_bytes()[:-1])  # cut short
    r = cli("train", sharded_run[1], "--out", ok, *resume)
    assert r.exit_code == 0, r.stderr


# ---- 9: the smaller items --------------------------------------------------------------------


def _shifted(h: dict, data: bytes, at: int, gap: bytes) -> bytes:
    """``gap`` inserted into the data at offset ``at`` (tensors from there on moved along)."""
    for n, e in h.items():
        if n != "__metadata__" and e["data_offsets"][0] >= at:
            e["data_offsets"] = [o + len(gap) for o in e["data_offsets"]]
    return raw_safetensors(h, data[:at] + gap + data[at:])


def test_smaller_items(tmp_path, src, monkeypatch):
    """9. Trailing bytes, a hole between tensors, a key given twice (the safetensors library refuses
    each); a config.json linked to /dev/zero; a FIFO as input (it blocked); a folder named
    x.safetensors (was "a folder without config.json"); a warning above the error; ``-o . --force``
    (left a hidden ..XXXX.old); a float16 expand past 65504 (wrote Inf): one line each, no damage."""
    d = tmp_path / "items"
    d.mkdir()
    h, data = read_raw(src)
    first = min(e["data_offsets"][1] for n, e in h.items() if n != "__metadata__" and e["data_offsets"][0] == 0)
    (d / "trailing.safetensors").write_bytes(src.read_bytes() + b"\0" * 8)
    (d / "hole.safetensors").write_bytes(_shifted(json.loads(json.dumps(h)), data, first, b"HIDDEN!!"))
    name = next(n for n in h if n != "__metadata__")
    raw = raw_safetensors(h, data)
    n = int.from_bytes(raw[:8], "little")
    dup = raw[8 : 8 + n].replace(b"{", b'{"%s": %s, ' % (name.encode(), json.dumps(h[name]).encode()), 1)
    (d / "dup.safetensors").write_bytes(len(dup).to_bytes(8, "little") + dup + data)
    zero = write_ckpt(d / "zero", make_config())
    (zero / "config.json").unlink()
    (zero / "config.json").symlink_to("/dev/zero")
    (d / "dir.safetensors").mkdir()
    os.mkfifo(d / "fifo.safetensors")
    cfg = make_config()
    big = {k: (v.clamp(-1, 1) * 60000 if v.dim() > 1 else v.abs() * 0 + 60000) for k, v in _tensors(cfg).items()}
    from growtool.io import checkpoint

    checkpoint.save_tensors(str(d / "f16.safetensors"), cfg, [], {k: v.half() for k, v in big.items()})
    before = tree(tmp_path)
    out = ["--width", 48, "-q", "-o", tmp_path / "o.safetensors"]
    for f, frags in (
        ("trailing.safetensors", ["trailing.safetensors", "8 bytes after the last tensor"]),
        ("hole.safetensors", ["hole.safetensors", "8 unused bytes before tensor", "hole"]),
        ("dup.safetensors", ["dup.safetensors", "twice"]),
        ("zero", ["zero/config.json", "is a device"]),
        ("dir.safetensors", ["dir.safetensors", "is a folder, not a safetensors file"]),
        ("f16.safetensors", ["float16's range", "o.safetensors"]),
    ):
        refused(cli("expand", d / f, *out), 2, *frags, folder=tmp_path, before=before)
    refused(run("expand", d / "fifo.safetensors", *out, timeout=1800), 2, "is a pipe", folder=tmp_path, before=before)

    import warnings

    from growtool.grow import recipes

    real = recipes.load

    def warns(*a, **kw):
        warnings.warn("a library warning", UserWarning, stacklevel=2)
        return real("no-such-recipe")

    monkeypatch.setattr(recipes, "load", warns)
    refused(cli("expand", src, *out), 2, "unknown recipe", folder=tmp_path, before=before)
    monkeypatch.undo()

    here = tmp_path / "here"
    here.mkdir()
    before = tree(tmp_path)
    monkeypatch.chdir(here)
    r = cli("expand", src, "--width", 48, "-q", "-o", ".", "--force")
    refused(r, 2, "current folder", folder=tmp_path, before=before)


def _tensors(cfg):
    from helpers import random_tensors

    return random_tensors(cfg)


def test_model_card_text_is_inert_and_remote_code_loads_with_loading_info(tmp_path, src):
    """9. Lineage text reaches the model card escaped (no links, tags or table cells of its own); a
    grown remote-code folder loads with ``output_loading_info=True`` (its override assumed a model)."""
    transformers = pytest.importorskip("transformers")
    evil = '[{"op": "note", "text": "[click](http://evil.example) <img src=x onerror=alert(1)> | cell"}]'
    gated = _edit_meta(
        write_ckpt(tmp_path / "g.safetensors", make_config(attn_gate=True)),
        tmp_path / "e.safetensors",
        lambda m: m.update(lineage=evil),
    )
    r = cli("expand", gated, "--width", 48, "-q", "-o", tmp_path / "grown")
    assert r.exit_code == 0, r.stderr
    card = (tmp_path / "grown" / "README.md").read_text()
    row = next(line for line in card.splitlines() if "click" in line)
    assert not re.search(r"(?<!\\)<img", card) and not re.search(r"(?<!\\)\]\(http", card), row  # escaped
    assert row.count("|") - row.count("\\|") == 3, row  # the table's own cells only
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "grown", trust_remote_code=True, output_loading_info=True
    )
    assert not info["missing_keys"] and model.growth_gates() and not any(g.requires_grad for g in model.growth_gates())
