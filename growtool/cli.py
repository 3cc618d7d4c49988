"""The command line: a thin click layer over the library. Human-facing output goes to stderr;
stdout carries only what a pipeline consumes (written paths, checkpoint bytes, --json)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from pathlib import Path

import click
import torch
from rich.console import Console
from rich.table import Table

from . import checkpoint, growth, recipes, tokenizer
from .errors import GrowError
from .families import ARCHS

err = Console(stderr=True)
DTYPE_OPT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@contextlib.contextmanager
def one_thread():
    """Run tensor surgery on one torch thread (restored after). The work is memory-bound, and on a
    busy machine OpenMP threads stall each other: bench/surgery.py measured the grow step of a
    120 MB checkpoint at 0.9 s on one thread against 11 s on two, on 2 shared cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def clean_errors(fn):
    """Bad input -> one line on stderr and exit 2 (GROWTOOL_DEBUG=1 shows tracebacks)."""
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except GrowError as e:
            click.echo(f"growtool: error: {e}", err=True)
            sys.exit(2)
        except (KeyboardInterrupt, click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Exception as e:
            if os.environ.get("GROWTOOL_DEBUG"):
                raise
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            click.echo(f"growtool: error: {msg}", err=True)
            sys.exit(2)
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="growtool")
def main():
    """Offline width growth of transformer checkpoints (SRIO, exact at gate 0)."""


# ---- init ---------------------------------------------------------------------------------

@main.command()
@click.option("--family", type=click.Choice(list(ARCHS)), required=True, help="architecture")
@click.option("--width", type=int, required=True)
@click.option("--layers", type=int, required=True)
@click.option("--heads", type=int, required=True)
@click.option("--kv-heads", type=int, default=None, help="llama: key/value heads (GQA); default = heads")
@click.option("--ffn", type=int, default=None, help="FFN width; default 4 x width")
@click.option("--vocab", type=int, default=256, show_default=True, help="256 = the byte tokenizer")
@click.option("--context", type=int, default=256, show_default=True)
@click.option("--gamma", type=float, default=1.0, show_default=True, help="sigma = fan_in^-gamma")
@click.option("--embed-gamma", type=float, default=None, help="embedding sigma = width^-embed_gamma (default gamma)")
@click.option("--norm-eps", type=float, default=1e-12, show_default=True)
@click.option("--attn-gate/--no-attn-gate", default=True, show_default=True, help="gated attention")
@click.option("--tie/--no-tie", default=True, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("-o", "--out", required=True, help=".safetensors file, HF folder, or -")
@click.option("--force", is_flag=True, help="replace an existing output")
@clean_errors
def init(family, width, layers, heads, kv_heads, ffn, vocab, context, gamma, embed_gamma, norm_eps,
         attn_gate, tie, seed, out, force):
    """Create a new model with gamma-initialisation."""
    from .config import ModelConfig
    from .init import init_model
    if width % heads:
        raise GrowError(f"heads {heads} do not divide width {width}")
    cfg = ModelConfig(family=family, vocab_size=vocab, width=width, layers=layers, heads=heads,
                      kv_heads=kv_heads or heads, head_dim=width // heads, ffn=ffn or 4 * width,
                      context=context, norm_eps=norm_eps, tie=tie, attn_gate=attn_gate)
    if not gamma > 0:
        raise GrowError(f"--gamma must be positive, got {gamma}")
    model = init_model(cfg, gamma=gamma, embed_gamma=embed_gamma, seed=seed)
    lineage = [{"op": "init", "gamma": gamma, "embed_gamma": embed_gamma if embed_gamma is not None else gamma,
                "seed": seed, "width": width}]
    path = checkpoint.save_tensors(out, cfg, lineage, model.tensors(), force=force)
    err.print(f"initialised {family} width {width}, {layers} layers, {cfg.n_params():,} parameters (gamma {gamma})")
    if path != "-":
        click.echo(path)


# ---- expand -------------------------------------------------------------------------------

def default_out(src: str, width: int, folder: bool = False) -> str:
    """Next to the input, named after it and the width (a folder for a folder input or when sharding)."""
    if src == "-":
        return "-"
    p = Path(src.rstrip("/"))
    if p.is_dir():
        return str(p.with_name(f"{p.name}-d{width}"))
    return str(p.with_name(f"{p.stem}-d{width}" + ("" if folder else ".safetensors")))


def plan_table(plan) -> Table:
    t = Table(title=f"growth plan: {plan.src.family} d{plan.src.width} -> d{plan.cfg.width} "
                    f"(recipe {plan.recipe['name']}, eps {plan.eps:.4f})", title_justify="left",
              caption=f"residual map: {plan.residual_map}", caption_justify="left")
    for c in ("tensor", "from", "to", "operation"):
        t.add_column(c)
    for row in plan.rows():
        t.add_row(*row)
    return t


@main.command()
@click.argument("ckpt")
@click.option("--width", type=int, required=True, help="new residual width D")
@click.option("--ffn", type=int, default=None, help="new FFN width (default scales with width)")
@click.option("--heads", type=int, default=None, help="new query heads (default scales with width)")
@click.option("--recipe", default="srio", show_default=True, help="shipped name or YAML file")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a recipe field")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("-o", "--out", default=None, help="output (.safetensors, folder, or -)")
@click.option("--allow-lossy", is_flag=True, help="grow even if the function is not kept")
@click.option("--dtype", type=click.Choice(list(DTYPE_OPT)), default=None, help="output dtype (default: input's)")
@click.option("--shard-size", default=None, metavar="SIZE", help="write an HF folder of shards of at most SIZE (500MB, 2GB, bytes)")
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--tokenizer", "tokenizer_path", default=None, metavar="PATH",
              help="attach this tokenizer (a tokenizer.json, or a folder of tokenizer files) instead of the input's own")
