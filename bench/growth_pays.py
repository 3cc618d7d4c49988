"""Growth that pays: compute saved against training the wide model from scratch, with the base phase
counted; optimizer carried through growth vs reset; GPT-2 and Llama; one growth vs a multi-stage schedule.

On real text (byte level; default ../shared/data/tinyshakespeare.txt), for each seed, every run made
with ``growtool.train`` (the library behind ``growtool train``):

  1.5x width, d -> 1.5d (``--grow-to``), for each family in ``--families`` (llama, gpt2):
    carry_<recipe>  one command: ``train BASE --tokens 2T --grow-at 0.5:1.5d --grow-recipe <recipe>``
                    (one LR schedule, AdamW moments grown with the model, gates ramp over 10% of the run)
                    for the recipes srio, nrio, copy
    carry_<recipe>_<option>  the same with one option of issue 11 (OPTIONS below): recipe noise 0.1
                    (symmetry breaking, exact at gate 0), --grow-lr mup, --grow-schedule rewarm, a
                    gate ramp of 2.5% or 30% of the run instead of 10%, the growth after 25% or 75%
                    of the run (early, late); options combine with "+" (carry_srio_rewarm+early)
    reset_opt_srio  as carry_srio with ``--grow-optimizer reset``: a fresh AdamW at the growth, the same
                    LR schedule (no re-warm): isolates carrying the moments
    reset_srio      today's two-command workflow: ``train BASE --tokens T``; ``expand final --width 1.5d``;
                    ``train GROWN --tokens T`` (fresh optimizer, LR re-warm, its own cosine schedule)
    plain_<recipe>  the same two commands with every default, as a user runs them: ``expand`` with its
                    default seed (0) and the recipe, the grown run with the base run's seed, so it
                    continues the data stream where the base run stopped (train's default since
                    ``--data-start``); ``plain_<recipe>_replay``: with ``--data-start 0``, the grown run
                    replays the base run's batches (the default before); ``plain_<recipe>_mid``: the
                    source is the first half of a 2T run (``--stop-at``, LR not annealed), as
                    ``--grow-at 0.5`` sees it
    scratch         the 1.5d model from init, as many tokens as give the FLOPs of carry (2T tokens, half
                    at each width)
  2x width, d -> 2d (``--to-2x``), Llama only (``--multi-family``):
    multi           ``--tokens 3T --grow-at 1/3:1.5d --grow-at 2/3:2d`` (three stages)
    one_2x          ``--tokens 3T --grow-at 0.5:2d`` (one growth)
    scratch_2x      the 2d model from init, the FLOPs of multi

FLOPs are 6 x parameters x tokens summed over steps (each step at its own width: the ``flops`` field
of metrics.jsonl), so the base phase is counted. Compute saved (per seed, paired with that seed's
scratch run) = 1 - (FLOPs at which the grown run's validation loss first reaches scratch's final
validation loss, linearly interpolated between evaluations) / (scratch's total FLOPs); "not reached"
when it never does. Seeds vary inits, data order and the growth expansions.

Writes ``<out>/growth_pays/``: results.csv (per family and variant: final val mean / std, paired
difference vs carry_srio (1.5x) or multi (2x), compute saved mean / std / min / max), runs.csv,
results.json, curves.png.
``--quick``: tiny models, one seed, a few steps (CI smoke run).
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
import warnings
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path

from common import machine, parse_args, table, train_phase, write_csv, write_json

DATA = str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt")  # ../shared/data

FULL = dict(
    width=64,
    grow_to=96,
    to_2x=128,
    layers=4,
    head_dim=16,
    batch=16,
    seq=64,
    tokens=65_536,
    seeds=3,
    lr=3e-3,
    evals=16,
    eval_batches=8,
    jobs=2,
    families="llama,gpt2",
    multi_family="llama",
    gamma=0.5,
    llama_tie=0,
    schedule="cosine",
)
QUICK = dict(
    width=32,
    grow_to=48,
    to_2x=64,
    layers=2,
    head_dim=8,
    batch=8,
    seq=32,
    tokens=2048,
    seeds=1,
    lr=3e-3,
    evals=4,
    eval_batches=2,
    jobs=2,
    families="llama,gpt2",
    multi_family="llama",
    gamma=0.5,
    llama_tie=0,
    schedule="cosine",
)

# carry_<recipe>_<option>: what each option changes in the one-command run (train keywords; "noise"
# is the recipe's symmetry-breaking noise)
OPTIONS = {
    "noise": {"noise": 0.1},
    "mup": {"grow_lr": "mup"},
    "rewarm": {"grow_schedule": "rewarm"},
    "ramp_short": {"ramp": 0.025},
    "ramp_long": {"ramp": 0.3},
    "early": {"frac": 0.25},  # grow after a quarter of the run instead of half
    "late": {"frac": 0.75},
    "fresh": {"grow_optimizer": "reset"},  # a fresh AdamW at the growth (with rewarm: the plain path's optimizer)
}
DEFAULT_VARIANTS = "carry_srio,carry_nrio,carry_copy,carry_copy_noise,carry_srio_noise,carry_srio_mup,"
DEFAULT_VARIANTS += "carry_srio_rewarm,carry_srio_ramp_short,carry_srio_ramp_long,reset_srio,scratch"


def options(p):
    p.add_argument("data", nargs="?", default=DATA, help=f"text file (byte level; default {DATA})")
    for k, v in FULL.items():
        p.add_argument("--" + k.replace("_", "-"), type=type(v), default=None, help=f"default {v} (quick {QUICK[k]})")
    p.add_argument("--work", default=None, help="folder for checkpoints and runs (default: a temp dir, removed)")
    p.add_argument(
        "--variants",
        default=None,
        help=f"1.5x variants to run (default: {DEFAULT_VARIANTS})",
    )
    p.add_argument(
        "--multi-variants",
        default=None,
        help="2x variants (default: multi,one_2x,scratch_2x; options as for 1.5x: multi_rewarm, one_2x_rewarm)",
    )
    p.add_argument("--paired-vs", default=None, help="1.5x variant the others are paired with (default carry_srio)")
    p.add_argument(
        "--add-to",
        default=None,
        metavar="RESULTS_JSON",
        help="keep that run's runs and settings, run only the jobs it lacks, aggregate all together",
    )


# ---- jobs (worker processes) ------------------------------------------------------------------


FAMILIES = ("llama", "gpt2", "llama_bias", "qwen2", "starcoder2", "starcoder2_nobias")  # the targets _config builds


def _config(P, family, width):
    from growtool.nn.config import ModelConfig

    heads = width // P["head_dim"]
    common = dict(
        vocab_size=P.get("vocab") or 256,
        width=width,
        layers=P["layers"],
        heads=heads,
        head_dim=P["head_dim"],
        ffn=4 * width,
    )
    if family == "gpt2":  # LayerNorm, tied head, learned positions: the family where the angle decides exactness
        gate = bool(P.get("gpt2_gate", 0))  # --gpt2-gate 1: gated attention, as the Llama target's
        return ModelConfig(
            family="gpt2", kv_heads=heads, context=max(256, P["seq"]), norm_eps=1e-5, tie=True, attn_gate=gate, **common
        )
    if family in ("starcoder2", "starcoder2_nobias"):  # Llama's layout (RoPE, untied) with GPT-2's block:
        bias = family == "starcoder2"  # LayerNorm, biases (_nobias: the norms' alone), GELU, one KV head per head
        return ModelConfig(
            family="starcoder2",
            kv_heads=heads,
            context=max(256, P["seq"]),
            norm_eps=1e-5,
            tie=False,
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
            **common,
        )
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
    bias = family == "llama_bias"  # the Llama target with a bias on every linear layer but the head (as GPT-2's)
    qwen2 = family == "qwen2"  # Qwen2: the Llama target with biases on q, k and v alone (ungated: --llama-gate 0)
    plain = P.get("llama_mlp", "swiglu") != "swiglu"  # Arcee's layout: Llama with up -> act -> down, no gate
    return ModelConfig(
        family="arcee" if plain else "qwen2" if qwen2 else "llama",
        activation=P["llama_mlp"] if plain else None,
        kv_heads=heads if P.get("llama_mha", 0) else heads // 2,  # grouped KV heads 2:1 unless --llama-mha 1
        context=max(256, P["seq"]),
        norm_eps=1e-12,
        tie=bool(P.get("llama_tie", 0)),  # tied: the exact map is eps 1 (no rotation)
        attn_gate=bool(P.get("llama_gate", 1)),  # gated attention unless --llama-gate 0
        qkv_bias=bias or qwen2,
        o_bias=bias,
        mlp_bias=bias,
        **common,
    )


def _init(P, family, width, seed, path):
    from growtool.init import init_model
    from growtool.io import checkpoint

    cfg = _config(P, family, width)
    return checkpoint.save_tensors(
        str(path),
        cfg,
        [{"op": "init", "gamma": P["gamma"], "seed": seed}],
        init_model(cfg, gamma=P["gamma"], seed=seed).tensors(),
        force=True,
    )


def _two_x(variant: str) -> bool:
    return variant.startswith(("multi", "one_2x", "scratch_2x"))


def _option_kw(option: str, recipe: str, run: Path, variant: str, T: int) -> dict:
    """train keywords for ``recipe`` with the options named in ``option`` ("rewarm+mup", "" = none)."""
    import yaml

    from growtool.grow import recipes

    kw = {"grow_schedule": "continue"}  # the one-schedule baseline; the "rewarm" option re-warms
    for o in filter(None, option.split("+")):
        kw.update(OPTIONS[o])
    if "noise" in kw:  # the recipe with symmetry breaking, as a YAML file
        r = recipes.load(recipe, {"noise": kw.pop("noise")})
        recipe = str(run / f"{variant}.yaml")
        Path(recipe).write_text(yaml.safe_dump({**r, "name": f"{r['name']}+noise"}))
    if "ramp" in kw:
        kw["gate_warmup_tokens"] = round(kw.pop("ramp") * 2 * T)
    if "frac" in kw and variant.startswith(("multi", "one_2x")):
        raise ValueError(f"{variant}: early / late apply to one growth to 1.5x only")
    return {"grow_recipe": recipe, **kw}


def _curve(recs, flops0=0.0):
    return [(flops0 + r["flops"], r["val_loss"]) for r in recs if "val_loss" in r]


def job(P, family, variant, seed):
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    from growtool.grow import recipes
    from growtool.grow.engine import grow_tensor
    from growtool.grow.plan import build_plan, lineage_entry
    from growtool.io import checkpoint
    from growtool.io.stream import Producer

    t0 = time.time()
    d, D, D2, T = P["width"], P["grow_to"], P["to_2x"], P["tokens"]
    run = Path(P["work"]) / family / f"s{seed}"
    run.mkdir(parents=True, exist_ok=True)
    base = _init(P, family, d, seed, run / f"{variant}-base.safetensors")
    out = str(run / variant)
    extra = {}
    if variant == "reset_opt_srio":
        s, recs = train_phase(
            P, base, out, 2 * T, seed, grow_at=(f"0.5:{D}",), grow_optimizer="reset", grow_schedule="continue"
        )
        curve = _curve(recs)
    elif variant.startswith("carry_"):
        recipe, _, option = variant[len("carry_") :].partition("_")
        kw = _option_kw(option, recipe, run, variant, T)
        frac = kw.pop("frac", 0.5)
        s, recs = train_phase(P, base, out, 2 * T, seed, grow_at=(f"{frac}:{D}",), **kw)
        curve = _curve(recs)
    elif variant == "reset_srio":
        s1, r1 = train_phase(P, base, out + "-base", T, seed)
        src = checkpoint.load(s1["final"])
        plan = build_plan(src.config, recipes.load("srio"), D, seed=seed)
        grown = checkpoint.save(
            str(run / "reset-grown.safetensors"),
            plan.cfg,
            src.lineage + [lineage_entry(plan, src.sha256())],
            plan.outputs(),
            Producer(lambda n: grow_tensor(n, plan, src.get)),
            checkpoint.Output(force=True),
        )
        # the grown phase draws its own data order (seed + 1000), as bench/recipes.py does
        s, recs = train_phase(P, grown, out, T, seed + 1000)
        curve = _curve(r1) + _curve(recs[1:], r1[-1]["flops"])
        extra["bump"] = recs[1]["loss"] - r1[-1]["loss"]  # first grown update's loss minus the base's last
    elif variant.startswith("plain_"):
        recipe, _, option = variant[len("plain_") :].partition("_")
        if option not in ("", "replay", "mid"):
            raise ValueError(variant)
        if option == "mid":  # the source not annealed: the first half of a 2T run, as --grow-at 0.5 grows it
            steps = max(1, -(-2 * T // (P["batch"] * P["seq"])))
            s1, r1 = train_phase(P, base, out + "-base", 2 * T, seed, stop_at=steps // 2)
            src = checkpoint.load(Path(out + "-base") / "last.safetensors")
        else:
            s1, r1 = train_phase(P, base, out + "-base", T, seed)
            src = checkpoint.load(s1["final"])
        plan = build_plan(src.config, recipes.load(recipe), D, seed=0)  # expand's default --seed
        grown = checkpoint.save(
            str(run / f"{variant}-grown.safetensors"),
            plan.cfg,
            src.lineage + [lineage_entry(plan, src.sha256())],
            plan.outputs(),
            Producer(lambda n: grow_tensor(n, plan, src.get)),
            checkpoint.Output(force=True),
        )
        s, recs = train_phase(P, grown, out, T, seed, **({"data_start": 0} if option == "replay" else {}))
        curve = _curve(r1) + _curve(recs[1:], r1[-1]["flops"])
        extra["bump"] = recs[1]["loss"] - r1[-1]["loss"]
        extra["data_start"] = s["settings"]["data_start"]
    elif variant in ("scratch", "scratch_2x"):
        n_d = _config(P, family, d).n_params()
        if variant == "scratch":
            width, tokens = D, round(T * (n_d + _config(P, family, D).n_params()) / _config(P, family, D).n_params())
        else:
            n_15, n_2 = _config(P, family, D).n_params(), _config(P, family, D2).n_params()
            width, tokens = D2, round(T * (n_d + n_15 + n_2) / n_2)
        init = _init(P, family, width, 10_000 + seed, run / f"{variant}-init.safetensors")
        s, recs = train_phase(P, init, out, tokens, 3000 + seed)
        curve = _curve(recs)
    elif variant.split("_")[0] == "multi":
        kw = _option_kw(variant.partition("_")[2], "srio", run, variant, T)
        s, recs = train_phase(P, base, out, 3 * T, seed, grow_at=(f"{1 / 3:.6f}:{D}", f"{2 / 3:.6f}:{D2}"), **kw)
        curve = _curve(recs)
    elif variant.startswith("one_2x"):
        kw = _option_kw(variant[len("one_2x_") :], "srio", run, variant, T)
        s, recs = train_phase(P, base, out, 3 * T, seed, grow_at=(f"0.5:{D2}",), **kw)
        curve = _curve(recs)
    else:
        raise ValueError(variant)
    if variant.startswith(("carry_", "multi", "one_2x")) or variant == "reset_opt_srio":
        grow_steps = [r["step"] for a, r in zip(recs, recs[1:]) if a.get("width") != r.get("width")]
        extra["bump"] = max(recs[st]["loss"] - recs[st - 1]["loss"] for st in grow_steps) if grow_steps else None
    extra["diag"] = diag_series(recs)
    shutil.rmtree(run / variant, ignore_errors=True)
    return {
        "family": family,
        "variant": variant,
        "seed": seed,
        "val": s["val_loss"],
        "curve": curve,
        "flops": curve[-1][0],
        "params": s["params"],
        "seconds": time.time() - t0,
        **extra,
    }


DIAG_KEYS = ("gate", "ffn_cos_mean", "head_cos_mean", "ffn_grad_ratio", "head_grad_ratio")


def diag_series(recs):
    """The growth diagnostics of a run's metrics (growtool.training.diagnostics): per record that has
    them, the step and the means over blocks (the gate: block 0's)."""
    out = []
    for r in recs:
        g = r.get("growth")
        if g:
            out.append(
                {"step": r["step"], **{k: g["blocks"][0]["gate"] if k == "gate" else g.get(k) for k in DIAG_KEYS}}
            )
    return out


# ---- aggregation -------------------------------------------------------------------------------------


def flops_to_reach(curve, target):
    """First FLOPs at which a (flops, val) curve reaches ``target`` (linear interpolation), or None."""
    for (f0, v0), (f1, v1) in zip(curve, curve[1:]):
        if v1 <= target:
            return f0 if v0 <= target else f0 + (f1 - f0) * (v0 - target) / (v0 - v1)
    return None


def _stats(xs):
    return (statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0) if xs else (None, None)


def aggregate(runs, paired_vs=None):
    """Rows per (family, variant); differences paired by seed against carry_srio (1.5x) or multi (2x),
    or against ``paired_vs`` for the 1.5x variants."""
    rows = []
    by = {}
    for r in runs:
        by.setdefault((r["family"], r["variant"]), {})[r["seed"]] = r
    for (family, variant), rs in sorted(by.items(), key=lambda kv: (kv[0][0], _order(kv[0][1]))):
        two_x = _two_x(variant)
        ref = by.get((family, "scratch_2x" if two_x else "scratch"), {})
        ref_name = "multi" if two_x else paired_vs or "carry_srio"
        pair = by.get((family, ref_name), {})
        vals = [r["val"] for r in rs.values()]
        savings, missed = [], 0
        for seed, r in rs.items():
            if seed in ref and not variant.startswith("scratch"):
                f = flops_to_reach(r["curve"], ref[seed]["val"])
                if f is None:
                    missed += 1
                else:
                    savings.append(1.0 - f / ref[seed]["flops"])
        m, sd = _stats(vals)
        sv, ssd = _stats(savings)
        diffs = [r["val"] - pair[s]["val"] for s, r in rs.items() if s in pair]
        dm, dsd = _stats(diffs)
        bumps = [r["bump"] for r in rs.values() if r.get("bump") is not None]
        rows.append(
            {
                "family": family,
                "variant": variant,
                "seeds": len(rs),
                "val_mean": m,
                "val_std": sd,
                "paired_vs": ref_name if variant != ref_name else "",
                "d_val": dm if variant != ref_name and diffs else None,
                "d_val_std": dsd if variant != ref_name and diffs else None,
                "d_signs": "".join("+" if x > 0 else "-" for x in diffs) if variant != ref_name and diffs else "",
                "saving_mean": sv,
                "saving_std": ssd,
                "saving_min": min(savings) if savings else None,
                "saving_max": max(savings) if savings else None,
                "not_reached": missed,
                "bump_mean": statistics.mean(bumps) if bumps else None,
                "tflops": statistics.mean(r["flops"] for r in rs.values()) / 1e12,
                "seconds_mean": statistics.mean(r["seconds"] for r in rs.values()),
            }
        )
    return rows


ORDER = DEFAULT_VARIANTS.split(",")[:-2] + ["reset_opt_srio", "reset_srio", "scratch"]
TWO_X = ["multi", "one_2x", "scratch_2x"]
ORDER += TWO_X


def _order(v):
    return ORDER.index(v) if v in ORDER else len(ORDER)


def plot(runs, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = sorted({r["family"] for r in runs})
    n = len(fams) + bool(P_MULTI)
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4.5), squeeze=False)
    panels = [(f, lambda v: not _two_x(v), ax) for f, ax in zip(fams, axes[0])]
    if P_MULTI:
        panels.append((P_MULTI[0], _two_x, axes[0][-1]))
    for family, keep, ax in panels:
        variants = sorted({r["variant"] for r in runs if r["family"] == family and keep(r["variant"])}, key=_order)
        for v in variants:
            rs = [r for r in runs if r["family"] == family and r["variant"] == v]
            n = min(len(r["curve"]) for r in rs)
            f = [statistics.mean(r["curve"][i][0] for r in rs) / 1e12 for i in range(n)]
            y = [statistics.mean(r["curve"][i][1] for r in rs) for i in range(n)]
            ax.plot(f, y, lw=1.2, label=v, **({"ls": "--", "color": "grey"} if v.startswith("scratch") else {}))
        lo = min((min(c[1] for c in r["curve"]) for r in runs if r["family"] == family), default=0)
        ax.set_ylim(lo - 0.05, lo + 1.0)
        ax.set_xlabel("training TFLOPs (6 x params x tokens, base phase included)")
        ax.set_ylabel("validation loss (nats/byte), mean over seeds")
        ax.set_title(f"{family}: " + ("2x width" if variants and variants[0] in TWO_X else "1.5x width"), fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


P_MULTI: list = []


def main():
    args = parse_args("growth_pays", __doc__.splitlines()[0], options)
    P = dict(QUICK if args.quick else FULL)
    old = json.loads(Path(args.add_to).read_text()) if args.add_to else None
    if old:
        P.update({k: v for k, v in old["settings"].items() if k in FULL})
    for k in FULL:
        if getattr(args, k) is not None:
            P[k] = getattr(args, k)
    families = [f for f in P["families"].split(",") if f]
    for f in [*families, P["multi_family"] or ""]:
        if f and f not in FAMILIES:
            raise SystemExit(f"bench/growth_pays.py: unknown family {f!r} (known: {', '.join(FAMILIES)})")
    if not Path(args.data).is_file():
        raise SystemExit(f"bench/growth_pays.py: {args.data}: no such file")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="growtool-pays-"))
    work.mkdir(parents=True, exist_ok=True)
    P.update(data=str(Path(args.data).resolve()), work=str(work.resolve()))
    variants = (args.variants or DEFAULT_VARIANTS).split(",")
    jobs = [(f, v, s) for s in range(P["seeds"]) for f in families for v in variants]
    if P["multi_family"]:
        P_MULTI.append(P["multi_family"])
        multi = (args.multi_variants or "multi,one_2x,scratch_2x").split(",")
        jobs += [(P["multi_family"], v, s) for s in range(P["seeds"]) for v in multi]
    prior = old["runs"] if old else []
    have = {(r["family"], r["variant"], r["seed"]) for r in prior}
    jobs = [j for j in jobs if j not in have]
    jobs.sort(key=lambda j: -_cost(P, *j))  # longest first: two workers finish together
    print(
        f"growth_pays: d{P['width']} -> d{P['grow_to']} ({', '.join(families)}) and d{P['width']} -> "
        f"d{P['to_2x']} ({P['multi_family'] or 'none'}), {P['layers']} layers, T = {P['tokens']:,} tokens, "
        f"seeds {P['seeds']}, {len(jobs)} runs on {P['jobs']} worker(s)",
        flush=True,
    )
    t_start, runs = time.time(), list(prior)
    ctx = get_context("spawn")
    with ProcessPoolExecutor(max_workers=P["jobs"], mp_context=ctx) as pool:
        pending = {pool.submit(job, P, *j): j for j in jobs}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                j = pending.pop(fut)
                r = fut.result()
                runs.append(r)
                print(
                    f"  [{time.time() - t_start:6.0f} s] {j[0]:>5} {j[1]:>11} seed {j[2]}: val {r['val']:.4f} "
                    f"({r['seconds']:.0f} s)",
                    flush=True,
                )
    wall = time.time() - t_start + (old["wall_seconds"] if old else 0.0)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    rows = aggregate(runs, args.paired_vs)
    d = args.dir
    write_csv(d / "results.csv", rows)
    write_csv(d / "runs.csv", [{k: v for k, v in r.items() if k != "curve"} for r in runs])
    params = {f: {w: _config(P, f, w).n_params() for w in (P["width"], P["grow_to"], P["to_2x"])} for f in families}
    write_json(
        d / "results.json",
        {
            "settings": {**{k: v for k, v in P.items() if k != "work"}, "params": params, "quick": args.quick},
            "machine": [*_as_list(old["machine"] if old else []), machine()],
            "wall_seconds": wall,
            "rows": rows,
            "runs": runs,
        },
    )
    plot(
        runs,
        d / "curves.png",
        f"d{P['width']} -> d{P['grow_to']} / d{P['to_2x']}, T = {P['tokens']:,} tokens, "
        f"{P['seeds']} seed(s), {Path(P['data']).name}",
    )
    print(
        table(
            [{k: v for k, v in r.items() if k not in ("saving_min", "saving_max", "seconds_mean")} for r in rows],
            f"growth that pays ({wall:.0f} s wall)",
        )
    )
    print(f"wrote {d}/results.csv, runs.csv, results.json, curves.png")


def _as_list(m):
    return m if isinstance(m, list) else [m]


def _cost(P, family, variant, seed):
    n = {w: _config(P, family, w).n_params() for w in (P["width"], P["grow_to"], P["to_2x"])}
    d, D, D2 = P["width"], P["grow_to"], P["to_2x"]
    return {
        "scratch": 2 * (n[d] + n[D]),
        "multi": 3 * (n[d] + n[D] + n[D2]),
        "one_2x": 4.5 * (n[d] + n[D2]),
        "scratch_2x": 3 * (n[d] + n[D] + n[D2]),
    }.get(
        variant.split("_")[0]
        if variant.startswith("multi")
        else variant[:6]
        if variant.startswith("one_2x")
        else variant,
        2 * (n[d] + n[D]),
    )


if __name__ == "__main__":
    main()
