"""Hostile and unlucky inputs, round 2 (issue 41): the causes whose first tests ran in-process, here as
real processes. A sharded state made by a real ``torchrun --fsdp`` run (two CPU processes, gloo) with a
data file linked out of the run folder (9); SIGTERM delivered by the operating system while a real
process loads that state (8); a tokenizers panic reached from the command line outside the corpus (7);
a second real ``train`` on a run folder a first real ``train`` holds (3).

Each test hashes every file of its working folder (inputs, run folder, and ``TMPDIR``, where an
internal error's traceback file would go) before and after, and checks the exit code the README
defines, exactly one stderr line and no traceback.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import GROWTOOL, make_config, refused, text_file, tree, write_ckpt

SMALL = ("--batch", "2", "--seq", "8", "--eval-batches", "1", "--device", "cpu", "-q")
HANG = 600  # a hang guard, never a time limit a loaded machine could hit


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> Path:
    """A folder with a checkpoint, a text and ``run``: a real ``torchrun --fsdp`` run of two processes
    stopped at step 2 of 4, so ``run/last.pt`` names the sharded state ``last-2.dcp`` (one data file per
    rank). Tests copy it."""
    d = tmp_path_factory.mktemp("fsdp_src")
    write_ckpt(d / "a.safetensors", make_config(width=16, heads=2, layers=1, vocab=256, context=8))
    text_file(d / "t.txt")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "growtool.cli"]
    cmd += ["train", str(d / "a.safetensors"), "--data", str(d / "t.txt"), "--out", str(d / "run"), "--fsdp"]
    cmd += ["--steps", "4", "--stop-at", "2", *SMALL]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=HANG)
    assert p.returncode == 0, p.stderr[-3000:]
    names = sorted(f.name for f in (d / "run" / "last-2.dcp").iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp"], names  # both ranks wrote their shard
    return d


def workspace(src: Path, tmp_path: Path) -> tuple[Path, dict]:
    """A copy of ``src`` in ``tmp_path/w`` with its own ``tmp`` folder, and the environment that makes
    it the children's ``TMPDIR`` (so a file written there is seen by ``tree``)."""
    w = tmp_path / "w"
    shutil.copytree(src, w, symlinks=True)
    (w / "tmp").mkdir()
    return w, child_env(w)


def child_env(w: Path, **kw) -> dict:
    """The children's environment: ``w/tmp`` as ``TMPDIR`` (an internal error's traceback file would go
    there, inside the hashed tree). torch makes its compiler's cache folder (empty) in ``TMPDIR``
    when an optimizer is built, whatever the run does; it is pointed next to ``w``, not into it."""
    cache = str(w.parent / "torch-cache")
    return {**os.environ, "TMPDIR": str(w / "tmp"), "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": "1", **kw}


def resume_args(w: Path) -> list[str]:
    """``train --fsdp --resume`` of the fixture's run, its settings repeated (one process: a sharded
    state resumes on any number of ranks)."""
    args = ["train", str(w / "a.safetensors"), "--data", str(w / "t.txt"), "--out", str(w / "run"), "--fsdp"]
    return [*args, "--steps", "4", *SMALL, "--resume"]


def wait_for(path: Path, proc: subprocess.Popen, what: str) -> None:
    """Wait until ``path`` exists, while ``proc`` runs (it must not end first)."""
    deadline = time.monotonic() + HANG
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"{what} ended (exit {proc.returncode}) before {path.name} appeared: {err!r}")
        assert time.monotonic() < deadline, f"{what}: {path.name} never appeared"
        time.sleep(0.02)