@click.option("--quiet", "-q", is_flag=True, help="no plan table")
@clean_errors
def expand(ckpt, width, ffn, heads, recipe, sets, seed, out, allow_lossy, dtype, shard_size, force, quiet,
           tokenizer_path):
    """Grow CKPT to --width; prints the written path on stdout."""
    shard_size = checkpoint.parse_size(shard_size) if shard_size is not None else None
    r = recipes.load(recipe, recipes.parse_set(sets))
    out = out or default_out(ckpt, width, folder=shard_size is not None)
    checkpoint.check_destination(out, [ckpt], force)  # fail before any work
    ck = checkpoint.load(ckpt)
    carry = tokenizer.carry(ck, tokenizer_path)  # tokenizer files and record travel with the output
    dt = DTYPE_OPT[dtype] if dtype else ck.main_dtype()
    try:
        plan = growth.build_plan(ck.config, r, width, ffn, heads, seed=seed, allow_lossy=allow_lossy,
                                 dtype=dt, gate_values=growth.gate_values(ck))
    except GrowError as e:
        raise GrowError(f"{ckpt}: {e}") from None
    if not quiet:
        err.print(plan_table(plan))
    for reason in plan.lossy:
        err.print(f"[yellow]lossy:[/] {reason}")
    for w in plan.warnings:
        err.print(f"[yellow]warning:[/] {w}")
    lineage = ck.lineage + [growth.lineage_entry(plan, ck.sha256())]
    with one_thread():
        path = checkpoint.save(out, plan.cfg, lineage, plan.outputs(), lambda n: growth.grow_tensor(n, plan, ck.get),
                               force=force, inputs=[ckpt], shard_size=shard_size, tokenizer=carry.record,
                               files=carry.files(plan.cfg, lineage, ckpt, Path(out).name))
    if carry.note:
        err.print(f"[yellow]warning:[/] {carry.note}", soft_wrap=True)
    if plan.lossy:
        from .verify import compare, random_batches
        from .model import LM
        src = ck.model()
        grown = LM.from_tensors(plan.cfg, {n: growth.grow_tensor(n, plan, ck.get) for n, _, _ in plan.outputs()})
        c = compare(src, grown, random_batches(ck.config.vocab_size, ck.config.context, 4, seed), alpha=0.0)
        err.print(f"measured loss of function at gate 0: max |dlogit| {c.max_dlogit:.3g} "
                  f"({c.rel:.2%} of the logit scale), mean KL {c.kl:.3g}")
    err.print(f"grew {ck.config.family} d{ck.config.width} -> d{plan.cfg.width}: "
              f"{ck.config.n_params():,} -> {plan.cfg.n_params():,} parameters")
    if path != "-":
        click.echo(path)


