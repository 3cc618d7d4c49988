"""Hostile and unlucky arguments and run state (issue 41, causes 10 to 13 and the leftovers), each
cause as a real ``growtool`` process (a parametrised cause's further cases in-process, ``growtool_in``,
but for the absurd growth targets, whose processes keep a failed check from the test run's memory):
exit 2, exactly one stderr line, no traceback, every file in the working folder hashed before and
after (nothing changed, nothing left behind).

10. Run-state and lineage fields are checked where they are loaded (a wrong-typed growth list, an
    AdamW moment of the wrong shape, settings without ``steps``, a negative ``data_end``, a step
    beyond the run).
11. Numeric options are finite and in range (``--lr inf``, ``--weight-decay inf``, seeds beyond
    64 bits, ``init --gamma inf``), through the checks the library uses (growtool/nn/args.py).
12. Absurd depth and --grow-at targets are refused before any work; a refusal found once the data
    is counted leaves no cache behind.
13. A depth growth that grows nothing is refused.
Leftovers: a Gemma-2 config with a string ``final_logit_softcapping`` and a nanoGPT checkpoint with
``n_head = 0`` are bad input (exit 2), not internal errors.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from helpers import cli, make_config, refused, run, text_file, tree, write_ckpt

TRAIN = ("--steps", 4, "--batch", 2, "--seq", 8, "--eval-batches", 1, "--device", "cpu", "-q")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A small byte-vocabulary source, a text file, and a run of it stopped at step 2 (resumable)."""
    d = tmp_path_factory.mktemp("hostile_args")
    src = write_ckpt(d / "a.safetensors", make_config(width=16, heads=2, layers=2, vocab=256, context=8))
    text = text_file(d / "t.txt")
    r = cli("train", src, "--data", text, "--out", d / "run", "--stop-at", 2, *TRAIN)
    assert r.exit_code == 0, r.stderr
    return d


def growtool_in(folder, args, request, monkeypatch):
    """``growtool ARGS`` run in ``folder``: a real process for a cause's first case (the contract read
    on the process's own standard error), in-process through the same entry point for its other cases
    (each process costs about 2 s of torch's start-up)."""
    if next(iter(request.node.callspec.indices.values())) == 0:
        return run(*args, cwd=folder)
    monkeypatch.chdir(folder)
    return cli(*args)


def _work(tmp_path, made, with_run: bool = False):
    """The inputs (and the stopped run) copied into ``tmp_path``."""
    for name in ("a.safetensors", "t.txt"):
        shutil.copy(made / name, tmp_path / name)
    if with_run:
        shutil.copytree(made / "run", tmp_path / "run")
    return tmp_path


# ---- 11: numeric options ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["train", "a.safetensors", "--data", "t.txt", "--out", "run", "--lr", "inf", *TRAIN], "--lr"),
        (["train", "a.safetensors", "--data", "t.txt", "--out", "run", "--weight-decay", "inf", *TRAIN], "--weight"),
        (["train", "a.safetensors", "--data", "t.txt", "--out", "run", "--seed", 10**26, *TRAIN], "--seed"),
        (["expand", "a.safetensors", "--width", 32, "--seed", 2**64, "-o", "g.safetensors"], "--seed"),
        (["sample", "a.safetensors", "--prompt", "hi", "--temperature", "inf"], "--temperature"),
        (
            ["init", "--family", "llama", "--width", 16, "--layers", 1, "--heads", 2, "--gamma", "inf"]
            + ["-o", "i.safetensors"],
            "--gamma",
        ),
    ],
    ids=[
        "lr-inf",
        "weight-decay-inf",
        "train-seed-1e26",
        "expand-seed-2**64",
        "sample-temperature-inf",
        "init-gamma-inf",
    ],
)
def test_numeric_options_are_finite_and_in_range(tmp_path, made, args, fragment, request, monkeypatch):
    w = _work(tmp_path, made)
    before = tree(w)
    refused(growtool_in(w, args, request, monkeypatch), 2, fragment, folder=w, before=before)


# ---- 10: run state and lineage ------------------------------------------------------------------


