"""The command line: a thin click layer over the library. Human-facing output goes to stderr;
stdout carries only what a pipeline consumes (written paths, checkpoint bytes, --json). Each command
imports the library (torch with it) in its body: help, the version and usage errors answer without torch."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time

import click
from rich.console import Console

from growtool.console import (  # the frame of the command line
    DEPTH_OPTIONS,
    SEED,
    Bar,
    Growtool,
    Ratio,
    SizeOrRatio,
    bounded,
    resolve_ratio,
    set_debug,
    settings_options,
    size_or_ratio,
)
from growtool.io.files import parse_size
from growtool.nn.errors import GrowError
from growtool.nn.families import ARCHS, arch_of

err = Console(stderr=True)
DTYPES = ("float32", "float16", "bfloat16")  # surgery.DTYPES' names (the library takes them as they are)


@click.group(cls=Growtool, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="growtool")
@click.option(
    "--debug",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=set_debug,
    help="show tracebacks (also GROWTOOL_DEBUG=1)",
)
def main():
    """Offline width growth of transformer checkpoints (SRIO, exact at gate 0).

    Exit codes: 0 ok, 1 a check failed (verify), 2 bad input or usage, 3 internal error,
    130 / 143 interrupted. Shell completion: eval "$(_GROWTOOL_COMPLETE=bash_source growtool)".
    """


def run() -> None:
    """The ``growtool`` program (``main`` is the click group, which tests call in-process).

    A finished ``expand`` / ``fold`` / ``train`` ends the process as soon as its messages are
    flushed, without the interpreter's teardown: its outputs are renamed into place and closed by
    then, and the operating system frees the memory anyway. Freeing torch's operator registry and
    every module took 0.1 s of a 2 s expand on a 2-core machine (bench/README, section 3); and a
    torchrun rank once aborted ("terminate called without an active exception") after its work,
    at the point where gloo's leftover work objects are freed (pytorch/pytorch#179291)."""
    try:
        main()
    except SystemExit as e:
        if e.code in (0, None) and Growtool.done:
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
        raise


# options that expand and fold share
SHARD_SIZE = click.option(
    "--shard-size",
    default=None,
    metavar="SIZE",
    help="write an HF folder of shards of at most SIZE (500MB, 2GB, bytes)",
)
ATTACH_TOKENIZER = click.option(
    "--tokenizer",
    "tokenizer_path",
    default=None,
    metavar="PATH",
    help="attach this tokenizer (a tokenizer.json, or a folder of tokenizer files), not the input's own",
)


# ---- init ---------------------------------------------------------------------------------


@main.command()
@click.option("--family", type=click.Choice(list(ARCHS)), required=True, help="architecture")
@click.option("--width", type=int, required=True, callback=bounded(1))
@click.option("--layers", type=int, required=True, callback=bounded(1))
@click.option("--heads", type=int, required=True, callback=bounded(1))
@click.option(
    "--kv-heads", type=int, default=None, callback=bounded(1), help="llama: key/value heads (GQA); default = heads"
)
@click.option("--ffn", type=int, default=None, callback=bounded(1), help="FFN width; default 4 x width")
@click.option("--vocab", type=int, default=256, show_default=True, callback=bounded(1), help="256 = the byte tokenizer")
@click.option("--context", type=int, default=256, show_default=True, callback=bounded(1))
@click.option(
    "--gamma",
    type=float,
    default=0.5,
    show_default=True,
    callback=bounded(0, low_open=True),
    help="sigma = fan_in^-gamma (0.5: measured best here; 1: the small-init paper's)",
)
@click.option(
    "--embed-gamma",
    type=float,
    default=None,
    callback=bounded(0, low_open=True),
    help="embedding sigma = width^-embed_gamma (default gamma)",
)
@click.option("--norm-eps", type=float, default=1e-12, show_default=True, callback=bounded(0, low_open=True))
@click.option("--attn-gate/--no-attn-gate", default=True, show_default=True, help="gated attention")
@click.option("--tie/--no-tie", default=True, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, callback=SEED)
@click.option("-o", "--out", required=True, help=".safetensors file, HF folder, or -")
@click.option("--force", is_flag=True, help="replace an existing output")
def init(
    family,
    width,
    layers,
    heads,
    kv_heads,
    ffn,
    vocab,
    context,
    gamma,
    embed_gamma,
    norm_eps,
    attn_gate,
    tie,
    seed,
    out,
    force,
):
    """Create a new model with gamma-initialisation."""
    from growtool.init import init_model
    from growtool.io import checkpoint
    from growtool.nn.config import ModelConfig

    if width % heads:
        raise GrowError(f"heads {heads} do not divide width {width}")
    cfg = ModelConfig(
        family=family,
        vocab_size=vocab,
        width=width,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads or heads,
        head_dim=width // heads,
        ffn=ffn or 4 * width,
        context=context,
        norm_eps=norm_eps,
        tie=tie,
        attn_gate=attn_gate,
    )
    model = init_model(cfg, gamma=gamma, embed_gamma=embed_gamma, seed=seed)
    lineage = [
        {
            "op": "init",
            "gamma": gamma,
            "embed_gamma": embed_gamma if embed_gamma is not None else gamma,
            "seed": seed,
            "width": width,
        }
    ]
    path = checkpoint.save_tensors(out, cfg, lineage, model.tensors(), force=force)
    err.print(f"initialised {family} width {width}, {layers} layers, {cfg.n_params():,} parameters (gamma {gamma})")
    if path != "-":
        click.echo(path)