# ---- verify -------------------------------------------------------------------------------

@main.command()
@click.argument("source")
@click.argument("grown")
@click.option("--alpha", type=float, default=0.0, show_default=True, help="gate value to check")
@click.option("--samples", type=int, default=16, show_default=True, help="random sequences")
@click.option("--data", type=click.Path(), default=None, help="also check on this text file (byte tokens)")
@click.option("--tol", type=float, default=1e-4, show_default=True, help="max |dlogit| / logit scale")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON on stdout")
@click.option("--generate", "gen_tokens", type=int, default=None, metavar="N",
              help="also check that greedy N-token continuations are identical")
@click.option("--prompt", "prompts", multiple=True, metavar="TEXT",
              help="prompt for --generate (repeatable; default: from --data, else random ids)")
@clean_errors
def verify(source, grown, alpha, samples, data, tol, seed, as_json, gen_tokens, prompts):
    """Check that GROWN computes SOURCE's function at gate --alpha (exit 1 if not)."""
    from .verify import compare, random_batches, text_batches
    if source == "-" and grown == "-":
        raise GrowError("only one of SOURCE and GROWN can be standard input")
    if gen_tokens is not None and gen_tokens < 1:
        raise GrowError(f"--generate must be positive, got {gen_tokens}")
    if prompts and gen_tokens is None:
        raise GrowError("--prompt is for --generate N (greedy continuations); add --generate")
    a, b = checkpoint.load(source), checkpoint.load(grown)
    if a.config.vocab_size != b.config.vocab_size:
        raise GrowError(f"vocab sizes differ: {source} has {a.config.vocab_size}, {grown} has {b.config.vocab_size}")
    if a.config.family != b.config.family:
        raise GrowError(f"families differ: {a.config.family} vs {b.config.family}")
    ma, mb = a.model(), b.model()
    ctx = min(a.config.context, b.config.context)
    sets = {"random": random_batches(a.config.vocab_size, ctx, samples, seed)}
    if data:
        if not Path(data).is_file():
            raise GrowError(f"{data}: no such file")
        sets["text"] = text_batches(data, a.config.vocab_size, ctx, samples)
    rows = []
    for label, batches in sets.items():
        rows.append((label, compare(ma, mb, batches, alpha)))
        if alpha != 1.0 and b.config.gated:
            rows.append((label + " (info)", compare(ma, mb, batches, 1.0)))
    ok = all(c.rel <= tol for label, c in rows if "(info)" not in label)
    gen = None
    if gen_tokens is not None:
        from .sample import compare_generations, verify_prompts
        gen = compare_generations(ma, mb, verify_prompts(a, prompts, data, samples, seed), gen_tokens, alpha)
    passed = ok and (gen is None or gen.ok)
    if as_json:
        click.echo(json.dumps({"pass": passed, "tol": tol, "results": [{"inputs": l, **c.as_dict()} for l, c in rows],
                               **({"generate": gen.as_dict()} if gen else {})}))
    t = Table(title=f"verify {grown} against {source}", title_justify="left")
    for c in ("inputs", "gate", "max |dlogit|", "logit scale", "rel", "mean KL", "top-1 agree"):
        t.add_column(c, justify="right")
    for label, c in rows:
        t.add_row(label, f"{c.alpha:g}", f"{c.max_dlogit:.3g}", f"{c.logit_scale:.3g}", f"{c.rel:.3g}",
                  f"{c.kl:.3g}", f"{c.top1:.4f}")
    err.print(t)
    if gen is not None:
        where = "" if gen.ok else f"; first difference: prompt {gen.first_divergence[0]}, token {gen.first_divergence[1]}"
        err.print(f"greedy continuations at gate {alpha:g}: {gen.identical}/{gen.prompts} identical "
                  f"over {gen.tokens} tokens{where}")
    err.print(("[green]PASS[/]" if ok else "[red]FAIL[/]") + f": max |dlogit| within {tol:g} x logit scale at gate {alpha:g}"
              if ok else f"[red]FAIL[/]: max |dlogit| exceeds {tol:g} x logit scale at gate {alpha:g}")
    if gen is not None and not gen.ok:
        err.print(f"[red]FAIL[/]: greedy continuations differ at gate {alpha:g}")
    sys.exit(0 if passed else 1)


