"""Training throughput: growtool's trainer against Hugging Face transformers, and the cost of open
warm-up gates.

1. Against transformers, per family (Llama, GPT-2), one configuration, float32 on CPU, a fixed
   thread count, the same batches (``growtool.training.data.Dataset``), AdamW with the trainer's parameter
   groups, gradient clipping at 1:
   * ``growtool.train``   - the real trainer (``growtool.training.loop.train``); step seconds from its own
                            per-step ``tok_s`` in metrics.jsonl (evaluation and saving fall outside it);
   * ``growtool loop``    - growtool's ``LM`` in the plain loop below;
   * ``transformers loop`` - ``LlamaForCausalLM`` / ``GPT2LMHeadModel`` (sdpa attention) loaded from the
                            same weights (logits checked equal), in the same plain loop.
   A step is: fetch the batch, forward, cross-entropy, backward, clip, AdamW step, zero grads.
   Target: growtool >= 1.0x transformers in tokens/s.
2. Warm-up gates: a model grown 1.5x with the srio recipe, gates at 0.5 (frozen, as the trainer
   holds them), against the same model folded at 0.5 (a plain model; logits checked equal), both
   in the plain loop. Target: overhead <= 10%.

Warm-up steps are excluded and median step times are reported. A busy machine slows everything, so
the comparisons are made between measurements adjacent in time: the two plain loops alternate step
by step (ratio = median of the per-step ratios); each trainer run sits between two blocks of the
transformers loop running alone, as the trainer does (ratio = transformers' median step in the
blocks just before and after / the trainer's median step; the median of these over the repeats).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from common import machine, parse_args, table, write_csv, write_json

from growtool.grow import recipes
from growtool.grow.engine import grow_tensor
from growtool.grow.fold import fold_config, fold_tensor
from growtool.grow.plan import build_plan
from growtool.init import init_model
from growtool.io import checkpoint
from growtool.nn.config import ModelConfig
from growtool.nn.families import expected_shapes
from growtool.nn.model import LM
from growtool.tokenizer import get_tokenizer
from growtool.training import data

SIZES = {  # width, layers, heads, batch, seq, warm-up steps, timed steps, repeats
    "quick": dict(width=64, layers=2, heads=4, batch=4, seq=64, warmup=1, steps=3, repeats=1),
    "full": dict(width=256, layers=4, heads=4, batch=8, seq=128, warmup=2, steps=10, repeats=3),
}
LR, CLIP, WD = 1e-3, 1.0, 0.1


def make_config(family: str, width: int, layers: int, heads: int, seq: int) -> ModelConfig:
    """A plain model of the family as transformers knows it: no gated attention; GPT-2 tied, Llama
    untied with grouped-query attention (2 query heads per KV head)."""
    llama = family == "llama"
    return ModelConfig(
        family,
        vocab_size=256,
        width=width,
        layers=layers,
        heads=heads,
        kv_heads=heads // 2 if llama else heads,
        head_dim=width // heads,
        ffn=(8 * width // 3 + 7) // 8 * 8 if llama else 4 * width,
        context=seq,
        norm_eps=1e-5,
        tie=not llama,
        attn_gate=False,
    )


def synthetic_text(path: Path, n_bytes: int, seed: int = 0) -> None:
    """Random words from a small made-up vocabulary (throughput does not depend on the text)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    words = ["".join(rng.choice(letters, rng.integers(1, 9))) for _ in range(2000)]
    out, size = [], 0
    while size < n_bytes:
        line = " ".join(rng.choice(words, 12)) + ".\n"
        out.append(line)
        size += len(line)
    path.write_text("".join(out))


def optimizer(model: torch.nn.Module) -> torch.optim.AdamW:
    """The trainer's AdamW: weight decay on matrices only, betas (0.9, 0.95)."""
    ps = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for p in ps if p.dim() >= 2], "weight_decay": WD},
            {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=LR,
        betas=(0.9, 0.95),
    )


def paired_step_times(models: dict, ds: data.Dataset, warmup: int, steps: int) -> dict[str, list[float]]:
    """Seconds per training step of a plain loop for each of ``models`` (name -> (model, loss_fn)),
    interleaved step by step (the order rotates) so that a busy machine slows them alike.
    Warm-up steps are dropped."""
    opts = {}
    for name, (model, _) in models.items():
        model.train()
        opts[name] = (optimizer(model), [p for p in model.parameters() if p.requires_grad])
    times = {name: [] for name in models}
    names = list(models)
    for step in range(warmup + steps):
        for name in names[step % len(names) :] + names[: step % len(names)]:
            (model, loss_fn), (opt, params) = models[name], opts[name]
            t0 = time.perf_counter()
            x, y = ds.train_batch(step, 0)
            loss = loss_fn(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            float(loss.detach())
            if step >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def spread(xs: list[float]) -> str:
    """The spread of ratios: quartiles (min and max when there are fewer than 8)."""
    if len(xs) < 8:
        lo, hi = min(xs), max(xs)
    else:
        q = statistics.quantiles(xs, n=4)
        lo, hi = q[0], q[2]
    return f"{lo:.2f} to {hi:.2f}"


def ours_loss(model: LM):
    return lambda x, y: model(x, y)[1]


def hf_loss(model):
    def f(x, y):
        logits = model(input_ids=x).logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))

    return f