@pytest.mark.parametrize("plant", ["link", "fifo"])
def test_a_sharded_state_data_file_that_is_not_a_file_of_the_folder_is_refused(fsdp_run, tmp_path, plant):
    """9, 8. A data file of the state folder replaced by a link to a file outside the run folder (its very
    bytes, so a load through the link would succeed), or by a FIFO (a read that never ends):
    ``train --resume`` refuses before reading it, exit 2, one line; the linked-to file and the whole
    run folder unchanged."""
    w, env = workspace(fsdp_run, tmp_path)
    name = "__0_0.distcp" if plant == "link" else "__1_0.distcp"
    data = w / "run" / "last-2.dcp" / name
    outside = tmp_path / "elsewhere" / "shard.distcp"
    outside.parent.mkdir()
    data.rename(outside)
    if plant == "link":
        data.symlink_to(outside)
    else:
        os.mkfifo(data)
    before, linked = tree(w), outside.read_bytes()
    r = subprocess.run([GROWTOOL, *resume_args(w)], capture_output=True, env=env, timeout=HANG)
    refused(r, 2, name, "not a regular file of the sharded state")
    assert tree(w) == before
    assert outside.read_bytes() == linked and sorted(os.listdir(outside.parent)) == ["shard.distcp"]


# The real ``growtool`` program, run with DCP's data reader paused at its start: it marks the pause
# (the file named by its first argument) and sleeps, so the test's SIGTERM lands inside ``dcp.load``
# at a known point. Test code only: the product has no such hook.
PAUSED_READ = r"""
import sys, time
from pathlib import Path
from torch.distributed.checkpoint import FileSystemReader

marker = Path(sys.argv.pop(1))

def read_data(self, plan, planner):
    marker.write_text("reading")
    time.sleep(3600)

FileSystemReader.read_data = read_data
sys.argv[0] = "growtool"
from growtool.program import main
main()
"""


def test_sigterm_during_a_sharded_load_exits_143(fsdp_run, tmp_path):
    """8. SIGTERM sent by the operating system while a real ``train --resume`` is inside DCP's load (DCP
    wraps every failure, BaseExceptions too, into its CheckpointException): exit 143, one
    "interrupted (SIGTERM)" line, not exit 2's "cannot load"; nothing in the folder changed."""
    w, env = workspace(fsdp_run, tmp_path)
    marker = tmp_path / "probe" / "reading"
    marker.parent.mkdir()
    before = tree(w)
    cmd = [sys.executable, "-c", PAUSED_READ, str(marker), *resume_args(w)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=w)
    try:
        wait_for(marker, proc, "train --resume")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    r = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    line = refused(r, 128 + signal.SIGTERM, "interrupted (SIGTERM)", "the run resumes from step 2 (its last save)")
    assert line.endswith(" --resume") and tree(w) == before


def test_a_tokenizer_panic_on_a_prompt_is_one_line(tmp_path):
    """7. The tokenizers library panicking (pyo3's PanicException, a BaseException, with a Rust message
    printed to descriptor 2 by the library itself) outside the corpus: on ``sample --prompt`` (a prompt,
    as ``verify --generate --prompt`` encodes it) and on the text ``verify --generate --data`` takes its
    prompts from. Each is one line, exit 2 (the tokenizer failed on this input), no Rust message,
    nothing written (exit 3 with the Rust panic's lines before)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    w = tmp_path / "w"
    w.mkdir()
    (w / "tmp").mkdir()
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(a+)+c"), behavior="isolated")  # backtracks past the limit
    tok.save(str(w / "tokenizer.json"))  # beside the checkpoint: its own tokenizer
    ck = write_ckpt(w / "a.safetensors", make_config(width=16, heads=2, layers=1, vocab=64, context=8))
    prompt = "a" * 40 + "b"
    (w / "p.txt").write_text((prompt + " ") * 20)
    env = child_env(w, RUST_BACKTRACE="1")
    before = tree(w)
    for args, where in (
        (["sample", ck, "--prompt", prompt, "--max-tokens", "2", "--device", "cpu"], "this prompt"),
        (["verify", ck, ck, "--generate", "2", "--data", w / "p.txt"], str(w / "p.txt")),
    ):
        r = subprocess.run([GROWTOOL, *map(str, args)], capture_output=True, env=env, timeout=HANG)
        refused(r, 2, f"the tokenizer failed on {where}", "retry-limit")
        assert b"panicked" not in r.stderr
        assert tree(w) == before


# The real ``growtool`` program with AdamW's step raising a BaseException of a type of its own, as a
# native library's does (pyo3's PanicException derives from BaseException); test code only. No input
# reaches such an exception: the tokenizers library's panics on user text are each caught where they
# arise (``tokenizer.native``, the test above), and growtool calls no other native library that raises one.
RAISING_STEP = r"""
import sys
import torch