# ---- fold ---------------------------------------------------------------------------------

@main.command()
@click.argument("grown")
@click.option("--alpha", type=float, required=True, help="gate value to bake in (0 = lossless, 1 = plain model)")
@click.option("-o", "--out", required=True, help="output (.safetensors, folder, or -)")
@click.option("--dtype", type=click.Choice(list(DTYPE_OPT)), default=None)
@click.option("--shard-size", default=None, metavar="SIZE", help="write an HF folder of shards of at most SIZE (500MB, 2GB, bytes)")
@click.option("--force", is_flag=True)
@click.option("--tokenizer", "tokenizer_path", default=None, metavar="PATH",
              help="attach this tokenizer (a tokenizer.json, or a folder of tokenizer files) instead of the input's own")
@clean_errors
def fold(grown, alpha, out, dtype, shard_size, force, tokenizer_path):
    """Bake the growth gates away: a plain, gate-free checkpoint."""
    if not 0.0 <= alpha <= 1.0:
        raise GrowError(f"--alpha must be in [0, 1], got {alpha}")
    shard_size = checkpoint.parse_size(shard_size) if shard_size is not None else None
    checkpoint.check_destination(out, [grown], force)  # fail before any work
    ck = checkpoint.load(grown)
    carry = tokenizer.carry(ck, tokenizer_path)
    dt = DTYPE_OPT[dtype] if dtype else ck.main_dtype()
    cfg = growth.fold_config(ck.config)
    specs = [(n, shp, dt) for n, shp in checkpoint.expected_shapes(cfg).items()]
    lineage = ck.lineage + [{"op": "fold", "alpha": alpha, "source_sha256": ck.sha256()}]
    with one_thread():
        path = checkpoint.save(out, cfg, lineage, specs,
                               lambda n: growth.fold_tensor(n, ck.config, alpha, ck.get, dt), force=force,
                               inputs=[grown], shard_size=shard_size, tokenizer=carry.record,
                               files=carry.files(cfg, lineage, grown, Path(out).name))
    if carry.note:
        err.print(f"[yellow]warning:[/] {carry.note}", soft_wrap=True)
    err.print(f"folded gates at alpha {alpha:g}" + ("" if ck.config.gated else " (the model had no gates)"))
    if path != "-":
        click.echo(path)


# ---- inspect ------------------------------------------------------------------------------

