"""A grown Hugging Face model is a complete model: its tokenizer and generation files travel with
it (folders, and a record in .safetensors metadata), train uses it, sample and verify --generate
look at the text it produces."""

import hashlib
import json
import random

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from growtool import tokenizer  # noqa: E402
from growtool.io import checkpoint  # noqa: E402
from growtool.io.carried import CARRIED as CARRIED_ALL  # noqa: E402

from helpers import FIXTURES, cli, perturbed  # noqa: E402

CARRIED = ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]
PROMPTS = ["the cat sees", "some dogs", "=========="]


def corpus(n: int, seed: int = 0) -> str:
    """Short words, long repeated tokens (runs of '=', blank-line runs, long words) and varied spacing."""
    r = random.Random(seed)
    words = ["the", "cat", "dogs", "sees", "some", "=" * 24, "\n\n\n", "supercalifragilistic", "    ", "fox."]
    return "".join(r.choice(words) + r.choice([" ", "\n", "", "  "]) for _ in range(n))


def bpe(text: str, vocab: int = 400, scheme: str = "bytelevel") -> Tokenizer:
    """A BPE tokenizer trained on ``text``: byte-level (GPT-2 style) or metaspace (sentencepiece style)."""
    tok = Tokenizer(models.BPE())
    if scheme == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tok.decoder = decoders.Metaspace(prepend_scheme="first")
        alphabet = sorted(set(text.replace(" ", "\u2581")))
    tok.train_from_iterator(
        [text], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet)
    )
    return tok


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A transformers Llama folder with its own BPE tokenizer (saved with save_pretrained), a text,
    the folder grown to d96 (a folder) and folded at gate 0 (a folder)."""
    d = tmp_path_factory.mktemp("folders")
    text = corpus(3000)
    (d / "text.txt").write_text(text)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe(text), eos_token="<|endoftext|>")
    eos = fast.convert_tokens_to_ids("<|endoftext|>")
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(fast),
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    torch.manual_seed(0)
    model = perturbed(transformers.LlamaForCausalLM(cfg)).eval()
    src = d / "src"
    model.save_pretrained(src)
    fast.save_pretrained(src)
    grown, folded = d / "grown", d / "folded"
    r = cli("expand", src, "--width", 96, "-o", grown, "-q")
    assert r.exit_code == 0, r.stderr
    r = cli("fold", grown, "--alpha", 0, "-o", folded)
    assert r.exit_code == 0, r.stderr
    return {"dir": d, "text": d / "text.txt", "src": src, "grown": grown, "folded": folded, "tok": fast, "model": model}


def greedy(model, tok, prompt: str, n: int = 12) -> list[int]:
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.eos_token_id)
    return out[0, ids.shape[1] :].tolist()


# ---- folders carry the tokenizer ----------------------------------------------------------------


def test_expand_and_fold_folders_carry_tokenizer_files_and_a_card(world):
    for out in (world["grown"], world["folded"]):
        carried = [p.name for p in world["src"].iterdir() if p.name in CARRIED_ALL]
        assert set(carried) >= set(CARRIED)
        for name in carried:
            assert (out / name).read_bytes() == (world["src"] / name).read_bytes(), (out, name)
        card = (out / "README.md").read_text()
        assert "d64 -> d96" in card and "recipe srio" in card and "exact at gate 0" in card
        assert "tokenizer.json" in card
        assert str(world["src"].parent) not in card and "](" not in card  # no path of this machine, no links
    assert "Growth gates present" in (world["grown"] / "README.md").read_text()
    assert "folded at alpha 0" in (world["folded"] / "README.md").read_text()
    sha = checkpoint.load(world["folded"]).tokenizer["files"]["tokenizer.json"]
    assert sha == hashlib.sha256((world["src"] / "tokenizer.json").read_bytes()).hexdigest()


def test_the_card_lists_a_depth_growth_and_every_growth_after_it(world, tmp_path):
    deep, wider = tmp_path / "deep", tmp_path / "wider"
    assert cli("expand", world["src"], "--layers", 4, "--width", 96, "-o", deep, "-q").exit_code == 0
    assert cli("expand", deep, "--layers", 6, "-o", wider, "-q").exit_code == 0
    card = (wider / "README.md").read_text()
    rows = [line for line in card.splitlines() if line.startswith("| ") and "grown" in line]
    assert len(rows) == 2, card
    assert "d64 -> d96" in rows[0] and "2 -> 4 layers (stack)" in rows[0]
    assert "4 -> 6 layers (stack)" in rows[1] and "d96 -> d96" not in rows[1]
    assert str(tmp_path) not in card and str(world["src"].parent) not in card


def test_folded_folder_loads_in_transformers_and_generates_like_the_source(world):
    tok = transformers.AutoTokenizer.from_pretrained(world["folded"])
    assert tok("the cat sees").input_ids == world["tok"]("the cat sees").input_ids
    back = transformers.AutoModelForCausalLM.from_pretrained(world["folded"]).eval()
    assert back.config.hidden_size == 96
    for p in PROMPTS:
        a, b = greedy(world["model"], world["tok"], p), greedy(back, tok, p)
        assert len(a) == 12 and a == b, p
    pipe = transformers.pipeline("text-generation", model=str(world["folded"]))
    src_pipe = transformers.pipeline("text-generation", model=str(world["src"]))
    kw = dict(max_new_tokens=10, do_sample=False, return_full_text=False)
    assert pipe("some dogs", **kw)[0]["generated_text"] == src_pipe("some dogs", **kw)[0]["generated_text"]


def test_safetensors_output_records_its_tokenizer_for_a_later_stage(world, tmp_path):
    g = tmp_path / "g.safetensors"
    assert cli("expand", world["src"], "--width", 128, "-o", g, "-q").exit_code == 0
    assert not (tmp_path / "tokenizer.json").exists()
    rec = checkpoint.load(g).tokenizer
    assert rec["from"] == str(world["src"].resolve()) and "tokenizer.json" in rec["files"]
    # a stage read from standard input still finds it, through the record
    out = tmp_path / "later"
    r = cli("fold", "-", "--alpha", 0, "-o", out, input=g.read_bytes())
    assert r.exit_code == 0, r.stderr
    assert (out / "tokenizer.json").read_bytes() == (world["src"] / "tokenizer.json").read_bytes()
    # a recorded tokenizer that changed since is not used, and the user is told
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "tokenizer.json").write_bytes(b"{}")
    h = checkpoint.load(g)
    h_rec = {**rec, "from": str(moved)}
    t = h.tensors()
    g2 = checkpoint.save_tensors(str(tmp_path / "g2.safetensors"), h.config, h.lineage, t, tokenizer=h_rec)
    out2 = tmp_path / "later2"
    r = cli("fold", g2, "--alpha", 0, "-o", out2)
    assert r.exit_code == 0 and "has changed since" in r.stderr and not (out2 / "tokenizer.json").exists()
    # --tokenizer attaches one explicitly
    out3 = tmp_path / "later3"
    r = cli("fold", g2, "--alpha", 0, "-o", out3, "--tokenizer", world["src"])
    assert r.exit_code == 0, r.stderr
    assert (out3 / "tokenizer.json").read_bytes() == (world["src"] / "tokenizer.json").read_bytes()


def test_attaching_a_tokenizer_larger_than_the_vocabulary_is_refused(world, tmp_path):
    out = tmp_path / "x"
    r = cli("expand", FIXTURES["llama-gqa"], "--width", 96, "-o", out, "--tokenizer", world["src"] / "tokenizer.json")
    assert r.exit_code == 2 and "more than" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_a_tokenizer_smaller_than_the_vocabulary_is_refused_by_sample_and_expand(world, tmp_path):
    small = tmp_path / "small.json"
    bpe(corpus(300, seed=1), vocab=270).save(str(small))
    n, vocab = tokenizer.get_tokenizer(str(small)).vocab_size, checkpoint.load(str(world["src"])).config.vocab_size
    assert n < vocab and not tokenizer.pads_to(n, vocab)
    for args in (["sample", world["src"], "--prompt", "the cat"], ["expand", world["src"], "--width", 96]):
        r = cli(*args, "--tokenizer", small, *(["-o", tmp_path / "x"] if args[0] == "expand" else []))
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.output)
        assert f"has {n:,} ids, fewer than" in r.stderr and f"vocabulary of {vocab:,}" in r.stderr, r.stderr
        assert r.stdout == ""
    assert not (tmp_path / "x").exists()
    # its own tokenizer samples as before
    assert cli("sample", world["src"], "--prompt", "the cat", "--max-tokens", 2).exit_code == 0


def test_a_vocabulary_padded_to_a_multiple_of_64_is_the_tokenizers_own():
    assert tokenizer.pads_to(50257, 50304) and tokenizer.pads_to(300, 320) and tokenizer.pads_to(300, 384)
    assert not tokenizer.pads_to(270, 400) and not tokenizer.pads_to(300, 448)


# ---- train picks the model's tokenizer --------------------------------------------------------


def test_train_uses_the_folders_tokenizer_without_flags(world, tmp_path):
    run = tmp_path / "run"
    r = cli(
        "train",
        world["folded"],
        "--data",
        world["text"],
        "--steps",
        2,
        "--batch",
        4,
        "--seq",
        32,
        "--out",
        run,
        "-q",
        "--doc-sep",
        "none",  # the file's ids alone (the default adds <|endoftext|> after it: tests/test_corpus.py)
    )
    assert r.exit_code == 0, r.stderr
    cache = list((run / "cache").glob("tokens-*.uint16"))
    whole = world["tok"](world["text"].read_text(), add_special_tokens=False).input_ids
    assert np.fromfile(cache[0], dtype=np.uint16).tolist() == whole
    assert (run / "tokenizer.json").read_bytes() == (world["src"] / "tokenizer.json").read_bytes()
    card = (run / "README.md").read_text()
    assert "trained 2 steps" in card and "d64 -> d96" in card
    assert checkpoint.load(run / "final.safetensors").tokenizer["files"].keys() >= {"tokenizer.json"}
    # the final checkpoint samples with that tokenizer, found beside it
    r = cli("sample", run / "final.safetensors", "--prompt", "the cat", "--max-tokens", 4)
    assert r.exit_code == 0 and r.stdout.strip(), r.stderr


def test_byte_tokenizer_on_a_non_byte_model_is_refused(world, tmp_path):
    r = cli(
        "train", world["src"], "--data", world["text"], "--tokenizer", "byte", "--steps", 2, "--out", tmp_path / "r"
    )
    assert r.exit_code == 2 and "byte tokenizer (256 ids) does not match" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_a_model_without_a_tokenizer_is_refused_not_fed_bytes(world, tmp_path):
    lone = tmp_path / "lone.safetensors"  # the weights alone: no folder files, no record
    ck = checkpoint.load(world["src"])
    checkpoint.save_tensors(str(lone), ck.config, [], ck.tensors())
    r = cli("train", lone, "--data", world["text"], "--steps", 2, "--out", tmp_path / "r")
    assert r.exit_code == 2 and "no tokenizer found" in r.stderr and "--tokenizer" in r.stderr
    assert not (tmp_path / "r").exists()


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(world, tmp_path):
    r = cli(
        "train",
        FIXTURES["llama-gqa"],
        "--data",
        world["text"],
        "--tokenizer",
        world["src"],
        "--steps",
        2,
        "--out",
        tmp_path / "r",
    )
    assert r.exit_code == 2 and "more than" in r.stderr and "vocabulary of 256" in r.stderr
    assert not (tmp_path / "r").exists()


# ---- tokenisation equals whole-text encoding ------------------------------------------------


class NoWholeText:
    """A tokenizer that fails if asked to encode the whole text in one call (the fallback)."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, *a, **kw):
        raise AssertionError("fell back to one whole-text call")

    def encode_batch(self, *a, **kw):
        return self.tok.encode_batch(*a, **kw)