def _edit_state(w, fn):
    p = w / "run" / "last.pt"
    state = torch.load(p, weights_only=True)
    fn(state)
    torch.save(state, p)


def _first_moment_wrong(state):
    m = next(iter(state["optimizer"]["state"].values()))
    m["exp_avg"] = torch.zeros(3)


def _relineage(path, fn):
    """Rewrite a checkpoint with ``fn(lineage)`` as its lineage (what an edited file would hold)."""
    from growtool.io import checkpoint

    ck = checkpoint.load(path)
    lineage = fn([dict(e) for e in ck.lineage])
    tensors = {n: v.clone() for n, v in ck.model().tensors().items()}
    checkpoint.save_tensors(str(path), ck.config, lineage, tensors, force=True, tokenizer=ck.tokenizer)


def _far_step(w):
    _edit_state(w, lambda s: s.update(step=10**15))
    _relineage(w / "run" / "last.safetensors", lambda lin: lin[:-1] + [{**lin[-1], "step": 10**15}])


RESUME = ("train", "a.safetensors", "--data", "t.txt", "--out", "run", *TRAIN, "--resume")
GROW_RUN = ("expand", "run", "--width", 32, "-o", "grown")


@pytest.mark.parametrize(
    "edit,command,fragment",
    [
        (lambda w: _edit_state(w, lambda s: s.update(growths=[5])), RESUME, "growths"),
        (lambda w: _edit_state(w, lambda s: s.update(growths=[{"step": "1", "width": 16}])), RESUME, "growth step"),
        (lambda w: _edit_state(w, _first_moment_wrong), RESUME, "moments"),
        (lambda w: _edit_state(w, _first_moment_wrong), GROW_RUN, "moments"),
        (lambda w: _edit_state(w, lambda s: s["settings"].pop("steps")), GROW_RUN, "settings steps"),
        (lambda w: _edit_state(w, lambda s: s["settings"].update(grow_at="x")), GROW_RUN, "grow_at"),
        (_far_step, RESUME, "step"),
    ],
    ids=[
        "growths-int",
        "growth-step-str",
        "moment-shape-resume",
        "moment-shape-expand",
        "no-steps",
        "grow-at-str",
        "step-1e15",
    ],
)
def test_run_state_fields_are_checked_where_loaded(tmp_path, made, edit, command, fragment, request, monkeypatch):
    w = _work(tmp_path, made, with_run=True)
    edit(w)
    before = tree(w)
    line = refused(growtool_in(w, command, request, monkeypatch), 2, fragment, folder=w, before=before)
    assert "last.pt" in line


def test_a_negative_data_end_in_the_lineage_is_refused(tmp_path, made):
    w = _work(tmp_path, made)
    _relineage(w / "a.safetensors", lambda lin: lin + [{"op": "train", "data_end": -5, "step": 4}])
    before = tree(w)
    refused(run("train", "a.safetensors", "--data", "t.txt", "--out", "run", *TRAIN, cwd=w), 2, "data_end")
    assert tree(w) == before  # no run folder, no cache


# ---- 12 and 13: depth and --grow-at targets -------------------------------------------------------


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["expand", "a.safetensors", "--layers", 10**7, "--dry-run"], ["--layers 10000000", "header"]),
        (["expand", "a.safetensors", "--layers", 2, "-o", "g.safetensors"], ["own depth", "nothing to grow"]),
        (["expand", "run", "--layers", 10**7, "-o", "grown"], ["--layers 10000000", "header"]),
        (["expand", "run", "--width", 10**12, "-o", "grown"], ["--width 1000000000000", "beyond any machine"]),
        (["expand", "a.safetensors", "--width", 32, "--layers", 2, "-o", "g.safetensors"], ["nothing to grow"]),
        (
            ["train", "a.safetensors", "--data", "t.txt", "--out", "run", *TRAIN, "--grow-at", "0.5:1000000000000"],
            ["--grow-at 0.5:1000000000000", "beyond any machine"],
        ),
        (
            ["train", "a.safetensors", "--data", "t.txt", "--out", "run", *TRAIN, "--grow-at", "0.5:1000000"],
            ["--grow-at 0.5:1000000", "training the grown model needs"],
        ),
        (
            ["train", "a.safetensors", "--data", "t.txt", "--out", "run", *TRAIN, "--grow-at", "0.5:layers=10000000"],
            ["layers 10000000", "header"],
        ),
        (
            ["train", "a.safetensors", "--data", "t.txt", "--out", "run", *TRAIN, "--grow-at", "0.5:width=32,layers=2"],
            ["layers 2 is not more"],
        ),
    ],
    ids=[
        "layers-1e7-dry-run",
        "layers-same",
        "run-folder-layers-1e7",
        "run-folder-width-1e12",
        "width-and-layers-same",
        "grow-at-width-1e12",
        "grow-at-memory",
        "grow-at-layers-1e7",
        "grow-at-layers-same",
    ],
)
def test_absurd_or_empty_growth_targets_are_refused_before_work(tmp_path, made, args, fragments):
    w = _work(tmp_path, made, with_run=args[1] == "run")
    before = tree(w)
    refused(run(*args, cwd=w, timeout=1800), 2, *fragments, folder=w, before=before)