def trainer_step_times(ckpt: Path, text: Path, work: Path, run: int, sz: dict) -> list[float]:
    """Step seconds of ``growtool.train`` from its metrics.jsonl (``batch * seq / tok_s``)."""
    from growtool.training.loop import train

    out = work / f"train-{ckpt.stem}-{run}"
    n = sz["warmup"] + sz["steps"]
    train(
        str(ckpt),
        [str(text)],
        str(out),
        steps=n,
        batch=sz["batch"],
        seq=sz["seq"],
        lr=LR,
        clip=CLIP,
        weight_decay=WD,
        eval_every=10 * n,
        eval_batches=1,
        save_every=10 * n,
        metrics_every=10 * n,
        progress=False,
        cache_dir=str(work / "cache"),
    )
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    tok = sz["batch"] * sz["seq"]
    return [tok / r["tok_s"] for r in recs if r["step"] > sz["warmup"] and "tok_s" in r]


def max_logit_diff(a, b, x) -> float:
    with torch.no_grad():
        return float((a(x) - b(x)).abs().max())


def vs_transformers(family: str, sz: dict, ds: data.Dataset, text: Path, work: Path) -> tuple[list[dict], dict]:
    import transformers

    cfg = make_config(family, sz["width"], sz["layers"], sz["heads"], sz["seq"])
    tensors = init_model(cfg, gamma=0.5, seed=0).tensors()
    ckpt = work / f"{family}.safetensors"
    checkpoint.save_tensors(str(ckpt), cfg, [{"op": "bench"}], tensors, force=True)
    folder = work / f"{family}-hf"
    checkpoint.save_tensors(str(folder), cfg, [{"op": "bench"}], tensors, force=True)

    def ours():
        return LM.from_tensors(cfg, tensors)

    def hf():
        return transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="sdpa"
        )

    x = ds.train_batch(0, 0)[0]
    diff = max_logit_diff(ours(), lambda i: hf()(input_ids=i).logits, x)
    times = {"growtool.training.train": [], "growtool loop": [], "transformers loop": []}
    ratios = {k: [] for k in times}  # transformers step / this step, for measurements adjacent in time
    for _ in range(sz["repeats"]):  # the two plain loops, alternating step by step
        m, h = ours(), hf()
        lp = paired_step_times(
            {"growtool loop": (m, ours_loss(m)), "transformers loop": (h, hf_loss(h))}, ds, sz["warmup"], sz["steps"]
        )
        for k, v in lp.items():
            times[k] += v
        ratios["growtool loop"] += [b / a for a, b in zip(lp["growtool loop"], lp["transformers loop"])]
        ratios["transformers loop"] += [1.0] * len(lp["transformers loop"])

    def hf_alone():  # the trainer runs one model alone, so its reference does too
        h = hf()
        return paired_step_times({"transformers": (h, hf_loss(h))}, ds, sz["warmup"], sz["steps"])["transformers"]

    # transformers alone, trainer, transformers alone, trainer, ...: each trainer run is set against
    # the transformers steps timed just before and just after it
    alone = [hf_alone()]
    for r in range(sz["repeats"]):
        tr = trainer_step_times(ckpt, text, work, r, sz)
        alone.append(hf_alone())
        times["growtool.training.train"] += tr
        ratios["growtool.training.train"].append(statistics.median(alone[-2] + alone[-1]) / statistics.median(tr))
    tok = sz["batch"] * sz["seq"]
    rows = []
    for impl, ts in times.items():
        s = statistics.median(ts)
        rows.append(
            {
                "family": family,
                "impl": impl,
                "params": cfg.n_params(),
                "step_ms": 1000 * s,
                "tok_s": tok / s,
                "vs_transformers": statistics.median(ratios[impl]),
                "spread": spread(ratios[impl]),
                "steps_timed": len(ts),
            }
        )
    return rows, {
        "family": family,
        "config": cfg.to_hf(),
        "max_logit_diff_vs_hf": diff,
        "step_s": times,
        "transformers_alone_step_s": alone,
        "ratios": ratios,
    }


