"""Small initialisation at CPU scale ("Small Initialization Matters for Large Language Models").

A grid of Llama-family models (untied head, SwiGLU FFN 4 x width, head_dim 16), each created with
gamma-initialisation (sigma = fan_in^-gamma, embeddings width^-gamma: ``init_model``'s default
embed_gamma = gamma) and trained with ``growtool.training.loop.train`` on byte-level real text
(default ../shared/data/tinyshakespeare.txt from the checkout root) for the same number of steps:

    width in {64, 128} x gamma in {0.5, 0.75, 1.0, 1.25} x RMSNorm eps in {1e-5, 1e-12}
    x gated attention {off, on}  =  32 runs (x --seeds)

Every run of one seed shares its data order and its init noise (only the scale differs), so the
gamma comparisons use common random numbers. Outputs, under ``<out>/small_init/``:

* ``results.csv`` / ``results.json``: one row per run: final validation loss (the trainer's mean
  next-token cross-entropy, nats/byte, on fixed windows of the held-out last 5% of the text),
  the mean training loss of the last 10% of steps, seconds.
* ``summary.csv``: validation loss per cell, mean (and std) over seeds, with the gamma-1 minus
  gamma-0.5 difference per (width, eps, gate).
* ``condensation.csv`` / ``condensation.png``: stable rank and row cosine over training, averaged
  over the layers for each kind of matrix (q/k/v/o/g_proj, gate/up/down_proj, embedding, head),
  gamma 0.5 vs 1 at eps 1e-12 with gated attention on, for each width (seed 0).
* ``token_compare.csv`` / ``token_compare.png``: ``growtool.compare`` of gamma 1 (model B) against
  gamma 0.5 (model A) on every non-overlapping window of the validation tail, binned by
  difficulty (the mean of both models' losses), at the largest width, in the paper's setting
  (eps 1e-12, gate on) and the masking one (eps 1e-5, gate off), seed 0.
* ``curves.csv``: validation loss over training, every run.
* ``<out>/tmp/small_init/runs/<name>/`` (git-ignored): each run's trainer folder (metrics.jsonl,
  loss.png, final.safetensors). A run whose ``summary.json`` holds the same settings is reused
  (``--fresh`` re-runs it), so an interrupted grid continues where it stopped; results.json
  counts the reused runs (``runs_reused``; their ``seconds`` are from when they were trained).

Runs go to a pool of ``--jobs`` processes with ``--threads`` torch threads each.
``--quick`` is the CI smoke run: width 32, one layer, 4 runs of 20 steps, in-process; without
``--out`` it writes under bench/results/tmp/quick/ (git-ignored), never over the full results.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DEFAULT_OUT, machine, parse_args, results_dir, table, write_csv, write_json  # noqa: E402

DATA = str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt")  # ../shared/data
KINDS = (
    "embed_tokens",
    "q_proj",
    "k_proj",
    "v_proj",
    "g_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "lm_head",
)


def options(p):
    p.add_argument("--data", default=DATA, help="text file (byte-level tokens)")
    p.add_argument("--widths", type=int, nargs="+", default=None, help="default 64 128 (quick: 32)")
    p.add_argument("--gammas", type=float, nargs="+", default=None, help="default 0.5 0.75 1 1.25 (quick: 0.5 1)")
    p.add_argument("--eps", type=float, nargs="+", default=None, help="RMSNorm eps values; default 1e-5 1e-12")
    p.add_argument("--gate", choices=["off", "on", "both"], default="both", help="gated attention")
    p.add_argument("--layers", type=int, default=None, help="default 2 (quick: 1)")
    p.add_argument("--steps", type=int, default=None, help="training steps per run; default 400 (quick: 20)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step; default 16 (quick: 8)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence; default 64 (quick: 32)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per cell")
    p.add_argument("--bins", type=int, default=5, help="difficulty bins of the token comparison")
    p.add_argument("--jobs", type=int, default=None, help="runs in parallel; default 2 (quick: 1, in-process)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--fresh", action="store_true", help="re-run runs that already have results")


def settle(args) -> None:
    """Fill the defaults that depend on --quick; check the arguments."""
    quick = args.quick
    pick = lambda v, full, q: v if v is not None else (q if quick else full)  # noqa: E731
    args.widths = pick(args.widths, [64, 128], [32])
    args.gammas = pick(args.gammas, [0.5, 0.75, 1.0, 1.25], [0.5, 1.0])
    args.eps = pick(args.eps, [1e-5, 1e-12], [1e-5, 1e-12])
    args.layers = pick(args.layers, 2, 1)
    args.steps = pick(args.steps, 400, 20)
    args.jobs = pick(args.jobs, 2, 1)
    args.batch = pick(args.batch, 16, 8)
    args.seq = pick(args.seq, 64, 32)
    if quick and Path(args.out).resolve() == DEFAULT_OUT.resolve():
        # never overwrite the full benchmark's results with a smoke run: quick goes to the ignored tmp/
        args.out = str(DEFAULT_OUT / "tmp" / "quick")
        args.dir = results_dir(args.out, "small_init")
    if not Path(args.data).is_file():
        sys.exit(f"bench/small_init.py: error: --data {args.data}: no such file")
    if any(w % 16 for w in args.widths):
        sys.exit("bench/small_init.py: error: widths must be multiples of 16 (head_dim 16)")


def grid(args) -> list[dict]:
    """The runs. --quick: gamma {0.5, 1} x {(eps 1e-12, gate on), (eps 1e-5, gate off)}."""
    gates = {"off": [False], "on": [True], "both": [False, True]}[args.gate]
    cells = [(w, g, e, a) for w in args.widths for g in args.gammas for e in args.eps for a in gates]
    if args.quick:
        cells = [c for c in cells if (c[2] == min(args.eps)) == c[3]]
    return [
        {
            "name": run_name(w, g, e, a, s),
            "width": w,
            "gamma": g,
            "eps": e,
            "gate": a,
            "seed": s,
            "layers": args.layers,
            "steps": args.steps,
            "batch": args.batch,
            "seq": args.seq,
            "lr": args.lr,
            "data": str(Path(args.data).resolve()),
        }
        for (w, g, e, a) in cells
        for s in range(args.seeds)
    ]


def run_name(width, gamma, eps, gate, seed) -> str:
    return f"d{width}-g{gamma:g}-eps{eps:.0e}-{'gate' if gate else 'nogate'}-s{seed}"


def model_config(spec):
    from growtool.nn.config import ModelConfig

    w = spec["width"]
    return ModelConfig(
        family="llama",
        vocab_size=256,
        width=w,
        layers=spec["layers"],
        heads=w // 16,
        kv_heads=w // 16,
        head_dim=16,
        ffn=4 * w,
        context=spec["seq"],
        norm_eps=spec["eps"],
        tie=False,
        attn_gate=spec["gate"],
    )


def run_one(spec: dict, root: str, threads: int, fresh: bool) -> dict:
    """Initialise and train one model (in a worker process); return its result row."""
    import torch

    from growtool.init import init_model
    from growtool.io import checkpoint
    from growtool.training.loop import train
    from growtool.training.run_folder import read_metrics

    torch.set_num_threads(threads)
    run = Path(root) / "runs" / spec["name"]
    done = run / "summary.json"
    if done.exists() and not fresh:
        old = json.loads(done.read_text())
        if old.get("spec") == spec:
            return {**old["row"], "reused": True}
    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    cfg = model_config(spec)
    model = init_model(cfg, gamma=spec["gamma"], seed=spec["seed"])
    init_path = checkpoint.save_tensors(
        str(run / "init.safetensors"),
        cfg,
        [{"op": "init", "gamma": spec["gamma"], "seed": spec["seed"]}],
        model.tensors(),
    )
    s = spec["steps"]
    t0 = time.perf_counter()
    summ = train(
        init_path,
        [spec["data"]],
        run / "train",
        steps=s,
        batch=spec["batch"],
        seq=spec["seq"],
        lr=spec["lr"],
        eval_every=max(1, s // 10),
        metrics_every=max(1, s // 10),
        save_every=s,
        seed=spec["seed"],
        schedule="cosine",  # as its recorded results (the trainer's default is wsd now)
        device="cpu",
        progress=False,
        cache_dir=Path(root) / "cache",
    )
    wall = time.perf_counter() - t0
    recs = read_metrics(run / "train" / "metrics.jsonl")
    tail = [r["loss"] for r in recs if "loss" in r][-max(1, s // 10) :]
    row = {k: spec[k] for k in ("name", "width", "gamma", "eps", "gate", "seed")}
    row.update(
        params=summ["params"],
        steps=summ["steps"],
        tokens=summ["tokens"],
        val_loss=summ["val_loss"],
        train_loss_tail=sum(tail) / len(tail),
        first_val_loss=summ["first_val_loss"],
        seconds=round(wall, 1),
    )
    (run / "init.safetensors").unlink()
    done.write_text(json.dumps({"spec": spec, "row": row}, indent=1))
    return {**row, "reused": False}


def run_grid(specs, args) -> list[dict]:
    rows = {}
    t0 = time.perf_counter()
    if args.jobs <= 1:
        for sp in specs:
            rows[sp["name"]] = run_one(sp, str(args.work), args.threads, args.fresh)
            log_row(rows[sp["name"]], len(rows), len(specs), t0)
    else:
        with ProcessPoolExecutor(args.jobs) as pool:
            futs = {sp["name"]: pool.submit(run_one, sp, str(args.work), args.threads, args.fresh) for sp in specs}
            for name, f in futs.items():
                rows[name] = f.result()
                log_row(rows[name], len(rows), len(specs), t0)
    return [rows[sp["name"]] for sp in specs]


def strip_reused(rows) -> tuple[list[dict], int]:
    """(rows without the "reused" flag, how many runs were reused rather than trained now)."""
    return [{k: v for k, v in r.items() if k != "reused"} for r in rows], sum(r["reused"] for r in rows)


def log_row(r, i, n, t0):
    print(
        f"[{i}/{n}] {r['name']}: val {r['val_loss']:.4f} "
        f"({r['seconds']:.0f} s; {time.perf_counter() - t0:.0f} s total)",
        file=sys.stderr,
        flush=True,
    )


# ---- tables -----------------------------------------------------------------------------------


def summarise(rows) -> list[dict]:
    """Per cell: validation loss over seeds (mean, std), and gamma-1 minus gamma-0.5 at that setting."""
    cells = {}
    for r in rows:
        cells.setdefault((r["width"], r["eps"], r["gate"], r["gamma"]), []).append(r["val_loss"])
    out = []
    for (w, e, a, g), v in sorted(cells.items()):
        base = cells.get((w, e, a, 0.5))
        one = cells.get((w, e, a, 1.0))
        out.append(
            {
                "width": w,
                "eps": f"{e:.0e}",
                "gate": "on" if a else "off",
                "gamma": g,
                "seeds": len(v),
                "val_loss": statistics.mean(v),
                "val_std": statistics.stdev(v) if len(v) > 1 else "",
                "g1_minus_g05": (statistics.mean(one) - statistics.mean(base)) if base and one else "",
            }
        )
    return out


def pivot(rows) -> str:
    """A readable grid: one line per (width, eps, gate), one column per gamma (mean over seeds)."""
    gam = sorted({r["gamma"] for r in rows})
    lines = []
    for key in sorted({(r["width"], r["eps"], r["gate"]) for r in rows}):
        line = {"width": key[0], "eps": key[1], "gate": key[2]}
        for g in gam:
            v = [r["val_loss"] for r in rows if (r["width"], r["eps"], r["gate"], r["gamma"]) == (*key, g)]
            line[f"g{g:g}"] = statistics.mean(v) if v else ""
        line["best"] = min(gam, key=lambda g: line[f"g{g:g}"] if line[f"g{g:g}"] != "" else 1e9)
        lines.append(line)
    return lines


# ---- condensation -----------------------------------------------------------------------------


def kind_of(name: str) -> str:
    return next(k for k in KINDS if f"{k}." in name or name.startswith(k))


def condensation(run_dir: Path) -> list[dict]:
    """Per logged step and matrix kind: stable rank and row cosine, averaged over the layers."""
    from growtool.training.run_folder import read_metrics

    out = []
    for r in read_metrics(run_dir / "train" / "metrics.jsonl"):
        if "matrix" not in r:
            continue
        by = {}
        for name, m in r["matrix"].items():
            by.setdefault(kind_of(name), []).append(m)
        for k in KINDS:
            if k in by:
                out.append(
                    {
                        "step": r["step"],
                        "tokens": r["tokens"],
                        "kind": k,
                        "stable_rank": statistics.mean(m["stable_rank"] for m in by[k]),
                        "row_cosine": statistics.mean(m["row_cosine"] for m in by[k]),
                    }
                )
    return out


def condensation_plot(series: dict, path: Path) -> None:
    """series: {label: condensation rows}; one column per matrix kind, rows = the two metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in KINDS if any(r["kind"] == k for rows in series.values() for r in rows)]
    fig, axes = plt.subplots(2, len(kinds), figsize=(2.3 * len(kinds), 5), squeeze=False)
    styles = ["-", "--", ":", "-."]
    for j, k in enumerate(kinds):
        for i, (label, rows) in enumerate(series.items()):
            rk = [r for r in rows if r["kind"] == k]
            color = "tab:blue" if "g0.5" in label else "tab:red"
            for a, metric in enumerate(("stable_rank", "row_cosine")):
                axes[a][j].plot(
                    [r["tokens"] / 1e3 for r in rk],
                    [r[metric] for r in rk],
                    styles[i // 2 % 4],
                    color=color,
                    lw=1.2,
                    label=label,
                )
        axes[0][j].set_title(k, fontsize=9)
        axes[1][j].set_xlabel("k tokens", fontsize=8)
    axes[0][0].set_ylabel("stable rank")
    axes[1][0].set_ylabel("row |cos|")
    for ax in axes.flat:
        ax.tick_params(labelsize=7)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("condensation over training: gamma 0.5 (blue) vs 1 (red), eps 1e-12, gated attention on", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- token-level comparison -------------------------------------------------------------------


def val_windows(args):
    """Every non-overlapping (seq + 1)-token window of the trainer's validation tail."""
    import torch

    from growtool.tokenizer import get_tokenizer
    from growtool.training import data

    toks = data.load_tokens([args.data], get_tokenizer("byte"), args.work / "cache", 256)
    ds = data.Dataset(toks, args.seq, args.batch)
    return torch.cat([torch.cat([x, y[:, -1:]], 1) for x, y in ds.val_batches(10**9)])


def token_compare(rows, args) -> list[dict]:
    """gamma 1 (B) vs gamma 0.5 (A), seed 0, largest width, paper setting and masked setting."""
    import torch

    from growtool.io import checkpoint
    from growtool.lab.compare import compare_models

    torch.set_num_threads(max(1, args.jobs * args.threads))
    w = max(args.widths)
    windows = val_windows(args)
    out = []
    have = {r["name"] for r in rows}
    settings = [(min(args.eps), True), (max(args.eps), False)]
    for eps, gate in dict.fromkeys(settings):
        names = [run_name(w, g, eps, gate, 0) for g in (0.5, 1.0)]
        if not all(n in have for n in names):
            continue
        label = f"eps {eps:.0e}, gate {'on' if gate else 'off'}"
        paths = [args.work / "runs" / n / "train" / "final.safetensors" for n in names]
        a, b = (checkpoint.load(str(p)).model() for p in paths)
        for r in compare_models(a, b, windows, bins=args.bins, batch=32):
            out.append({"setting": label, "width": w, **vars(r)})
    return out


def token_plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(r["setting"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    width = 0.8 / max(1, len(settings))
    for i, s in enumerate(settings):
        rs = [r for r in rows if r["setting"] == s and r["bin"] != "all"]
        xs = [int(r["bin"]) + (i - (len(settings) - 1) / 2) * width for r in rs]
        for ax, key in zip(axes, ("gain", "gap", "js")):
            ax.bar(xs, [r[key] for r in rs], width, label=s)
    titles = (
        "mean loss gain  loss(g0.5) - loss(g1)  [nats]",
        "mean gap  p_g1(y) - p_g0.5(y)",
        "mean Jensen-Shannon(g0.5, g1)  [nats]",
    )
    n = max(int(r["bin"]) for r in rows if r["bin"] != "all") + 1
    for ax, t in zip(axes, titles):
        ax.set_title(t, fontsize=9)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(range(n))
        ax.set_xlabel("difficulty bin (easy -> hard; mean loss of both)", fontsize=8)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"token-level comparison, gamma 1 vs 0.5, width {rows[0]['width']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- main -------------------------------------------------------------------------------------


def main():
    args = parse_args("small_init", __doc__.splitlines()[0], options)
    settle(args)
    args.work = Path(args.out) / "tmp" / "small_init"
    specs = grid(args)
    t0 = time.perf_counter()
    print(
        f"small_init: {len(specs)} runs x {args.steps} steps ({args.batch}x{args.seq} tokens), "
        f"{args.jobs} jobs x {args.threads} threads -> {args.dir}",
        file=sys.stderr,
        flush=True,
    )
    rows, reused = strip_reused(run_grid(specs, args))
    t_grid = time.perf_counter() - t0

    write_csv(args.dir / "results.csv", rows)
    summary = summarise(rows)
    write_csv(args.dir / "summary.csv", summary)
    grid_table = pivot(rows)
    print(table(grid_table, "validation loss (nats/byte), mean over seeds"), file=sys.stderr)

    from growtool.training.run_folder import read_metrics

    curves = []
    for r in rows:
        for m in read_metrics(args.work / "runs" / r["name"] / "train" / "metrics.jsonl"):
            if "val_loss" in m:
                curves.append({"name": r["name"], "step": m["step"], "tokens": m["tokens"], "val_loss": m["val_loss"]})
    write_csv(args.dir / "curves.csv", curves)

    cond, series = [], {}
    for w in args.widths:
        for g in (0.5, 1.0):
            name = run_name(w, g, min(args.eps), True, 0)
            if (args.work / "runs" / name).exists() and name in {r["name"] for r in rows}:
                c = condensation(args.work / "runs" / name)
                series[f"d{w} g{g:g}"] = c
                cond += [{"run": name, "width": w, "gamma": g, **r} for r in c]
    if cond:
        write_csv(args.dir / "condensation.csv", cond)
        condensation_plot(series, args.dir / "condensation.png")

    tok = token_compare(rows, args)
    if tok:
        write_csv(args.dir / "token_compare.csv", tok)
        token_plot(tok, args.dir / "token_compare.png")
        print(
            table(
                [
                    {k: r[k] for k in ("setting", "bin", "tokens", "loss_a", "loss_b", "gain", "gap", "abs_gap", "js")}
                    for r in tok
                ],
                "token-level: A = gamma 0.5, B = gamma 1 (gain > 0: gamma 1 better)",
            ),
            file=sys.stderr,
        )

    write_json(
        args.dir / "results.json",
        {
            "settings": {k: v for k, v in vars(args).items() if k not in ("dir",)},
            "machine": machine(),
            "grid_seconds": round(t_grid, 1),
            "runs_reused": reused,
            "run_seconds_sum": round(sum(r["seconds"] for r in rows), 1),
            "total_seconds": round(time.perf_counter() - t0, 1),
            "runs": rows,
            "summary": summary,
            "grid": grid_table,
            "token_compare": tok,
        },
    )
    print(f"wrote {args.dir} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
