"""``growtool demo``: the whole story in one command, on a corpus the project generates itself.

init (llama, gamma 1, eps 1e-12, gated attention) -> train -> expand (SRIO) -> verify -> train
with the gate warm-up -> expand again -> verify -> short train. Every stage uses the library calls
the CLI uses. The summary table shows, per stage, the width, parameters, validation loss on the
same held-out batches, and for each growth the verify figure max |dlogit| / logit scale at gate 0
on generated text and random tokens (pass: <= 1e-4). Training stages after a growth ("+gate") ramp
the growth gates 0 -> 1 over their first 10% of tokens and fold them away at the end. At the end
``story.png`` draws the whole story in one picture (story.py: loss against tokens over the three
training runs, each growth marked, the learning rate). Returns False (the CLI exits 1) if a verify fails.

The corpus: sentences from a small random grammar (determiners, adjectives, nouns with number
agreement of the verb, objects, prepositional phrases, a few fixed idioms), deterministic in the seed.
It has structure at several scales (spelling, agreement, phrase order), so a byte-level model's loss
keeps falling for a while, and growth has something to add.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from growtool.check import verify
from growtool.init import init_model
from growtool.io import checkpoint
from growtool.nn.config import ModelConfig
from growtool.nn.errors import GrowError
from growtool.surgery import expand
from growtool.tokenizer import get_tokenizer
from growtool.training import data
from growtool.training.loop import evaluate, train
from growtool.training.run_folder import read_metrics
from growtool.training.story import write_story

err = Console(stderr=True)

NOUNS = [
    ("cat", "cats"),
    ("dog", "dogs"),
    ("bird", "birds"),
    ("child", "children"),
    ("farmer", "farmers"),
    ("teacher", "teachers"),
    ("fox", "foxes"),
    ("horse", "horses"),
    ("king", "kings"),
    ("sailor", "sailors"),
]
VERBS = [
    ("sees", "see"),
    ("likes", "like"),
    ("follows", "follow"),
    ("finds", "find"),
    ("helps", "help"),
    ("watches", "watch"),
    ("carries", "carry"),
    ("paints", "paint"),
]
ADJS = ["old", "young", "red", "quiet", "happy", "small", "green", "brave", "tired", "clever"]
OBJS = [
    "the river",
    "a small boat",
    "the green hill",
    "an apple",
    "the long road",
    "a letter",
    "the old bridge",
    "some bread",
    "the market",
    "a wooden box",
]
PREPS = ["near", "behind", "under", "beside", "across"]
PLACES = ["the village", "the forest", "the castle", "the sea", "the garden"]
IDIOMS = ["and so the day ends.", "nobody knows why.", "it rains again.", "the bells ring at noon."]


def sentence(r: random.Random) -> str:
    plural = r.random() < 0.4
    det = r.choice(["the", "some", "many"] if plural else ["the", "a", "one"])
    adj = (r.choice(ADJS) + " ") if r.random() < 0.5 else ""
    noun = r.choice(NOUNS)[plural]
    verb = r.choice(VERBS)[plural]
    s = f"{det} {adj}{noun} {verb} {r.choice(OBJS)}"
    if r.random() < 0.4:
        s += f" {r.choice(PREPS)} {r.choice(PLACES)}"
    s += "."
    if r.random() < 0.1:
        s += " " + r.choice(IDIOMS)
    return s.capitalize() if r.random() < 0.5 else s


def make_corpus(n_chars: int, seed: int = 0) -> str:
    """Generated text of about ``n_chars`` characters, one paragraph per few sentences."""
    r = random.Random(seed)
    parts, size = [], 0
    while size < n_chars:
        para = " ".join(sentence(r) for _ in range(r.randint(2, 6))) + "\n"
        parts.append(para)
        size += len(para)
    return "".join(parts)


FULL = {
    "chars": 400_000,
    "width": 64,
    "layers": 2,
    "heads": 4,
    "widths": (96, 128),
    "seq": 64,
    "batch": 16,
    "steps": (400, 250, 150),
    "lr": 3e-3,
}
QUICK = {
    "chars": 60_000,
    "width": 32,
    "layers": 1,
    "heads": 4,
    "widths": (48, 64),
    "seq": 32,
    "batch": 8,
    "steps": (60, 40, 20),
    "lr": 3e-3,
}
TOL = 1e-4


def summary_table(rows: list[dict], quick: bool, seconds: float, n_bytes: int) -> Table:
    """The demo's summary: one row per stage."""
    t = Table(
        title=f"growtool demo ({'quick, ' if quick else ''}{seconds:.0f} s, generated corpus of {n_bytes:,} bytes)",
        title_justify="left",
    )
    for col in ("stage", "width", "params", "val loss", "verify |dlogit|/scale", "pass"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for r in rows:
        t.add_row(
            r["stage"],
            str(r["width"]),
            f"{r['params']:,}",
            f"{r['val_loss']:.4f}",
            "" if r["verify_rel"] is None else f"{r['verify_rel']:.2e}",
            r["pass"],
        )
    return t


def demo_config(P: dict) -> ModelConfig:
    """The starting model: a gated-attention Llama of the run's width, layers and heads."""
    return ModelConfig(
        family="llama",
        vocab_size=256,
        width=P["width"],
        layers=P["layers"],
        heads=P["heads"],
        kv_heads=P["heads"],
        head_dim=P["width"] // P["heads"],
        ffn=4 * P["width"],
        context=P["seq"],
        norm_eps=1e-12,
        tie=False,
        attn_gate=True,
    )


def _stage_row(stage: str, path, val, v=None, verdict: str = "") -> dict:
    """The summary row of the checkpoint at ``path`` (width, parameters, loss on the batches ``val``,
    the verify result), printed as one line."""
    cfg = checkpoint.load(path).config
    row = {
        "stage": stage,
        "width": cfg.width,
        "params": cfg.n_params(),
        "val_loss": evaluate(checkpoint.load(path).model(), val, torch.device("cpu")),
        "verify_rel": v,
        "pass": verdict,
        "path": str(path),
    }
    err.print(
        f"[bold]{stage}[/]: {cfg.n_params():,} params, val loss {row['val_loss']:.4f}"
        + (f", verify {v:.2e} {verdict}" if v is not None else "")
    )
    return row


def _train_stage(path, corpus: Path, out: Path, i: int, P: dict, progress: bool) -> str:
    """Train the checkpoint at ``path`` for stage ``i``'s steps on ``corpus``; the final checkpoint's path."""
    steps = P["steps"][i]
    r = train(
        path,
        [corpus],
        out / f"stage{2 * i + 1}-train",
        steps=steps,
        batch=P["batch"],
        seq=P["seq"],
        lr=P["lr"],
        eval_every=max(1, steps // 10),
        eval_batches=8,
        device="cpu",
        progress=progress,
        cache_dir=out / "cache",
    )
    return r["final"]


def story_title(rows: list[dict]) -> str:
    """story.png's title: the demo's widths in order, in words."""
    widths = " → ".join(dict.fromkeys(f"d{r['width']}" for r in rows))
    return f"growtool demo: a Llama trained, grown {widths} (SRIO, verified) and trained again after each growth"


def run_demo(out: str | Path, quick: bool = False, progress: bool = True) -> bool:
    """Run every stage in folder ``out``; print the summary table (stderr); True if every verify passed."""
    t0 = time.time()
    P = QUICK if quick else FULL
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GrowError(f"{out}: exists and is not empty (choose another --out)")
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus.txt"
    corpus.write_text(make_corpus(P["chars"]))
    ds = data.Dataset(data.load_tokens([corpus], get_tokenizer("byte"), None), P["seq"], P["batch"])
    val = ds.val_batches(8)
    rows, ok = [], True
    cfg = demo_config(P)
    path = checkpoint.save_tensors(
        str(out / "stage0-init.safetensors"),
        cfg,
        [{"op": "init", "gamma": 0.5, "embed_gamma": 0.5, "seed": 0, "width": cfg.width}],
        init_model(cfg, gamma=0.5, seed=0).tensors(),
    )
    rows.append(_stage_row("init", path, val))
    for i, steps in enumerate(P["steps"]):
        path = _train_stage(path, corpus, out, i, P, progress)
        rows.append(_stage_row(f"train {steps}" + (" +gate" if i else ""), path, val))
        if i == len(P["widths"]):
            break
        D = P["widths"][i]
        grown = expand(path, width=D, out=str(out / f"stage{2 * i + 2}-d{D}.safetensors"), recipe="srio", seed=0)
        report = verify(path, grown, samples=16, data=str(corpus), tol=TOL, seed=i)  # random and text inputs
        rel = max(c.rel for label, c in report.rows if "(info)" not in label)
        ok &= report.passed
        rows.append(_stage_row(f"expand d{D} srio", grown, val, rel, "PASS" if report.passed else "FAIL"))
        path = grown

    err.print(summary_table(rows, quick, time.time() - t0, len(ds.tokens)))
    runs = [read_metrics(out / f"stage{2 * i + 1}-train" / "metrics.jsonl") for i in range(len(P["steps"]))]
    story = write_story(runs, out / "story.png", story_title(rows))
    summary = {"ok": ok, "seconds": time.time() - t0, "quick": quick, "tolerance": TOL, "stages": rows}
    summary["story"] = str(story)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    err.print(f"the whole story in one picture (loss, growths, learning rate): {story}")
    err.print(("[green]every growth kept the function[/]" if ok else "[red]a verify failed[/]") + f"; files in {out}")
    return ok


__all__ = ["run_demo", "make_corpus"]
