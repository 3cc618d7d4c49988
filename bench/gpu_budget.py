"""Issue 40's budget study on one GPU: scratch against the best grown schedule at 10 tokens per parameter.

One prepared script for a lent GPU machine (about 6 minutes of one H200 at the defaults; ``--deadline``):

1. text: the first ``--data-mb`` MB of a .jsonl's "text" fields (default ../shared/data/docs.jsonl);
2. a byte-level BPE tokenizer of ``--vocab`` ids trained on it (the tokenizers library), cached;
3. at each peak LR of ``--lrs`` (both arms swept; the first LR's runs first, the rest as time allows):
   scratch, a Llama of ``--width`` x ``--layers`` from init, ``--budget`` x its parameters tokens,
   and again at half that budget (two whole wsd runs: scratch's loss-compute frontier between them);
   grown, the best schedule of the CPU study (bench/results/budget_d64/WRITEUP.md): the same Llama
   at ``--base-layers`` (and ``--base-width``) stacked to ``--layers`` (and widened to ``--width``)
   inside one ``train`` run (``--grow-at``) at ``--grow-time`` of the stable phase, every other
   option at the trainer's default, at the FLOPs of the full scratch run (the base phase counted).

Reports compute saved = 1 - grown FLOPs / the FLOPs at which scratch ends at the grown run's final
loss (log FLOPs interpolated between scratch's two budgets; a bound outside them), per LR and
``tuned`` (each arm and budget at its best LR), with the final losses and the epochs the budget
takes of the text. ``--deadline S`` skips a run that would end after S seconds (estimated from the
runs so far). Each run's result is cached in ``<out>/gpu_budget/cached/``: a rerun after a time-out
runs only what is missing; results.json is rewritten after every run. ``--quick`` (``--device cpu``):
tiny sizes, the test's smoke run.

    python bench/gpu_budget.py --device cuda                       # on the GPU machine (--deadline 450)
    python bench/gpu_budget.py --device cpu --quick --data DOCS    # a dry run (tests/test_bench_gpu_budget.py)
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from budget import DATA, scratch_compute_for, text_file
from common import machine, parse_args, table, tokenizer, write_json
from growth_pays import _curve

FULL = dict(
    width=128, base_width=128, layers=8, base_layers=4, head_dim=32, vocab=4096, batch=128, seq=256, budget=10.0,
    lrs="3e-3,1.5e-3,6e-3", grow_time=0.15, data_mb=32, evals=10, deadline=450.0, device="cuda",
)  # fmt: skip
MAX_EPOCHS = 4  # more passes over the text warn: at 11, scratch ended lower at half its budget (results/gpu_budget)
QUICK = dict(FULL, width=32, base_width=32, layers=2, base_layers=1, head_dim=8, vocab=300, batch=2, seq=16,
             budget=0.1, lrs="3e-3,6e-3", data_mb=1, evals=3, deadline=0.0, device="cpu")  # fmt: skip


def options(p):
    p.add_argument("--data", default=DATA, help=f"a .jsonl (its text fields) or a text file (default {DATA})")
    for k, v in FULL.items():
        p.add_argument("--" + k.replace("_", "-"), type=type(v), default=None, help=f"default {v} (quick {QUICK[k]})")


def model(P, width: int, layers: int):
    from growtool.nn.config import ModelConfig

    heads = width // P["head_dim"]
    return ModelConfig(
        family="llama", vocab_size=P["vocab"], width=width, layers=layers, heads=heads, kv_heads=heads,
        head_dim=P["head_dim"], ffn=4 * width, context=P["seq"], norm_eps=1e-6, tie=False,
    )  # fmt: skip


def run(P, name: str, shape: tuple[int, int], tokens: int, work: Path, **kw) -> dict:
    """One ``train`` run from a fresh init of ``shape`` (width, layers): its final loss, FLOPs and curve."""
    from growtool.init import init_model
    from growtool.io import checkpoint
    from growtool.training.loop import train
    from growtool.training.run_folder import read_metrics

    cfg = model(P, *shape)
    lineage = [{"op": "init", "gamma": 0.5, "seed": 1}]
    init = checkpoint.save_tensors(
        str(work / f"{name}-init.safetensors"), cfg, lineage, init_model(cfg, seed=1).tensors()
    )
    steps = max(1, -(-tokens // (P["batch"] * P["seq"])))
    t0 = time.time()
    s = train(init, [P["text"]], str(work / name), steps=steps, batch=P["batch"], seq=P["seq"], lr=kw.pop("lr"),
              schedule="wsd", eval_every=max(1, steps // P["evals"]), save_every=steps, device=P["device"],
              tokenizer=P["tokenizer"], progress=False, cache_dir=str(work / "cache"), **kw)  # fmt: skip
    curve = _curve(read_metrics(work / name / "metrics.jsonl"))
    return {"val": s["val_loss"], "flops": curve[-1][0], "steps": steps, "seconds": time.time() - t0, "curve": curve}


def cached_path(d: Path, spec: dict) -> Path:
    return d / "cached" / (hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16] + ".json")


def is_cached(d: Path, spec: dict) -> bool:
    return cached_path(d, spec).exists()


def cached(d: Path, spec: dict, make) -> dict:
    path = cached_path(d, spec)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        r = make()
        path.with_suffix(".tmp").write_text(json.dumps({"spec": spec, "result": r}))
        path.with_suffix(".tmp").replace(path)
    return json.loads(path.read_text())["result"]


def plan(P, target, n_t, base, grow_at, grown_tokens) -> list[tuple]:
    """The runs, most needed first: at each peak LR of ``--lrs`` scratch (whole budget, half) and grown;
    ``n_t``: the target's parameters (scratch's budget is ``P["budget"]`` tokens per parameter)."""
    return [
        (f"{name}@{lr:g}", shape, tokens, {"lr": lr} | kw)
        for lr in map(float, P["lrs"].split(","))
        for name, shape, tokens, kw in (
            ("scratch", target, round(P["budget"] * n_t), {}),
            ("scratch_half", target, round(P["budget"] * n_t / 2), {}),
            ("grown", base, grown_tokens, {"grow_at": (grow_at,)}),
        )
    ]


def rows(res: dict, grow_at: str) -> list[dict]:
    """One row per peak LR with all three runs done (saved against scratch at that LR), then ``tuned``:
    the grown run at its best LR against scratch at its best LR at each of its two budgets."""

    def best(kind):
        done = {k.partition("@")[2]: r for k, r in res.items() if k.partition("@")[0] == kind}
        return min(done.items(), key=lambda kv: kv[1]["val"]) if done else None

    def row(lr, s, h, g):
        c, bound = scratch_compute_for([(s["flops"], s["val"]), (h["flops"], h["val"])], g["val"])
        saved = f"{bound}{100 * (1 - g['flops'] / c):.1f}%"
        return {"lr": lr, "grow_at": grow_at, "scratch_val": s["val"], "scratch_half_val": h["val"],
                "grown_val": g["val"], "d_val": g["val"] - s["val"], "saved": saved}  # fmt: skip

    lrs = dict.fromkeys(k.partition("@")[2] for k in res)
    out = [row(lr, *(res[f"{n}@{lr}"] for n in ("scratch", "scratch_half", "grown")))
           for lr in lrs if all(f"{n}@{lr}" in res for n in ("scratch", "scratch_half", "grown"))]  # fmt: skip
    picks = [best(n) for n in ("scratch", "scratch_half", "grown")]
    if len(out) > 1 and all(picks):
        out.append(row("tuned " + "/".join(lr for lr, _ in picks), *(r for _, r in picks)))
    return out


def main():
    import tempfile

    t0 = time.time()
    args = parse_args("gpu_budget", __doc__.splitlines()[0], options)
    P = dict(QUICK if args.quick else FULL)
    P.update({k: getattr(args, k) for k in FULL if getattr(args, k) is not None})
    d = args.dir
    P["text"] = text_file(args.data, d / "cache", P["data_mb"])
    P["tokenizer"] = tokenizer(P["text"], P["vocab"], d / "cache")
    target, base = (P["width"], P["layers"]), (P["base_width"], P["base_layers"])
    if base == target or base[0] > target[0] or base[1] > target[1]:
        raise SystemExit(f"bench/gpu_budget.py: the base {base} must be smaller than the target {target}")
    n_t, n_b = model(P, *target).n_params(), model(P, *base).n_params()
    frac = round(P["grow_time"] * 0.8, 6)  # of the stable phase: wsd decays over the last 20% (its default)
    grow = ([f"width={P['width']}"] if base[0] < target[0] else []) + (
        [f"layers={P['layers']},method=stack"] if base[1] < target[1] else []
    )
    grow_at = f"{frac}:{','.join(grow)}"  # one --grow-at item: stack, widen, or both
    grown_tokens = round(P["budget"] * n_t * n_t / (frac * n_b + (1 - frac) * n_t))  # scratch's FLOPs
    corpus = corpus_tokens(P)
    epochs = P["budget"] * n_t / corpus
    if epochs > MAX_EPOCHS:
        print(f"  warning: the budget is {epochs:.1f} passes over the text: d256 x 8 at 11 passes overfit here")
    spec = {k: v for k, v in P.items() if k not in ("text", "tokenizer", "evals", "lrs", "deadline")}
    spec |= {"data": Path(args.data).name}
    info = machine() | {"target_params": n_t, "base_params": n_b, "corpus_tokens": corpus,
                        "epochs": round(epochs, 2), "gpu": gpu_name()}  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="growtool-gpu-budget-"))
    res, rate = {}, 0.0  # rate: the slowest seconds per token seen so far (an estimate for what is left)
    for name, shape, tokens, kw in plan(P, target, n_t, base, grow_at, grown_tokens):
        left = P["deadline"] - (time.time() - t0)
        if P["deadline"] and rate and rate * tokens > left and not is_cached(d, {**spec, "run": name}):
            print(f"  {name}: skipped, about {rate * tokens:.0f} s of training with {left:.0f} s left (--deadline)")
            continue
        make = lambda n=name, w=shape, t=tokens, k=kw: run(P, n, w, t, work, **dict(k))  # noqa: E731
        res[name] = cached(d, {**spec, "run": name}, make)
        rate = max(rate, res[name]["seconds"] / tokens)
        r = res[name]
        print(f"  {name}: val {r['val']:.4f}, {r['steps']} steps, {r['seconds']:.0f} s", flush=True)
        write_json(d / "results.json", {"settings": spec, "machine": info, "runs": res, "rows": rows(res, grow_at)})
    title = f"compute saved at {P['budget']:g} tokens/parameter (frontier of scratch's two budgets)"
    print(table(rows(res, grow_at), title))
    print(f"wrote {d}/results.json")


def corpus_tokens(P) -> int:
    """How many tokens the text is (the training split is most of it): for the epochs the budget takes."""
    from tokenizers import Tokenizer

    lines = Path(P["text"]).read_text().split("\n")
    return sum(len(e.ids) for e in Tokenizer.from_file(P["tokenizer"]).encode_batch(lines))


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "none"


if __name__ == "__main__":
    main()