# ---- expand -------------------------------------------------------------------------------


@main.command()
@click.argument("ckpt")
@click.option(
    "--width",
    type=SizeOrRatio(),
    default=None,
    callback=size_or_ratio,
    help="new residual width D, or a multiple of the source's (1.5x)",
)
@click.option("--ffn", type=int, default=None, callback=bounded(1), help="new FFN width (default scales with width)")
@click.option(
    "--heads", type=int, default=None, callback=bounded(1), help="new query heads (default scales with width)"
)
@DEPTH_OPTIONS
@click.option("--recipe", default="srio", show_default=True, help="shipped name or YAML file")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a recipe field")
@click.option("--seed", type=int, default=0, show_default=True, callback=SEED)
@click.option("-o", "--out", default=None, help="output (.safetensors, folder, or -)")
@click.option("--allow-lossy", is_flag=True, help="grow even if the function is not kept")
@click.option("--untie", is_flag=True, help="a tied head becomes a tensor of its own (+vocab x width parameters)")
@click.option("--dtype", type=click.Choice(DTYPES), default=None, help="output dtype (default: input's)")
@SHARD_SIZE
@click.option("--force", is_flag=True, help="replace an existing output")
@click.option("--dry-run", is_flag=True, help="show the plan and whether it is exact; read no tensors, write nothing")
@click.option("--plan-json", "plan_json_", is_flag=True, help="print the plan as JSON on stdout (before the path)")
@ATTACH_TOKENIZER
@click.option("--quiet", "-q", is_flag=True, help="no plan table, no progress bar")
def expand(
    ckpt,
    width,
    ffn,
    heads,
    layers,
    depth_method,
    insert_at,
    recipe,
    sets,
    seed,
    out,
    allow_lossy,
    untie,
    dtype,
    shard_size,
    force,
    dry_run,
    plan_json_,
    quiet,
    tokenizer_path,
):
    """Grow CKPT to --width and / or --layers; prints the written path on stdout.

    CKPT may be a training run folder (holding last.safetensors + last.pt): then the output is a new
    run folder whose model and AdamW moments are grown, to continue with ``growtool train --resume``."""
    from growtool import surgery, views
    from growtool.grow import recipes

    shard_size = parse_size(shard_size) if shard_size is not None else None
    width, layers = ratios_resolved(ckpt, width, layers)
    r = recipes.load(recipe, recipes.parse_set(sets))
    surgery.depth_args(width, layers, depth_method, insert_at)  # neither --width nor --layers: refused here
    request = surgery.Request(
        width=width,
        out=out,
        recipe=r,
        ffn=ffn,
        heads=heads,
        layers=layers,
        depth_method=depth_method,
        insert_at=insert_at,
        seed=seed,
        allow_lossy=allow_lossy,
        dtype=dtype,
        shard_size=shard_size,
        force=force,
        tokenizer_path=tokenizer_path,
        untie=untie,
    )
    if surgery.is_run_folder(ckpt):
        if shard_size is not None or dry_run or plan_json_ or dtype or tokenizer_path or untie:
            raise GrowError(
                f"{ckpt}: a run folder grows into a run folder: --shard-size, --dry-run, --plan-json, --dtype, "
                "--untie and --tokenizer do not apply"
            )
        grew = surgery.grow_run_folder(ckpt, request)
        views.show_plan(err, grew.plan, quiet)
        err.print(views.grew_run_line(ckpt, grew.step, grew.plan, out), soft_wrap=True)
        click.echo(out)
        return
    if plan_json_ and out == "-" and not dry_run:
        raise GrowError("--plan-json and -o - both want standard output: give -o a path, or add --dry-run")
    job = surgery.prepare_expand(ckpt, request)
    plan, out = job.plan, job.out
    views.show_plan(err, plan, quiet)
    if job.untied and not quiet:
        head = arch_of(job.ck.config).modules["head"] + ".weight"
        err.print(f"untied (--untie): the tied embedding is also written as {head}, a head of its own", soft_wrap=True)
    if plan_json_:
        click.echo(json.dumps(views.plan_json(plan, None if dry_run else out)))
    if dry_run:
        views.show_dry_run(err, plan, out, quiet)
        return
    surgery.run_expand(job, progress=functools.partial(Bar, "expand", quiet=quiet))
    views.show_expanded(err, job)
    if job.path != "-":
        click.echo(job.path)
    Growtool.done = True


