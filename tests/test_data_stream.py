"""The plain path's default (growtool.training.data.stream_start): a grown checkpoint trained with default flags
continues the data stream where its source's training stopped instead of replaying its batches;
--data-start 0 restarts it; the position is recorded in the lineage and survives a resume."""

import pytest
import torch

from growtool.init import init_model
from growtool.io import checkpoint
from growtool.training.data import Dataset
from growtool.training.loop import train
from growtool.training.run_folder import STATE, read_metrics

from helpers import cli, make_text, tiny_cfg

KW = dict(batch=8, seq=32, eval_batches=2, device="cpu", progress=False, lr=1e-2)


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    d = tmp_path_factory.mktemp("stream")
    text = d / "toy.txt"
    text.write_text(make_text(800))
    base = checkpoint.save_tensors(
        str(d / "base.safetensors"), tiny_cfg(), [], init_model(tiny_cfg(), seed=0).tensors()
    )
    s = train(base, [text], d / "src", steps=6, seed=5, **KW)
    r = cli("expand", s["final"], "--width", 48, "-o", d / "grown.safetensors", "-q")
    assert r.exit_code == 0, r.stderr
    return {"dir": d, "text": text, "src": s, "grown": str(d / "grown.safetensors")}


def losses(out):
    return [r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r]


def test_train_records_the_stream_position(grown):
    entry = checkpoint.load(grown["src"]["final"]).lineage[-1]
    assert entry["op"] == "train" and entry["seed"] == 5 and entry["data_end"] == 6
    assert checkpoint.load(grown["grown"]).lineage[-2]["data_end"] == 6  # expand keeps the lineage


def test_grown_run_continues_the_stream_by_default(grown):
    d = grown["dir"]
    s = train(grown["grown"], [grown["text"]], d / "default", steps=4, seed=5, **KW)
    assert s["settings"]["data_start"] == 6
    assert checkpoint.load(s["final"]).lineage[-1]["data_end"] == 10
    train(grown["grown"], [grown["text"]], d / "at6", steps=4, seed=5, data_start=6, **KW)
    train(grown["grown"], [grown["text"]], d / "at0", steps=4, seed=5, data_start=0, **KW)
    assert losses(d / "default") == losses(d / "at6")  # the same batches as an explicit --data-start 6
    assert losses(d / "default")[0] != losses(d / "at0")[0]  # not the source's first batch
    # batch 0 of the grown run is the stream's batch 6, which the source never drew (it drew 0..5)
    ds = Dataset(torch.arange(5000) % 256, 32, 8)
    first = ds.train_batch(6, 5)[0]
    assert all(not torch.equal(first, ds.train_batch(k, 5)[0]) for k in range(6))


def test_cli_flag_and_resume_keep_the_position(grown):
    d = grown["dir"]
    opts = ["--steps", 4, "--batch", 8, "--seq", 32, "--eval-batches", 2, "--lr", 0.01, "--device", "cpu", "-q"]
    opts += ["--seed", 5]
    r = cli("train", grown["grown"], "--data", grown["text"], "--out", d / "cli0", "--data-start", 0, *opts)
    assert r.exit_code == 0, r.stderr
    assert losses(d / "cli0") == losses(d / "at0")
    r = cli("train", grown["grown"], "--data", grown["text"], "--out", d / "res", "--stop-at", 2, *opts)
    assert r.exit_code == 0, r.stderr
    assert torch.load(d / "res" / STATE, weights_only=True)["settings"]["data_start"] == 6
    r = cli("train", grown["grown"], "--data", grown["text"], "--out", d / "res", "--resume", *opts)
    assert r.exit_code == 0, r.stderr
    assert losses(d / "res") == losses(d / "default")
    r = cli("train", grown["grown"], "--data", grown["text"], "--out", d / "bad", "--data-start", -1, *opts)
    assert r.exit_code == 2 and "--data-start" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_plain_path_defaults(grown):
    """The defaults that make expand + train GROWN save what train --grow-at saves (bench/README
    section 9, docs.jsonl, 3 seeds): the wsd schedule (under cosine the plain path saved ~10 points
    less) and the stream continued from the source's data_end."""
    d = grown["dir"]
    s = train(grown["grown"], [grown["text"]], d / "defaults", steps=10, seed=5, warmup=2, **KW)
    assert s["settings"]["schedule"] == "wsd" and s["settings"]["data_start"] == 6
    lrs = [r["lr"] for r in read_metrics(d / "defaults" / "metrics.jsonl") if "lr" in r]
    assert lrs[2:9] == [KW["lr"]] * 7 and lrs[9] < KW["lr"]  # the peak held, then the decay (last 20%)
