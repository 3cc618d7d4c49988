"""The library checks its arguments (issue 41, cause 16): every public function raises ``GrowError``
naming the argument for a wrong type or value, before it reads or writes anything; the command line
goes through the same checks (``growtool.nn.args``), so the two agree on what is valid."""

from __future__ import annotations

import os

import pytest

import growtool
from growtool.nn import args
from growtool.nn.errors import GrowError

from helpers import listing, make_config, write_ckpt

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A small gated source, its width-48 growth and a text file, in a folder of their own."""
    d = tmp_path_factory.mktemp("args")
    src = write_ckpt(d / "src.safetensors", make_config(attn_gate=True))
    growtool.expand(src, width=48, out=d / "grown.safetensors")
    (d / "data.txt").write_text("the cat sees the dog. " * 50)
    return d


def _fold(**kw):
    return lambda d: growtool.fold(d / "grown.safetensors", **{"alpha": 0.0, "out": d / "f.safetensors", **kw})


def _expand(**kw):
    return lambda d: growtool.expand(d / "src.safetensors", **{"width": 48, "out": d / "e.safetensors", **kw})


def _verify(*pos, **kw):
    return lambda d: growtool.verify(*(pos or (d / "src.safetensors", d / "grown.safetensors")), **kw)


def _train(**kw):
    base = {"data_files": ["data.txt"], "out": "run", "steps": 2, "device": "cpu", "progress": False}

    def call(d):
        a = {**base, **kw}
        files = a.pop("data_files")
        files = [str(d / f) for f in files] if isinstance(files, list) else files
        return growtool.train(str(d / "src.safetensors"), files, str(d / a.pop("out")), **a)

    return call


CASES = {
    "fold alpha nan": (_fold(alpha=NAN), "alpha"),
    "fold alpha 5": (_fold(alpha=5), "alpha"),
    "fold alpha str": (_fold(alpha="0"), "alpha"),
    "fold out None": (_fold(out=None), "out"),
    "fold shard_size 0": (_fold(shard_size=0), "shard_size"),
    "fold force str": (_fold(force="yes"), "force"),
    "expand out 123": (_expand(out=123), "out"),
    "expand shard_size -1": (_expand(shard_size=-1), "shard_size"),
    "expand width str": (_expand(width="96"), "width"),
    "expand width float": (_expand(width=96.0), "width"),
    "expand width bool": (_expand(width=True), "width"),
    "expand layers 0": (_expand(layers=0), "layers"),
    "expand seed 2**64": (_expand(seed=2**64), "seed"),
    "expand depth_method": (_expand(layers=4, depth_method="sideways"), "depth_method"),
    "expand dtype": (_expand(dtype="float64"), "dtype"),
    "expand src None": (lambda d: growtool.expand(None, width=48, out=d / "e.safetensors"), "src"),
    "verify alpha 2": (_verify(alpha=2), "alpha"),
    "verify alpha inf": (_verify(alpha=INF), "alpha"),
    "verify grown None": (lambda d: growtool.verify(d / "src.safetensors", None), "grown"),
    "verify samples 0": (_verify(samples=0), "samples"),
    "verify tol nan": (_verify(tol=NAN), "tol"),
    "verify generate 0": (_verify(generate=0), "generate"),
    "verify prompts str": (_verify(generate=2, prompts="hi"), "prompts"),
    "train schedule None": (_train(schedule=None), "schedule"),
    "train lr str": (_train(lr="0.1"), "lr"),
    "train lr inf": (_train(lr=INF), "lr"),
    "train weight_decay inf": (_train(weight_decay=INF), "weight"),
    "train seed 10**26": (_train(seed=10**26), "seed"),
    "train steps float": (_train(steps=2.5), "steps"),
    "train data_files 123": (_train(data_files=123), "data_files"),
    "train data_files empty": (_train(data_files=[]), "data_files"),
    "train grow_at str": (_train(grow_at="0.5:64"), "grow"),
    "train unknown setting": (_train(learning_rate=0.1), "learning_rate"),
    "inspect ckpt None": (lambda d: growtool.inspect(None), "ckpt"),
    "inspect metrics str": (lambda d: growtool.inspect(d / "src.safetensors", metrics="no"), "metrics"),
    "load None": (lambda d: growtool.load(None), "src"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_library_arguments_raise_grow_error_naming_the_argument(made, case):
    call, name = CASES[case]
    before = listing(made)
    with pytest.raises(GrowError) as e:
        call(made)
    assert name in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert listing(made) == before  # nothing written, nothing left behind
    assert not os.path.exists("None")


def test_valid_arguments_still_pass(made):
    """The checks refuse only what is wrong: ints for floats, Paths for strs, tuples for lists."""
    assert growtool.fold(made / "grown.safetensors", alpha=1, out=made / "ok.safetensors", force=True).exists()
    assert growtool.verify(str(made / "src.safetensors"), made / "grown.safetensors", alpha=0, samples=1).passed
    assert args.seed("seed", args.SEED_MAX) == args.SEED_MAX
    assert args.real("lr", 1, 0, low_open=True) == 1
    assert args.paths("data", ("a", made)) == ["a", str(made)]
    (made / "ok.safetensors").unlink()
