"""The trainer's settings are defined once (growtool.training.settings.Settings): every field is a
`growtool train` option with the same default, range-checked with one line, saved with the run, and
compared on resume unless it says why not. Adding a setting is one field plus an entry in ALT below."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from growtool.cli import main
from growtool.grow import recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.plan import build_plan
from growtool.init import init_model
from growtool.io import checkpoint
from growtool.nn.errors import GrowError
from growtool.training.loop import train
from growtool.training.run_folder import STATE
from growtool.training.settings import IDENTITY, Settings, option, resume_keys

from helpers import cli, listing, make_config

FIELDS = {f.name: f for f in fields(Settings)}
IO_OPTIONS = {"ckpt", "data_files", "val_data", "out", "resume", "quiet"}  # where, not how: not settings
RUN = dict(steps=6, stop_at=2, batch=4, seq=16, eval_batches=2, device="cpu", progress=False)
# for every setting compared on resume: a valid value that differs from RUN's resolved one
ALT = dict(
    batch=8,
    seq=8,
    lr=1e-2,
    min_lr_ratio=0.2,
    warmup=3,
    weight_decay=0.0,
    clip=0.5,
    gate_warmup_tokens=7,
    eval_batches=3,
    seed=1,
    data_start=3,
    tokenizer="{tokenizer}",
    grow_at=("0.5:64",),
    grow_recipe="nrio",
    grow_optimizer="reset",
    grow_lr="mup",
    grow_schedule="continue",
    grow_warmup=0,
    new_lr_mult=3.0,
    new_rewarm_steps=3,
    grow_dropout=0.1,
    schedule="cosine",
    decay_fraction=0.3,
    decay_shape="linear",
    text_key="body",
    doc_sep="none",
    data_dtype="uint32",
)


def test_every_setting_is_a_train_option_with_its_default():
    params = {p.name: p for p in main.commands["train"].params}
    assert set(params) - IO_OPTIONS == set(FIELDS)
    for name, f in FIELDS.items():
        p = params[name]
        assert p.opts == [option(name)] and p.default == f.default and p.help == f.metadata["help"]
        assert p.is_flag == f.metadata["flag"]


def test_every_setting_is_compared_on_resume_or_says_why_not():
    for name, f in FIELDS.items():
        why = f.metadata["resume"]
        assert why is True or (isinstance(why, str) and len(why) > 10), name
    assert resume_keys() == [n for n, f in FIELDS.items() if f.metadata["resume"] is True] + list(IDENTITY)
    assert set(ALT) == {n for n, f in FIELDS.items() if f.metadata["resume"] is True}


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A grown (gated) model, a short run stopped at step 2, and a tokenizer.json that fits the model."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    d = tmp_path_factory.mktemp("settings")
    text = d / "t.txt"
    text.write_text(
        " ".join(
            f"the {w} sees a {v} number {i % 7}."
            for i, (w, v) in enumerate(zip(["cat", "dog", "fox"] * 200, ["hat", "sea", "tree", "boat"] * 150))
        )
    )
    cfg = make_config(width=32, layers=1, vocab=256, context=16, attn_gate=True)
    ck = checkpoint.load(checkpoint.save_tensors(str(d / "a.safetensors"), cfg, [], init_model(cfg).tensors()))
    plan = build_plan(cfg, recipes.load("srio"), 48)
    grown = checkpoint.save_tensors(
        str(d / "g.safetensors"), plan.cfg, [], {n: grow_tensor(n, plan, ck.get) for n, _, _ in plan.outputs()}
    )
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(text)], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    (d / "tok").mkdir()  # not beside g.safetensors, where train would take it as the model's own
    tok.save(str(d / "tok" / "tokenizer.json"))
    r = train(grown, [text], d / "run", **RUN)
    assert r["steps"] == 2 and (d / "run" / STATE).exists()
    return {"dir": d, "text": text, "grown": grown, "tokenizer": str(d / "tok" / "tokenizer.json"), "summary": r}


def test_saved_settings_are_the_saved_fields_resolved(stopped_run):
    s = stopped_run["summary"]["settings"]
    saved = [n for n, f in FIELDS.items() if f.metadata["saved"]]
    assert list(s) == saved + list(IDENTITY)
    assert s["steps"] == 6 and s["warmup"] == 1 and s["gate_warmup_tokens"] == round(0.1 * 6 * 4 * 16)
    assert all(s[k] != ALT[k] for k in ALT if k != "tokenizer")  # so each ALT value is a real change
    saved_state = torch.load(stopped_run["dir"] / "run" / STATE, weights_only=True)["settings"]
    assert saved_state == s


@pytest.mark.parametrize("name", sorted(ALT))
def test_resume_refuses_a_changed_setting(stopped_run, name):
    before = listing(stopped_run["dir"] / "run")
    value = stopped_run["tokenizer"] if name == "tokenizer" else ALT[name]
    said = {
        "tokenizer": "--tokenizer: a tokenizer.json .*, but the run was started with the byte tokenizer",
        "grow_at": r"--grow-at: the run was started with no growth \(given: step 3 to 64\)",
    }
    with pytest.raises(GrowError, match=said.get(name, f"--resume: {option(name)} .* differs from the run's ")):
        train(
            stopped_run["grown"], [stopped_run["text"]], stopped_run["dir"] / "run", resume=True, **{**RUN, name: value}
        )
    after = listing(stopped_run["dir"] / "run")
    assert {k: v for k, v in after.items() if not k.startswith("cache")} == {
        k: v for k, v in before.items() if not k.startswith("cache")
    }


def test_resume_refuses_other_data(stopped_run, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text(stopped_run["text"].read_text().replace("cat", "owl"))
    with pytest.raises(GrowError, match=r"^--data: not the data the run was started with \(.*t\.txt;"):
        train(stopped_run["grown"], [other], stopped_run["dir"] / "run", resume=True, **RUN)


@pytest.mark.parametrize("name", [n for n, f in FIELDS.items() if f.metadata["low"] is not None])
def test_every_bounded_setting_is_range_checked_in_one_line(tmp_path, name):
    m = FIELDS[name].metadata
    bad = m["high"] + 1 if m["high"] is not None else m["low"] if m["low_open"] else m["low"] - 1
    with pytest.raises(GrowError, match=option(name)):
        Settings(**{name: bad}).check()
    r = cli(
        "train",
        tmp_path / "missing.safetensors",
        "--data",
        tmp_path / "missing.txt",
        option(name),
        bad,
        "--out",
        tmp_path / "run",
    )
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and option(name) in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()
