"""FSDP2 under torchrun (gloo, two CPU processes) follows the single-process run with the same global
batch; its sharded state (DCP) resumes on two ranks and then on one, matching the uninterrupted run.

The two-process run also splits each rank's slice into two micro-batches and recomputes activations
in backward: neither may change the losses beyond round-off."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

from growtool.io import checkpoint
from growtool.nn.errors import GrowError
from growtool.training.loop import train
from growtool.training.run_folder import STATE

from helpers import grown_gpt2

ARGS = dict(steps=20, batch=8, seq=16, eval_every=5, eval_batches=2, lr=3e-3, seed=1, save_every=4)
ARGS["gate_warmup_tokens"] = 10 * ARGS["batch"] * ARGS["seq"]  # the gates ramp over the first 10 steps
TOL = 1e-5


def metrics(path):
    return [json.loads(line) for line in open(path)]


def torchrun(grown, text, out, *extra):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "growtool.cli", "train", grown, "--data", str(text), "--out", str(out), "--device", "cpu", "-q"]
    cmd += [x for k, v in ARGS.items() for x in (f"--{k.replace('_', '-')}", str(v))] + [str(e) for e in extra]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def one_process(grown, text, out, **kw):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(grown, [text], out, device="cpu", progress=False, **{**ARGS, **kw})
    finally:
        torch.set_num_threads(threads)


def same_losses(a, b, steps):
    assert [x["step"] for x in a] == [x["step"] for x in b] == list(steps)
    for x, y in zip(a, b):
        for k in ("loss", "val_loss"):
            assert (k in x) == (k in y), (x["step"], k)
            if k in x:
                assert abs(x[k] - y[k]) <= TOL, (x["step"], k, x[k], y[k])
        assert x.get("gate") == y.get("gate")
        if "grad_norm" in x:  # Adam would hide a wrongly scaled gradient from the losses; the norm shows it
            assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4), (x["step"], "grad_norm")


@pytest.fixture(scope="module")
def grown_run(tmp_path_factory):
    """A grown, gated GPT-2 (tied head) and the uninterrupted single-process run of it."""
    d = tmp_path_factory.mktemp("fsdp")
    text, _, grown = grown_gpt2(d, layers=2)
    one = one_process(grown, text, d / "one")
    ref = metrics(one["metrics"])
    assert ref[-1]["val_loss"] < ref[0]["val_loss"] - 0.05  # it trained: the curves are not flat by accident
    assert [r["gate"] for r in ref[:12:2]] == [0.0, 0.1, 0.3, 0.5, 0.7, 0.9] and ref[-1]["gate"] == 1.0
    return {"dir": d, "text": text, "grown": grown, "one": one, "ref": ref}


def test_fsdp_two_processes_match_one(grown_run):
    d, ref = grown_run["dir"], grown_run["ref"]
    p = torchrun(
        grown_run["grown"], grown_run["text"], d / "fsdp", "--fsdp", "--grad-accum", 2, "--activation-checkpointing"
    )
    assert p.stdout.strip().splitlines() == [str(d / "fsdp" / "final.safetensors")]  # written once, by rank 0
    same_losses(metrics(d / "fsdp" / "metrics.jsonl"), ref, range(21))
    assert [p.name for p in (d / "fsdp").glob("last-*.dcp")] == ["last-20.dcp"]  # older states removed
    saved = dcp.FileSystemReader(d / "fsdp" / "last-20.dcp").read_metadata().state_dict_metadata
    for name in (
        "model.transformer.h.0.attn.c_attn.weight",
        "optimizer.state.transformer.h.0.attn.c_attn.weight.exp_avg",
    ):
        assert [(tuple(c.offsets), tuple(c.sizes)) for c in saved[name].chunks] == [
            ((0, 0), (24, 144)),
            ((24, 0), (24, 144)),
        ]
    final = checkpoint.load(d / "fsdp" / "final.safetensors")
    assert final.lineage[-1]["world_size"] == 2 and not final.config.gated  # gathered, gates folded
    x = torch.randint(256, (4, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        la = final.model()(x)
        lb = checkpoint.load(grown_run["one"]["final"]).model()(x)
    assert float((la - lb).abs().max()) < 1e-4 * float(lb.std())
    # the state where wsd's decay begins (20 steps, decay over the last 4), sharded too; a copy resumes on one rank
    pre = torch.load(d / "fsdp" / "pre-decay" / STATE, weights_only=True)
    assert pre["step"] == 16 and pre["sharded"] == "last-16.dcp" and (d / "fsdp" / "pre-decay" / "last-16.dcp").is_dir()
    shutil.copytree(d / "fsdp" / "pre-decay", d / "pre-copy")
    r = one_process(grown_run["grown"], grown_run["text"], d / "pre-copy", fsdp=True, resume=True)
    assert r["steps"] == 20
    same_losses(metrics(d / "pre-copy" / "metrics.jsonl"), ref, range(21))


def test_fsdp_state_resumes_on_two_ranks_then_one(grown_run):
    out = grown_run["dir"] / "resumed"
    torchrun(grown_run["grown"], grown_run["text"], out, "--fsdp", "--stop-at", 8)
    state = torch.load(out / STATE, weights_only=True)
    assert state["sharded"] == "last-8.dcp" and "optimizer" not in state
    torchrun(grown_run["grown"], grown_run["text"], out, "--fsdp", "--resume", "--stop-at", 14)
    r = one_process(grown_run["grown"], grown_run["text"], out, fsdp=True, resume=True)  # one rank, no torchrun
    assert r["steps"] == 20
    same_losses(metrics(out / "metrics.jsonl"), grown_run["ref"], range(21))


def test_micro_batches_and_recomputation_keep_the_losses(grown_run, tmp_path):
    """One process: --grad-accum 4 and --activation-checkpointing change memory, not the run."""
    r = one_process(
        grown_run["grown"], grown_run["text"], tmp_path / "accum", grad_accum=4, activation_checkpointing=True
    )
    same_losses(metrics(r["metrics"]), grown_run["ref"], range(21))


def test_grad_accum_must_divide_each_share(grown_run, tmp_path):
    with pytest.raises(GrowError, match="--grad-accum 3 does not divide each process's 8 sequences"):
        one_process(grown_run["grown"], grown_run["text"], tmp_path / "bad", grad_accum=3)
    assert not (tmp_path / "bad").exists()


def test_fsdp_gives_the_new_parameters_their_own_step(grown_run, tmp_path):
    """The plain path's grown checkpoint with its new parameters' step doubled and re-warmed (issue 40's
    ``--new-lr-mult 2 --new-rewarm-steps 4``) trains under --fsdp as in one process: each rank treats its
    shard's entries."""
    from growtool import surgery

    source = grown_run["dir"] / "a.safetensors"
    grown = str(surgery.expand(str(source), width=48, out=str(tmp_path / "expanded.safetensors")))
    treat = dict(new_lr_mult=2.0, new_rewarm_steps=4)
    ref = metrics(one_process(grown, grown_run["text"], tmp_path / "one", **treat)["metrics"])
    plain = metrics(
        one_process(grown, grown_run["text"], tmp_path / "off", new_lr_mult=1.0, new_rewarm_steps=0)["metrics"]
    )
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(ref, plain) if "loss" in a) > 1e-3  # the treatment bites
    torchrun(grown, grown_run["text"], tmp_path / "fsdp", "--fsdp", "--new-lr-mult", 2, "--new-rewarm-steps", 4)
    same_losses(metrics(tmp_path / "fsdp" / "metrics.jsonl"), ref, range(21))