def ratios_resolved(ckpt, width, layers):
    """``--width 1.5x`` / ``--layers 2x``: the sizes they come to, from the source's header."""
    from growtool import info
    from growtool.io import checkpoint

    if not isinstance(width, Ratio) and not isinstance(layers, Ratio):
        return width, layers
    if ckpt == "-":
        raise GrowError(
            "--width / --layers as a ratio need the source's size: give numbers when reading standard input"
        )
    cfg = checkpoint.load(info.run_state(ckpt) or ckpt).config  # the header alone
    return resolve_ratio("--width", width, cfg.width), resolve_ratio("--layers", layers, cfg.layers)


# ---- verify -------------------------------------------------------------------------------


REFERENCE = "transformers: also compare both with transformers' own forward of SOURCE (a Hugging Face folder)"


@main.command()
@click.argument("source")
@click.argument("grown")
@click.option("--alpha", type=float, default=0.0, show_default=True, callback=bounded(0, 1), help="gate value to check")
@click.option("--samples", type=int, default=16, show_default=True, callback=bounded(1), help="random sequences")
@click.option("--data", type=click.Path(), default=None, help="also check on this text file (byte tokens)")
@click.option(
    "--tol", type=float, default=1e-4, show_default=True, callback=bounded(0), help="max |dlogit| / logit scale"
)
@click.option("--seed", type=int, default=0, show_default=True, callback=SEED)
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON on stdout")
@click.option("--quiet", "-q", is_flag=True, help="no table, no progress bar (the verdict line stays)")
@click.option(
    "--generate",
    "gen_tokens",
    type=int,
    default=None,
    metavar="N",
    callback=bounded(1),
    help="also check that greedy N-token continuations are identical",
)
@click.option(
    "--prompt",
    "prompts",
    multiple=True,
    metavar="TEXT",
    help="prompt for --generate (repeatable; default: from --data, else random ids)",
)
@click.option(
    "--expect-equal",
    is_flag=True,
    help="at --alpha above 0: FAIL unless equal (e.g. against a model folded at that gate); else informational",
)
@click.option("--reference", type=click.Choice(["growtool", "transformers"]), default="growtool", help=REFERENCE)
def verify(
    source, grown, alpha, samples, data, tol, seed, as_json, quiet, gen_tokens, prompts, expect_equal, reference
):
    """Check that GROWN computes SOURCE's function at gate --alpha (exit 1 if not).

    Both checkpoints are read one block at a time (bounded memory). For bf16/fp16 checkpoints the
    limit is max(--tol, floor), the floor being the source's own error from running in that dtype;
    for float32 ones max(--tol, 4 x floor), the floor being the source's float32 round-off (against float64).
    At --alpha above 0 a grown model is meant to differ from its source: the figures are shown for
    information and the exit is 0, unless --expect-equal."""
    from growtool import check, views

    if source == "-" and grown == "-":
        raise GrowError("only one of SOURCE and GROWN can be standard input")
    if prompts and gen_tokens is None:
        raise GrowError("--prompt is for --generate N (greedy continuations); add --generate")
    rep = check.verify(
        source,
        grown,
        alpha=alpha,
        samples=samples,
        data=data,
        tol=tol,
        seed=seed,
        generate=gen_tokens,
        prompts=prompts,
        progress=functools.partial(Bar, "verify", quiet=quiet),
        reference=reference,
    )
    rows, gen, fl, limit, ok = rep.rows, rep.generate, rep.floor, rep.limit, rep.logits_ok
    if as_json:
        click.echo(json.dumps(rep.as_dict()))
    t = views.verify_table(rows, source, grown)
    if not quiet:
        err.print(t)
    if gen is not None:
        where = "" if gen.ok else "; first difference: prompt {}, token {}".format(*gen.first_divergence)
        err.print(
            f"greedy continuations at gate {alpha:g}: {gen.identical}/{gen.prompts} identical "
            f"over {gen.tokens} tokens{where}"
        )
    if rep.floor_dtype is not None:
        err.print(check.floor_note(rep.floor_dtype, fl, limit), soft_wrap=True)
    if alpha != 0 and not expect_equal and not rep.passed:
        err.print(
            f"INFO: at gate {alpha:g} a grown model is meant to differ from its source (the gates open its new "
            "units): these figures are informational, exit 0; --expect-equal makes them a check "
            "(e.g. against a model folded at this gate)",
            soft_wrap=True,
        )
        sys.exit(0)
    err.print(
        f"[green]PASS[/]: max |dlogit| within {limit:g} x logit scale at gate {alpha:g}"
        if ok
        else f"[red]FAIL[/]: max |dlogit| exceeds {limit:g} x logit scale at gate {alpha:g}"
    )
    if gen is not None and not gen.ok:
        err.print(f"[red]FAIL[/]: greedy continuations differ at gate {alpha:g}")
    sys.exit(0 if rep.passed else 1)