@pytest.mark.parametrize("scheme", ["bytelevel", "metaspace"])
def test_chunked_tokenisation_equals_whole_text_on_long_tokens(scheme):
    text = corpus(8000, seed=3)
    tok = bpe(text, scheme=scheme)
    assert max(len(t) for t in tok.get_vocab()) >= 20  # long tokens exist
    whole = tok.encode(text, add_special_tokens=False).ids
    cuts = tokenizer._cuts(text, 600)
    assert len(cuts) > 50
    naive = [i for a, b in zip(cuts, cuts[1:]) for i in tok.encode(text[a:b], add_special_tokens=False).ids]
    assert naive != whole  # the text does break piecewise encoding at these boundaries
    assert tokenizer.encode_text(NoWholeText(tok), text, chunk=600, overlap=256).tolist() == whole


def test_data_file_tokens_equal_whole_text_encoding(tmp_path):
    text = corpus(30000, seed=4)  # ~250 KB: several 64 KB pieces
    assert len(text) > 2 * tokenizer.CHUNK
    tok = bpe(corpus(3000))
    tok.save(str(tmp_path / "tokenizer.json"))
    t = tokenizer.get_tokenizer(str(tmp_path / "tokenizer.json"))
    ids = t.encode(text.encode(), "t.txt")
    assert ids.tolist() == tok.encode(text, add_special_tokens=False).ids


