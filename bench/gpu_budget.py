"""Issue 40's budget study on one GPU: scratch against the best grown schedule at 10 tokens per parameter.

One prepared script for a lent GPU machine (it fits about 8 minutes of one H200 at the defaults):

1. text: the first ``--data-mb`` MB of a .jsonl's "text" fields (default ../shared/data/docs.jsonl);
2. a byte-level BPE tokenizer of ``--vocab`` ids trained on it (the tokenizers library), cached;
3. scratch: a Llama of ``--width`` x ``--layers`` from init, ``--budget`` x its parameters tokens,
   and again at half that budget (two whole wsd runs: scratch's loss-compute frontier between them);
4. grown: the best schedule of the CPU study (bench/results/budget_d64/WRITEUP.md): the same Llama
   at ``--base-layers`` (and ``--base-width``) stacked to ``--layers`` (and widened to ``--width``)
   inside one ``train`` run (``--grow-at``) at ``--grow-time`` of the stable phase, with every other
   option at the trainer's default, at the FLOPs of the full scratch run (the base phase counted).

Reports compute saved = 1 - grown FLOPs / the FLOPs at which scratch ends at the grown run's final
loss (log FLOPs interpolated between scratch's two budgets; a bound outside them), and the final
losses. Each run's result is cached in ``<out>/gpu_budget/cached/``: a rerun after a time-out
runs only what is missing. ``--quick`` (``--device cpu``): tiny sizes, the test's smoke run.

    python bench/gpu_budget.py --device cuda                       # on the GPU machine
    python bench/gpu_budget.py --device cpu --quick --data DOCS    # a dry run (tests/test_bench_gpu_budget.py)
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from budget import DATA, scratch_compute_for, text_file
from common import machine, parse_args, table, write_json
from growth_pays import _curve

FULL = dict(
    width=512, base_width=512, layers=8, base_layers=4, head_dim=64, vocab=8192, batch=64, seq=256, budget=10.0,
    lr=3e-3, grow_lr=3e-3, grow_time=0.15, data_mb=32, evals=10, device="cuda",
)  # fmt: skip
QUICK = dict(FULL, width=32, base_width=32, layers=2, base_layers=1, head_dim=8, vocab=300, batch=2, seq=16,
             budget=0.1, data_mb=1, evals=3, device="cpu")  # fmt: skip


def options(p):
    p.add_argument("--data", default=DATA, help=f"a .jsonl (its text fields) or a text file (default {DATA})")
    for k, v in FULL.items():
        p.add_argument("--" + k.replace("_", "-"), type=type(v), default=None, help=f"default {v} (quick {QUICK[k]})")


def tokenizer(text: str, vocab: int, cache: Path) -> str:
    """A byte-level BPE tokenizer.json of ``vocab`` ids trained on the file ``text``, written once into ``cache``."""
    key = hashlib.sha256(f"{Path(text).read_bytes()}:{vocab}".encode()).hexdigest()[:12]
    out = cache / f"bpe-{vocab}-{key}.json"
    if not out.exists():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=alphabet, special_tokens=["<|endoftext|>"])
        tok.train([text], trainer)
        tmp = out.with_suffix(".tmp")
        tok.save(str(tmp))
        tmp.replace(out)
    return str(out)


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


def cached(d: Path, spec: dict, make) -> dict:
    path = d / "cached" / (hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16] + ".json")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        r = make()
        path.with_suffix(".tmp").write_text(json.dumps({"spec": spec, "result": r}))
        path.with_suffix(".tmp").replace(path)
    return json.loads(path.read_text())["result"]


def main():
    import tempfile

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
    spec = {k: v for k, v in P.items() if k not in ("text", "tokenizer", "evals")} | {"data": Path(args.data).name}
    work = Path(tempfile.mkdtemp(prefix="growtool-gpu-budget-"))
    res = {}
    for name, shape, tokens, kw in (
        ("scratch", target, round(P["budget"] * n_t), {"lr": P["lr"]}),
        ("scratch_half", target, round(P["budget"] * n_t / 2), {"lr": P["lr"]}),
        ("grown", base, grown_tokens, {"lr": P["grow_lr"], "grow_at": (grow_at,)}),
    ):
        make = lambda n=name, w=shape, t=tokens, k=kw: run(P, n, w, t, work, **dict(k))  # noqa: E731
        res[name] = cached(d, {**spec, "run": name}, make)
        print(f"  {name}: val {res[name]['val']:.4f}, {res[name]['steps']} steps, {res[name]['seconds']:.0f} s")
    g = res["grown"]
    c, bound = scratch_compute_for([(res[k]["flops"], res[k]["val"]) for k in ("scratch", "scratch_half")], g["val"])
    saved = 1 - g["flops"] / c
    row = {
        "target_params": n_t, "base_params": n_b, "budget": P["budget"], "grow_at": grow_at,
        "scratch_val": res["scratch"]["val"], "scratch_half_val": res["scratch_half"]["val"], "grown_val": g["val"],
        "d_val": g["val"] - res["scratch"]["val"], "saved": f"{bound}{100 * saved:.1f}%",
    }  # fmt: skip
    write_json(d / "results.json", {"settings": spec, "machine": machine(), "runs": res, "row": row})
    print(table([row], "compute saved at one budget (frontier of scratch's two budgets)"))
    print(f"wrote {d}/results.json")


if __name__ == "__main__":
    main()