@main.command()
@click.argument("ckpt")
@click.option("--metrics", is_flag=True, help="stable rank and row cosine of every matrix")
@click.option("--json", "as_json", is_flag=True)
@clean_errors
def inspect(ckpt, metrics, as_json):
    """Family, shapes, parameters, dtype, gate state and lineage of a checkpoint."""
    ck = checkpoint.load(ckpt)
    cfg = ck.config
    gates = growth.gate_values(ck)
    info = {
        "path": ckpt, "family": cfg.family, "width": cfg.width, "layers": cfg.layers, "heads": cfg.heads,
        "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "ffn": cfg.ffn, "vocab": cfg.vocab_size,
        "context": cfg.context, "norm_eps": cfg.norm_eps, "tied": cfg.tie, "attn_gate": cfg.attn_gate,
        "parameters": cfg.n_params(), "dtype": str(ck.main_dtype()).replace("torch.", ""),
        "gated": cfg.gated, "base_heads": cfg.base_heads, "base_ffn": cfg.base_ffn, "gates": gates,
        "lineage": ck.lineage, "tokenizer": ck.tokenizer, "tensors": {n: list(ck.shape(n)) for n in ck.names()},
    }
    if metrics:
        from .metrics import matrix_metrics
        info["metrics"] = matrix_metrics(cfg, {n: ck.get(n) for n in ck.names()})
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    t = Table(title=f"{ckpt}", title_justify="left", show_header=False)
    for k in ("family", "width", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context",
              "norm_eps", "tied", "attn_gate", "parameters", "dtype"):
        t.add_row(k, f"{info[k]:,}" if k == "parameters" else str(info[k]))
    t.add_row("gates", "none (plain model)" if not cfg.gated else
              f"{len(gates)} x {sorted(set(gates))}; ungated units: {cfg.base_heads}/{cfg.heads} heads, {cfg.base_ffn}/{cfg.ffn} ffn")
    for i, st in enumerate(ck.lineage):
        desc = ", ".join(f"{k}={v}" for k, v in st.items() if k not in ("recipe_full", "source_sha256"))
        if st.get("source_sha256"):
            desc += f", source {st['source_sha256'][:12]}"
        t.add_row(f"lineage {i}", desc)
    if ck.tokenizer:
        t.add_row("tokenizer", f"{', '.join(sorted(ck.tokenizer.get('files', {})))} from {ck.tokenizer.get('from')}")
    err.print(t)
    if metrics:
        m = Table(title="condensation metrics", title_justify="left")
        for c in ("matrix", "stable rank", "row cosine"):
            m.add_column(c)
        for n, v in info["metrics"].items():
            m.add_row(n, f"{v['stable_rank']:.2f}", f"{v['row_cosine']:.3f}")
        err.print(m)


# ---- sample -------------------------------------------------------------------------------

@main.command()
@click.argument("ckpt")
@click.option("--prompt", required=True, help="text to continue")
@click.option("--max-tokens", type=int, default=64, show_default=True, help="tokens to generate (fewer if EOS comes)")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy; above 0, sample")
@click.option("--top-k", type=int, default=None, help="sample among the K most likely tokens")
@click.option("--seed", type=int, default=0, show_default=True, help="sampling seed (same seed, same text)")
@click.option("--alpha", type=float, default=None, help="grown checkpoints: growth-gate value (default: the stored gates)")
@click.option("--tokenizer", "tokenizer_spec", default=None, metavar="byte|PATH", help="default: the checkpoint's own")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@clean_errors
def sample(ckpt, prompt, max_tokens, temperature, top_k, seed, alpha, tokenizer_spec, device):
    """Continue --prompt with CKPT and its own tokenizer; prints the continuation on stdout."""
    import time
    from .data import tokenizer_for
    from .sample import check_options, eos_id, generate
    from .train import pick_device
    check_options(max_tokens, temperature, top_k)
    ck = checkpoint.load(ckpt)
    if alpha is not None and not ck.config.gated:
        raise GrowError(f"--alpha: {ckpt} has no growth gates (a plain model; drop --alpha)")
    if alpha is not None and not 0.0 <= alpha <= 1.0:
        raise GrowError(f"--alpha must be in [0, 1], got {alpha}")
    tok = tokenizer_for(ck, tokenizer_spec)
    ids = tok.encode_prompt(prompt)
    if not ids:
        raise GrowError("--prompt encodes to no tokens (give some text)")
    model = ck.model().to(pick_device(device, 0))
    t0 = time.time()
    out = generate(model, torch.tensor([ids]), max_tokens, temperature=temperature, top_k=top_k, seed=seed,
                   alpha=alpha, eos=eos_id(ck.config))[0].tolist()
    click.echo(tok.decode(out))
    how = "greedy" if temperature <= 0 else f"temperature {temperature:g}" + (f", top-k {top_k}" if top_k else "") + f", seed {seed}"
    which = "the byte tokenizer" if tok.hf is None else f"the tokenizer from {tok.name}"
    err.print(f"{len(out)} tokens ({how}) in {time.time() - t0:.2f} s, {which}", soft_wrap=True)


# ---- train --------------------------------------------------------------------------------

@main.command()
@click.argument("ckpt")
@click.option("--data", "data_files", multiple=True, required=True, metavar="FILE", help="text file(s); repeatable")
@click.option("--tokenizer", default=None, metavar="byte|PATH",
              help="default: the checkpoint's own (its folder's or the recorded one), byte for a 256-id vocabulary")