# ---- sample ------------------------------------------------------------------------------------


def test_sample_prints_the_greedy_continuation(world):
    r = cli("sample", world["src"], "--prompt", "the cat sees", "--max-tokens", 12)
    assert r.exit_code == 0, r.stderr
    want = world["tok"].decode(greedy(world["model"], world["tok"], "the cat sees"))
    assert r.stdout == want + "\n" and want.strip()
    assert "12 tokens (greedy)" in r.stderr
    # the grown checkpoint at its stored gate (0) says the same; --alpha picks another gate
    assert cli("sample", world["grown"], "--prompt", "the cat sees", "--max-tokens", 12).stdout == r.stdout
    r1 = cli("sample", world["grown"], "--prompt", "the cat sees", "--max-tokens", 12, "--alpha", 1)
    assert r1.exit_code == 0 and r1.stdout.strip()


def test_sample_with_temperature_repeats_per_seed(world):
    args = ["sample", world["src"], "--prompt", "some dogs", "--max-tokens", 16, "--temperature", 1.5, "--top-k", 50]
    a, b = cli(*args, "--seed", 1), cli(*args, "--seed", 1)
    assert a.exit_code == 0 and a.stdout == b.stdout
    others = {cli(*args, "--seed", s).stdout for s in (2, 3, 4)}
    assert len(others | {a.stdout}) > 1  # sampling, not argmax


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--alpha", 0.5], "no growth gates"),
        (["--max-tokens", 0], "--max-tokens must be positive"),
        (["--temperature", -1], "--temperature must be at least 0"),
        (["--tokenizer", "byte"], "byte tokenizer"),
    ],
)
def test_sample_bad_input_is_one_line(world, args, msg):
    r = cli("sample", world["src"], "--prompt", "the", *args)
    assert r.exit_code == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