class NativeAbort(BaseException):
    pass

def step(self, closure=None):
    raise NativeAbort("called `Option::unwrap()` on a `None` value")

torch.optim.AdamW.step = step
sys.argv[0] = "growtool"
from growtool.program import main
main()
"""


def test_a_native_base_exception_mid_run_is_one_line_exit_3(tmp_path):
    """7. A BaseException that is neither an Exception nor an interrupt, raised in the middle of a real
    ``train`` (in its first optimizer step, after the run folder was made): one internal-error line
    naming it and the traceback file, exit 3; the run folder this command made is gone; the only new
    file is that traceback, in ``TMPDIR``."""
    w = tmp_path / "w"
    w.mkdir()
    (w / "tmp").mkdir()
    write_ckpt(w / "a.safetensors", make_config(width=16, heads=2, layers=1, vocab=256, context=8))
    text_file(w / "t.txt")
    before = tree(w)
    cmd = [sys.executable, "-c", RAISING_STEP, "train", str(w / "a.safetensors"), "--data", str(w / "t.txt")]
    cmd += ["--out", str(w / "run"), "--steps", "4", *SMALL]
    r = subprocess.run(cmd, capture_output=True, env=child_env(w), cwd=w, timeout=HANG)
    line = refused(r, 3, "internal error: NativeAbort: called `Option::unwrap()`", "a bug in growtool")
    after = tree(w)
    new = sorted(set(after) - set(before))
    assert len(new) == 1 and new[0].startswith("tmp/growtool-traceback-"), new
    assert str(w / new[0]) in line
    assert "NativeAbort" in (w / new[0]).read_text() and "Traceback" in (w / new[0]).read_text()
    assert {k: v for k, v in after.items() if k != new[0]} == before  # no run folder left, inputs as they were


def test_a_second_train_on_a_run_folder_a_running_train_holds_is_refused(tmp_path):
    """3. A first real ``train`` runs (it has made ``run`` and locked it: its metrics file is there) and
    is paused (SIGSTOP, so the folder holds still); a second real ``train --out run`` is refused at once:
    exit 2, one line, nothing in the folder changed. The first then stops cleanly on SIGTERM (exit 143,
    one line saying it saved nothing yet) and its lock is gone with it."""
    w = tmp_path / "w"
    w.mkdir()
    (w / "tmp").mkdir()
    write_ckpt(w / "a.safetensors", make_config(width=16, heads=2, layers=1, vocab=256, context=8))
    text_file(w / "t.txt")
    env = child_env(w)
    base = [GROWTOOL, "train", str(w / "a.safetensors"), "--data", str(w / "t.txt"), "--out", str(w / "run"), *SMALL]
    long = [*base, "--steps", "1000000", "--save-every", "1000000"]  # runs until stopped, saves nothing
    first = subprocess.Popen(long, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        wait_for(w / "run" / "metrics.jsonl", first, "the first train")  # written inside the locked folder
        first.send_signal(signal.SIGSTOP)
        before = tree(w)
        r = subprocess.run([*base, "--steps", "4"], capture_output=True, env=env, timeout=HANG)
        refused(r, 2, "another train is using this run folder")
        assert tree(w) == before
        first.send_signal(signal.SIGCONT)
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=HANG)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    r = subprocess.CompletedProcess(base, first.returncode, out, err)
    refused(r, 128 + signal.SIGTERM, "interrupted (SIGTERM); nothing saved yet: run the same command again")
    fd = os.open(w / "run", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if the lock outlived the run
    finally:
        os.close(fd)