# ---- fold ---------------------------------------------------------------------------------


@main.command()
@click.argument("grown")
@click.option(
    "--alpha",
    type=float,
    required=True,
    callback=bounded(0, 1),
    help="gate value to bake in (0 = lossless, 1 = plain model)",
)
@click.option("-o", "--out", required=True, help="output (.safetensors, folder, or -)")
@click.option("--dtype", type=click.Choice(DTYPES), default=None)
@SHARD_SIZE
@click.option("--force", is_flag=True)
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
@ATTACH_TOKENIZER
def fold(grown, alpha, out, dtype, shard_size, force, quiet, tokenizer_path):
    """Bake the growth gates away: a plain, gate-free checkpoint."""
    from growtool import surgery

    shard_size = parse_size(shard_size) if shard_size is not None else None
    r = surgery.run_fold(
        grown,
        alpha=alpha,
        out=out,
        dtype=dtype,
        shard_size=shard_size,
        force=force,
        tokenizer_path=tokenizer_path,
        progress=functools.partial(Bar, "fold", quiet=quiet),
    )
    if r.note:
        err.print(f"[yellow]warning:[/] {r.note}", soft_wrap=True)
    err.print(f"folded gates at alpha {alpha:g}" + ("" if r.gated else " (the model had no gates)"))
    if r.path != "-":
        click.echo(r.path)
    Growtool.done = True


# ---- inspect ------------------------------------------------------------------------------


@main.command()
@click.argument("ckpt")
@click.option("--metrics", is_flag=True, help="stable rank and row cosine of every matrix")
@click.option("--json", "as_json", is_flag=True)
def inspect(ckpt, metrics, as_json):
    """Family, shapes, parameters, dtype, gate state and lineage of a checkpoint (or of a training
    run folder's last.safetensors, the state --resume continues from)."""
    from growtool import info, views

    facts = info.inspect(ckpt, metrics=metrics)
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    if facts["run_folder"]:
        err.print(
            f"{ckpt}: a training run folder; its model {facts['path']} (the state --resume continues from)",
            soft_wrap=True,
        )
    for t in views.inspect_tables(facts, facts["path"] or ckpt, metrics):
        err.print(t)


# ---- sample -------------------------------------------------------------------------------