# ---- verify --generate --------------------------------------------------------------------------


def test_verify_generate_passes_for_an_exact_growth(world):
    r = cli("verify", world["src"], world["grown"], "--generate", 12, "--data", world["text"], "--samples", 4, "--json")
    assert r.exit_code == 0, r.stderr
    g = json.loads(r.stdout)["generate"]
    assert g == {"prompts": 4, "tokens": 12, "identical": 4, "first_divergence": None, "pass": True}
    r = cli("verify", world["src"], world["folded"], "--generate", 8, *sum((["--prompt", p] for p in PROMPTS), []))
    assert r.exit_code == 0 and "3/3 identical" in r.stderr


def test_verify_generate_fails_for_a_lossy_growth(tmp_path):
    src = FIXTURES["gpt2-tied"]
    out = tmp_path / "nrio.safetensors"
    assert cli("expand", src, "--width", 96, "--recipe", "nrio", "-o", out, "-q").exit_code == 0
    # a loose logit tolerance lets the logit check pass: the failure is the continuations'
    r = cli("verify", src, out, "--generate", 16, "--samples", 8, "--tol", 10, "--json")
    assert r.exit_code == 1, r.stderr
    res = json.loads(r.stdout)
    assert all(row["rel"] <= 10 for row in res["results"]) and not res["pass"]
    g = res["generate"]
    assert g["identical"] < g["prompts"] == 8 and g["first_divergence"] is not None
    assert "greedy continuations differ" in r.stderr
    # the same check on an exact growth of the same model passes
    exact = tmp_path / "srio.safetensors"
    assert cli("expand", src, "--width", 96, "-o", exact, "-q").exit_code == 0
    assert cli("verify", src, exact, "--generate", 16, "--samples", 8).exit_code == 0