@click.option("--tokens", type=int, default=None, help="tokens to train on (default: one pass over the data)")
@click.option("--steps", type=int, default=None, help="optimizer steps (instead of --tokens)")
@click.option("--batch", type=int, default=16, show_default=True, help="global batch (sequences per step)")
@click.option("--seq", type=int, default=None, help="sequence length (default min(context, 128))")
@click.option("--lr", type=float, default=3e-3, show_default=True, help="peak learning rate")
@click.option("--min-lr-ratio", type=float, default=0.1, show_default=True, help="final lr / peak lr")
@click.option("--warmup", type=int, default=None, help="lr warm-up steps (default 5% of the steps)")
@click.option("--weight-decay", type=float, default=0.1, show_default=True)
@click.option("--clip", type=float, default=1.0, show_default=True, help="gradient-norm clip")
@click.option("--gate-warmup-tokens", type=int, default=None, help="grown models: gate ramp 0->1 (default 10% of the run)")
@click.option("--eval-every", type=int, default=None, help="steps between validations (default 5% of the run)")
@click.option("--eval-batches", type=int, default=8, show_default=True, help="validation batches")
@click.option("--save-every", type=int, default=None, help="steps between resumable checkpoints (default 10%)")
@click.option("--metrics-every", type=int, default=None, help="steps between condensation metrics (default 10%)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--compile", "compile_", is_flag=True, help="torch.compile the model")
@click.option("--deterministic", is_flag=True, help="deterministic kernels (CUDA runs then repeat and resume bitwise)")
@click.option("--out", required=True, help="run folder (checkpoints, metrics.jsonl, loss.png)")
@click.option("--resume", is_flag=True, help="continue the run in --out exactly where it stopped")
@click.option("--stop-at", type=int, default=None, help="end this invocation after this step (resumable)")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
@clean_errors
def train(ckpt, data_files, tokenizer, tokens, steps, batch, seq, lr, min_lr_ratio, warmup, weight_decay, clip,
          gate_warmup_tokens, eval_every, eval_batches, save_every, metrics_every, seed, device, compile_,
          deterministic, out, resume, stop_at, quiet):
    """Train CKPT on text; prints the final (plain) checkpoint's path on stdout."""
    from .train import train as run
    r = run(ckpt, list(data_files), out, tokens=tokens, steps=steps, batch=batch, seq=seq, lr=lr,
            min_lr_ratio=min_lr_ratio, warmup=warmup, weight_decay=weight_decay, clip=clip,
            gate_warmup_tokens=gate_warmup_tokens, eval_every=eval_every, eval_batches=eval_batches,
            save_every=save_every, metrics_every=metrics_every, seed=seed, device=device, compile=compile_,
            resume=resume, tokenizer=tokenizer, progress=not quiet, stop_at=stop_at, deterministic=deterministic)
    if os.environ.get("RANK", "0") != "0":
        return
    err.print(f"trained {r['steps']}/{r['total_steps']} steps ({r['tokens']:,} tokens) in {r['seconds']:.1f} s: "
              f"val loss {r['first_val_loss']:.4f} -> {r['val_loss']:.4f}", soft_wrap=True)
    if r["final"]:
        g = r["gate"]
        err.print(f"final checkpoint ({r['params']:,} parameters" +
                  (f", growth gates folded at {g:g}" if g is not None else "") + f"): {r['final']}", soft_wrap=True)
        click.echo(r["final"])
    else:
        err.print(f"stopped at step {r['steps']}: resume with the same command and --resume", soft_wrap=True)


# ---- demo ---------------------------------------------------------------------------------

@main.command()
@click.option("--out", default="growtool-demo", show_default=True, help="folder for every stage's files (must not exist)")
@click.option("--quick", is_flag=True, help="tiny models and short runs (well under a minute)")
@clean_errors
def demo(out, quick):
    """init -> train -> expand -> verify -> train -> expand -> verify -> train, on a generated corpus."""
    from .demo import run_demo
    ok = run_demo(out, quick=quick)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