@main.command()
@click.argument("ckpt")
@click.option("--prompt", required=True, help="text to continue")
@click.option(
    "--max-tokens",
    type=int,
    default=64,
    show_default=True,
    callback=bounded(1),
    help="tokens to generate (fewer if EOS comes)",
)
@click.option(
    "--temperature", type=float, default=0.0, show_default=True, callback=bounded(0), help="0 = greedy; above 0, sample"
)
@click.option("--top-k", type=int, default=None, callback=bounded(1), help="sample among the K most likely tokens")
@click.option(
    "--seed", type=int, default=0, show_default=True, callback=SEED, help="sampling seed (same seed, same text)"
)
@click.option(
    "--alpha",
    type=float,
    default=None,
    callback=bounded(0, 1),
    help="grown checkpoints: growth-gate value (default: the stored gates)",
)
@click.option("--tokenizer", "tokenizer_spec", default=None, metavar="byte|PATH", help="default: the checkpoint's own")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
def sample(ckpt, prompt, max_tokens, temperature, top_k, seed, alpha, tokenizer_spec, device):
    """Continue --prompt with CKPT and its own tokenizer; prints the continuation on stdout."""
    import torch

    from growtool.io import checkpoint
    from growtool.sample import eos_id, generate
    from growtool.tokenizer import tokenizer_for
    from growtool.training.loop import pick_device

    ck = checkpoint.load(ckpt)
    if alpha is not None and not ck.config.gated:
        raise GrowError(f"--alpha: {ckpt} has no growth gates (a plain model; drop --alpha)")
    tok = tokenizer_for(ck, tokenizer_spec, whole=True)
    ids = tok.encode_prompt(prompt)
    if not ids:
        raise GrowError("--prompt encodes to no tokens (give some text)")
    model = ck.model().to(pick_device(device, 0))
    t0 = time.time()
    out = generate(
        model,
        torch.tensor([ids]),
        max_tokens,
        temperature=temperature,
        top_k=top_k,
        seed=seed,
        alpha=alpha,
        eos=eos_id(ck.config),
    )[0].tolist()
    click.echo(tok.decode(out))
    how = "greedy" if temperature <= 0 else f"temperature {temperature:g}" + (f", top-k {top_k}" if top_k else "")
    how += "" if temperature <= 0 else f", seed {seed}"
    which = "the byte tokenizer" if tok.hf is None else f"the tokenizer from {tok.name}"
    err.print(f"{len(out)} tokens ({how}) in {time.time() - t0:.2f} s, {which}", soft_wrap=True)


# ---- train --------------------------------------------------------------------------------


@main.command()
@click.argument("ckpt")
@click.option("--data", "data_files", multiple=True, required=True, metavar="PATH", help="text/jsonl/parquet/bin/npy")
@click.option("--val-data", multiple=True, metavar="PATH", help="held-out data (as --data); default: the last 5%")
@settings_options
@click.option("--out", required=True, help="run folder (checkpoints, metrics.jsonl, loss.png)")
@click.option("--resume", is_flag=True, help="continue the run in --out exactly where it stopped")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
def train(ckpt, data_files, val_data, out, resume, quiet, **settings):
    """Train CKPT on text; prints the final (plain) checkpoint's path on stdout."""
    from growtool.training.loop import train as run

    r = run(ckpt, list(data_files), out, resume=resume, progress=not quiet, val_data=list(val_data), **settings)
    Growtool.done = True  # every file is written and closed, the process group (torchrun) destroyed
    if os.environ.get("RANK", "0") != "0":
        return
    err.print(
        f"trained {r['steps']}/{r['total_steps']} steps ({r['tokens']:,} tokens) in {r['seconds']:.1f} s: "
        f"val loss {r['first_val_loss']:.4f} -> {r['val_loss']:.4f}",
        soft_wrap=True,
    )
    if r["final"]:
        g = r["gate"]
        err.print(
            f"final checkpoint ({r['params']:,} parameters"
            + (f", growth gates folded at {g:g}" if g is not None else "")
            + f"): {r['final']}",
            soft_wrap=True,
        )
        if r["pre_decay"]:  # docs/training.md, "Grow a finished run"
            err.print(f"the state before the decay (to extend or grow): {r['pre_decay']}", soft_wrap=True)
        click.echo(r["final"])
    else:
        err.print(f"stopped at step {r['steps']}: resume with the same command and --resume", soft_wrap=True)


# ---- demo ---------------------------------------------------------------------------------


@main.command()
@click.option(
    "--out", default="growtool-demo", show_default=True, help="folder for every stage's files (must not exist)"
)
@click.option("--quick", is_flag=True, help="tiny models and short runs (well under a minute)")
def demo(out, quick):
    """init -> train -> expand -> verify -> train -> expand -> verify -> train, on a generated corpus."""
    from growtool.demo import run_demo

    ok = run_demo(out, quick=quick)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":  # python -m growtool.cli (what torchrun runs)
    run()