def test_the_depth_bound_is_the_readers_header_limit():
    """The bound on --layers is the header a reader accepts: grows with the depth, refuses past it."""
    from growtool.grow import limits
    from growtool.io import header
    from growtool.nn.errors import GrowError

    assert limits.MAX_HEADER == header.MAX_HEADER
    cfg = make_config(width=16, heads=2, layers=2)
    assert 0 < limits.header_bytes(cfg, 2) < limits.header_bytes(cfg, 4) < limits.header_bytes(cfg, 1000)
    limits.check_depth(cfg, 1000, 4)  # well within: no error
    with pytest.raises(GrowError, match="header"):
        limits.check_depth(cfg, 200_000, 4)


def test_a_refusal_after_the_data_is_counted_leaves_no_cache(tmp_path, made):
    """Two growths on one step are found only once the run length is known (after tokenising):
    the run folder the command made, or the cache it made in a folder that existed, is removed."""
    w = _work(tmp_path, made)
    grow = ("--grow-at", "0.1:32", "--grow-at", "0.2:48")
    before = tree(w)
    refused(
        run("train", "a.safetensors", "--data", "t.txt", "--out", "run", *TRAIN, *grow, cwd=w),
        2,
        "same step",
        folder=w,
        before=before,
    )
    (w / "run").mkdir()
    before = tree(w)
    refused(
        run("train", "a.safetensors", "--data", "t.txt", "--out", "run", *TRAIN, *grow, cwd=w),
        2,
        "same step",
        folder=w,
        before=before,
    )


# ---- leftovers: config numbers, nanoGPT model_args ------------------------------------------------


def test_a_string_softcap_in_a_gemma2_config_is_bad_input(tmp_path):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=32,
    )
    Gemma2ForCausalLM(cfg).save_pretrained(tmp_path / "g2")
    p = tmp_path / "g2" / "config.json"
    hf = json.loads(p.read_text())
    hf["final_logit_softcapping"] = "30.0"
    p.write_text(json.dumps(hf))
    before = tree(tmp_path)
    refused(run("inspect", "g2", cwd=tmp_path), 2, "final_softcap", folder=tmp_path, before=before)
    refused(
        run("expand", "g2", "--width", 32, "-o", "out", cwd=tmp_path),
        2,
        "final_softcap",
        folder=tmp_path,
        before=before,
    )


@pytest.mark.parametrize("n_head", [0, -2, "4", 2.5])
def test_nanogpt_model_args_are_positive_integers(tmp_path, n_head, request, monkeypatch):
    d = 16
    sd = {"transformer.wte.weight": torch.zeros(64, d), "transformer.wpe.weight": torch.zeros(8, d)}
    args = {"n_layer": 1, "n_head": n_head, "n_embd": d, "block_size": 8, "vocab_size": 64, "bias": False}
    torch.save({"model": sd, "model_args": args}, tmp_path / "ckpt.pt")
    before = tree(tmp_path)
    r = growtool_in(tmp_path, ["inspect", "ckpt.pt"], request, monkeypatch)
    refused(r, 2, "n_head", folder=tmp_path, before=before)