def gate_cost(family: str, sz: dict, ds: data.Dataset) -> tuple[dict, dict]:
    cfg = make_config(family, sz["width"], sz["layers"], sz["heads"], sz["seq"])
    src = init_model(cfg, gamma=0.5, seed=0).tensors()
    plan = build_plan(cfg, recipes.load("srio"), cfg.width * 3 // 2)
    grown = {n: grow_tensor(n, plan, src.__getitem__) for n, _, _ in plan.outputs()}
    plain = fold_config(plan.cfg)
    folded = {n: fold_tensor(n, plan.cfg, 0.5, grown.__getitem__, torch.float32) for n in expected_shapes(plain)}

    def gated_model():
        m = LM.from_tensors(plan.cfg, grown)
        m.set_gates(0.5)
        for n, p in m.named_parameters():
            if n.endswith("growth_gate"):
                p.requires_grad_(False)  # the trainer sets the gates, it does not train them
        return m

    def folded_model():
        return LM.from_tensors(plain, folded)

    diff = max_logit_diff(gated_model(), folded_model(), ds.train_batch(0, 0)[0])
    times = {"gated": [], "folded": []}
    for _ in range(sz["repeats"]):
        g, f = gated_model(), folded_model()
        lp = paired_step_times({"gated": (g, ours_loss(g)), "folded": (f, ours_loss(f))}, ds, sz["warmup"], sz["steps"])
        for k, v in lp.items():
            times[k] += v
    g, f = statistics.median(times["gated"]), statistics.median(times["folded"])
    per_step = [a / b - 1 for a, b in zip(times["gated"], times["folded"])]
    paired = statistics.median(per_step)
    tok = sz["batch"] * sz["seq"]
    row = {
        "family": family,
        "width": f"{cfg.width}->{plan.cfg.width}",
        "params": plain.n_params(),
        "gated_tok_s": tok / g,
        "folded_tok_s": tok / f,
        "overhead": paired,
        "spread": spread(per_step),
        "overhead_ok": paired <= 0.10,
        "steps_timed": len(times["folded"]),
    }
    return row, {
        "family": family,
        "max_logit_diff_gated_vs_folded": diff,
        "step_s": times,
        "overhead_of_medians": g / f - 1,
    }


def plot(rows: list[dict], gates: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    fams = list(dict.fromkeys(r["family"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    for j, impl in enumerate(impls):
        vals = [next(r["tok_s"] for r in rows if r["family"] == f and r["impl"] == impl) for f in fams]
        a.bar([i + 0.27 * (j - 1) for i in range(len(fams))], vals, width=0.27, label=impl)
    a.set_xticks(range(len(fams)), fams)
    a.set_ylabel("tokens / s (median step)")
    a.set_ylim(0, 1.3 * max(r["tok_s"] for r in rows))  # room for the legend
    a.set_title("training throughput, float32 CPU")
    a.legend(fontsize=7)
    for j, (key, label) in enumerate((("gated_tok_s", "gated, gates 0.5"), ("folded_tok_s", "folded at 0.5"))):
        b.bar([i + 0.35 * (j - 0.5) for i in range(len(gates))], [g[key] for g in gates], width=0.35, label=label)
    b.set_xticks(range(len(gates)), [f"{g['family']} {g['width']}" for g in gates])
    b.set_title("cost of open warm-up gates")
    b.set_ylim(0, 1.3 * max(max(g["gated_tok_s"], g["folded_tok_s"]) for g in gates))
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    args = parse_args(
        "throughput",
        __doc__,
        lambda p: p.add_argument("--threads", type=int, default=None, help="torch threads (default 2; 1 with --quick)"),
    )
    # --quick is a smoke run: one thread keeps it quick and steady on a shared CI machine
    torch.set_num_threads(args.threads or (1 if args.quick else min(2, os.cpu_count() or 1)))
    sz = SIZES["quick" if args.quick else "full"]
    work = Path(args.out) / "tmp" / "throughput"
    work.mkdir(parents=True, exist_ok=True)
    text = work / "text.txt"
    synthetic_text(text, 200_000)
    tok = get_tokenizer("byte")
    ds = data.Dataset(
        data.load_tokens([text], tok, work / "cache", 256, data.min_tokens(sz["seq"], sz["batch"])),
        sz["seq"],
        sz["batch"],
    )
    rows, gates, detail = [], [], []
    try:
        for family in ("llama", "gpt2"):
            r, d = vs_transformers(family, sz, ds, text, work)
            rows += r
            detail.append(d)
            print(table(r, f"{family}: step = batch {sz['batch']} x seq {sz['seq']}"), file=sys.stderr, flush=True)
            g, d = gate_cost(family, sz, ds)
            gates.append(g)
            detail.append(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = args.dir
    write_csv(out / "throughput.csv", rows)
    write_csv(out / "gates.csv", gates)
    write_json(
        out / "throughput.json",
        {
            "sizes": sz,
            "threads": torch.get_num_threads(),
            "quick": args.quick,
            "machine": machine(),
            "rows": rows,
            "gates": gates,
            "detail": detail,
        },
    )
    plot(rows, gates, out / "throughput.png")
    print(
        table(
            rows,
            f"tokens/s, float32 CPU, {torch.get_num_threads()} threads, batch {sz['batch']} x seq "
            f"{sz['seq']}, width {sz['width']}, {sz['layers']} layers (median step)",
        )
    )
    print()
    print(table(gates, "open warm-up gates (0.5) vs the same model folded"))
    print(f"\nwrote {out}/throughput.csv, gates.csv, throughput.json, throughput.png")


if __name__ == "__main__":
    main()
