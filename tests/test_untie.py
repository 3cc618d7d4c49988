"""``expand --untie``: a tied source grows into an untied model whose head is a tensor of its own,
made from the embedding (``checkpoint.untied``). The same function, so every untied map applies;
it is how a tied BLOOM grows by a non-whole factor and a tied OLMo at all (tests/test_families.py).
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from growtool.io import checkpoint
from growtool.nn.families import expected_shapes

from helpers import FIXTURES, cli, verify_json

transformers = pytest.importorskip("transformers")

TIED = FIXTURES["gpt2-tied"]


def test_the_untied_view_reads_the_head_from_the_embedding():
    ck = checkpoint.load(TIED)
    u = checkpoint.untied(ck)
    assert ck.config.tie and not u.config.tie and checkpoint.untied(u) is u
    assert list(u.entries) == list(expected_shapes(u.config))  # canonical order, head included
    assert torch.equal(u.get("lm_head.weight"), ck.get("transformer.wte.weight"))
    assert torch.equal(u.get("lm_head.weight", rows=(3, 5)), ck.get("transformer.wte.weight")[3:8])
    x = torch.randint(ck.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(u.model()(x), ck.model()(x))  # the same function


def test_a_tied_model_grows_untied_with_untie(tmp_path):
    grown = tmp_path / "g"
    r = cli("expand", TIED, "--width", 96, "--untie", "-o", grown)
    assert r.exit_code == 0, r.stderr
    assert "untied (--untie): the tied embedding is also written as lm_head.weight" in r.stderr
    g = checkpoint.load(grown)
    assert not g.config.tie and "lm_head.weight" in g.names() and g.lineage[-1]["untie"] is True
    assert json.loads((grown / "config.json").read_text())["tie_word_embeddings"] is False
    code, rep = verify_json(TIED, grown)
    assert code == 0 and rep["results"][0]["rel"] <= 1e-4, rep
    assert cli("fold", grown, "--alpha", 0, "-o", tmp_path / "f0").exit_code == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f0").eval()
    assert back.config.tie_word_embeddings is False
    assert back.lm_head.weight.data_ptr() != back.transformer.wte.weight.data_ptr()
    src = checkpoint.load(TIED).model().eval()
    x = torch.randint(g.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = src(x), back(x).logits
    assert float((got - want).abs().max() / want.std()) <= 1e-4


def test_untie_with_depth_growth(tmp_path):
    grown = tmp_path / "g.safetensors"
    r = cli("expand", TIED, "--width", 96, "--layers", 4, "--untie", "-q", "-o", grown)
    assert r.exit_code == 0, r.stderr
    g = checkpoint.load(grown)
    assert not g.config.tie and g.config.layers == 4 and g.lineage[-1]["untie"] is True
    assert verify_json(TIED, grown)[0] == 0


def test_untie_on_an_untied_model_changes_nothing(tmp_path):
    src = FIXTURES["llama-gqa"]
    assert not checkpoint.load(src).config.tie
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert cli("expand", src, "--width", 96, "-q", "-o", a).exit_code == 0
    assert cli("expand", src, "--width", 96, "-q", "--untie", "-o", b).exit_code == 0
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()


def test_untie_does_not_apply_to_a_run_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "last.pt").write_bytes(b"")
    r = cli("expand", run, "--width", 96, "--untie", "-o", tmp_path / "out")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--untie" in r.stderr and not (tmp_path / "out").exists()
