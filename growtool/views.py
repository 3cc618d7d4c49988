"""How the command line shows results: the plan table and the plan as JSON (``expand``), the
verify table, the inspect tables. Each builds a rich ``Table`` (or a dict) from the library's results."""

from __future__ import annotations

from rich.table import Table

from growtool.io import checkpoint


def shorten_left(name: str, room: int) -> str:
    """``name`` cut from the left to ``room`` characters ("…self_attn.q_proj.weight"): the end of a tensor
    name tells its rows apart (q/k/v/o), so the start goes."""
    return name if len(name) <= room else "…" + name[len(name) - room + 1 :]


def plan_table(plan, width: int | None = None) -> Table:
    """The plan's rows; ``width`` (the console's columns): tensor names are shortened from the left
    so that each row's name stays on one line and the operation keeps at least 28 columns."""
    rows = plan.rows()
    if width is not None:
        shapes = max(len(r[1]) for r in rows) + max(len(r[2]) for r in rows)
        room = max(16, width - 13 - shapes - 28)  # 13: the borders and padding of four columns
        rows = [(shorten_left(r[0], room), *r[1:]) for r in rows]
    t = Table(
        title=f"growth plan: {plan.src.family} d{plan.src.width} -> d{plan.cfg.width} "
        f"(recipe {plan.recipe['name']}, eps {plan.eps:.4f})",
        title_justify="left",
        caption=f"residual map: {plan.residual_map}",
        caption_justify="left",
    )
    t.add_column("tensor", no_wrap=True)
    for c in ("from", "to", "operation"):
        t.add_column(c)
    for row in rows:
        t.add_row(*row)
    return t


def plan_json(plan, out: str | None) -> dict:
    """The plan for tools: source and target shapes, exactness and its reasons, every tensor's operation."""
    outputs = plan.outputs()
    shape = lambda c: {k: getattr(c, k) for k in ("family", "width", "layers", "heads", "kv_heads", "ffn")}  # noqa: E731
    return {
        "source": shape(plan.src),
        "target": shape(plan.cfg),
        "recipe": plan.recipe["name"],
        "eps": plan.eps,
        "residual_map": plan.residual_map,
        "exact": plan.exact,
        "lossy": list(plan.lossy),
        "warnings": list(plan.warnings),
        "carried": plan.carried,
        "tensors": [dict(zip(("pattern", "from", "to", "operation"), row)) for row in plan.rows()],
        "outputs": {
            "tensors": len(outputs),
            "bytes": checkpoint.specs_nbytes(outputs),
            "dtype": str(plan.dtype).replace("torch.", ""),
        },
        "out": out,
        **({"depth": plan.depth.to_json()} if getattr(plan, "depth", None) else {}),
    }


def plan_tables(plan, width: int | None = None) -> list[Table]:
    """The printed plan: the width plan's table (when the width grows), the depth plan's (when the depth does)."""
    deep = getattr(plan, "depth", None)
    return ([plan_table(plan, width)] if plan.rows() else []) + ([depth_table(deep)] if deep else [])


def grew_run_line(src, step: int, plan, out) -> str:
    """What ``expand RUN_DIR`` says once written."""
    layers = f", {plan.src.layers} -> {plan.cfg.layers} layers" if plan.cfg.layers != plan.src.layers else ""
    return (
        f"grew run {src} at step {step}: {plan.src.family} d{plan.src.width} -> d{plan.cfg.width}{layers}, AdamW "
        f"moments grown; continue with: growtool train <its checkpoint> --data ... --out {out} --resume"
    )


def grew_line(src, cfg) -> str:
    """What ``expand`` says once written: the family, widths (and layers), parameters."""
    deep = cfg.layers != src.layers
    return (
        f"grew {src.family} d{src.width}"
        + (f" -> d{cfg.width}" if cfg.width != src.width or not deep else "")
        + (f", {src.layers} -> {cfg.layers} layers" if deep else "")
        + f": {src.n_params():,} -> {cfg.n_params():,} parameters"
    )


def depth_table(dp) -> Table:
    """Where every block of a depth growth comes from (``grow/depth.py``)."""
    t = Table(title=f"depth plan: {dp.src_layers} -> {dp.layers} blocks ({dp.method})", title_justify="left")
    for c in ("block", "from", "what"):
        t.add_column(c)
    for row in dp.rows():
        t.add_row(*row)
    return t


def verify_table(rows, source: str, grown: str) -> Table:
    """One row per (inputs, gate) of a ``check.Report``."""
    t = Table(title=f"verify {grown} against {source}", title_justify="left")
    for c in ("inputs", "gate", "max |dlogit|", "logit scale", "rel", "mean KL", "top-1 agree"):
        t.add_column(c, justify="right")
    for label, c in rows:
        t.add_row(
            label,
            f"{c.alpha:g}",
            f"{c.max_dlogit:.3g}",
            f"{c.logit_scale:.3g}",
            f"{c.rel:.3g}",
            f"{c.kl:.3g}",
            f"{c.top1:.4f}",
        )
    return t


def inspect_tables(facts: dict, ckpt: str, metrics: bool) -> list[Table]:
    """The facts of ``info.inspect`` (and its condensation metrics, with ``metrics``)."""
    t = Table(title=f"{ckpt}", title_justify="left", show_header=False)
    for k in (
        "family",
        "width",
        "layers",
        "heads",
        "kv_heads",
        "head_dim",
        "ffn",
        "vocab",
        "context",
        "norm_eps",
        "tied",
        "attn_gate",
        "parameters",
        "dtype",
    ):
        t.add_row(k, f"{facts[k]:,}" if k == "parameters" else str(facts[k]))
    if facts.get("mixer"):  # a Mamba mixer's sizes, a hybrid's block kinds (heads / ffn above: attention's, MLP's)
        t.add_row("mamba mixer", ", ".join(f"{k}={v}" for k, v in facts["mixer"].items()))
    if facts.get("blocks"):
        t.add_row("blocks", " ".join(facts["blocks"]))
    gates = facts["gates"]
    t.add_row(
        "gates",
        "none (plain model)"
        if not facts["gated"]
        else f"{len(gates)} x {sorted(set(gates))}; ungated units: {facts['base_heads']}/{facts['heads']} heads, "
        f"{facts['base_ffn']}/{facts['ffn']} ffn"
        + (f"; new (gated) blocks: {facts['new_layers']}" if facts.get("new_layers") else ""),
    )
    for i, st in enumerate(facts["lineage"]):
        desc = ", ".join(f"{k}={v}" for k, v in st.items() if k not in ("recipe_full", "source_sha256"))
        if st.get("source_sha256"):
            desc += f", source {st['source_sha256'][:12]}"
        t.add_row(f"lineage {i}", desc)
    tok = facts["tokenizer"]
    if tok:
        t.add_row("tokenizer", f"{', '.join(sorted(tok.get('files', {})))} from {tok.get('from')}")
    tables = [t]
    if metrics:
        m = Table(title="condensation metrics", title_justify="left")
        for c in ("matrix", "stable rank", "row cosine"):
            m.add_column(c)
        for n, v in facts["metrics"].items():
            m.add_row(n, f"{v['stable_rank']:.2f}", f"{v['row_cosine']:.3f}")
        tables.append(m)
        if facts.get("growth"):
            tables.append(growth_table(facts["growth"]))
    return tables


def growth_table(rec: dict) -> Table:
    """Per block: the copies' cosine with their sources and the gate (training.diagnostics.checkpoint_record)."""
    t = Table(
        title=f"growth {rec['width_from']} -> {rec['width_to']} ({rec['recipe']}): copies vs their sources",
        title_justify="left",
    )
    keys = ("ffn_cos_mean", "ffn_cos_max", "head_cos_mean", "head_cos_max", "gate")
    for c in ("block", "ffn cos mean", "ffn cos max", "head cos mean", "head cos max", "gate"):
        t.add_column(c)
    for i, b in enumerate(rec["blocks"]):
        t.add_row(str(i), *("-" if b[k] is None else f"{b[k]:.4f}" for k in keys))
    parts = [
        f"{label} median {rec[g + 'median']:.4f}, 90th percentile {rec[g + 'p90']:.4f}"
        for label, g in (("all copies", "cos_"), ("FFN", "ffn_cos_"), ("heads", "head_cos_"))
        if rec.get(g + "median") is not None
    ]
    if parts:
        t.caption, t.caption_justify = "cosine with the source: " + "; ".join(parts), "left"
    return t


# ---- what expand says on stderr (the console ``err``) ------------------------------------------


def show_plan(err, plan, quiet: bool) -> None:
    """The plan on stderr: the table (unless quiet), then why it is not exact, then warnings."""
    for table in [] if quiet else plan_tables(plan, err.width):  # (a depth growth: where every block comes from)
        err.print(table)
    for c in [] if quiet else plan.carried:
        err.print(f"carried: {c}", soft_wrap=True)
    for reason in plan.lossy:
        err.print(f"[yellow]lossy:[/] {reason}")
    for w in plan.warnings:
        err.print(f"[yellow]warning:[/] {w}")


def show_dry_run(err, plan, out: str, quiet: bool) -> None:
    """What ``expand --dry-run`` says: exact or lossy, and what a real run would write."""
    size = checkpoint.specs_nbytes(plan.outputs())
    verdict = (
        "[green]exact[/] at gate 0 (the grown model computes the source's function; growtool verify "
        "measures it after a real run)"
        if plan.exact
        else "[yellow]lossy[/] (reasons above; a real run measures the loss of function)"
    )
    if quiet:  # otherwise the table's caption says it
        err.print(f"residual map: {plan.residual_map}", soft_wrap=True)
    err.print(f"dry run: {verdict}; would write {out} ({len(plan.outputs())} tensors, {size:,} bytes)", soft_wrap=True)


def show_expanded(err, job) -> None:
    """What ``expand`` says once written: the tokenizer note, where a finished run's state before its decay
    is (a better start), a lossy plan's measured loss, the sizes."""
    if job.note:
        err.print(f"[yellow]warning:[/] {job.note}", soft_wrap=True)
    if (pre := job.pre_decay) is not None:  # docs/training.md, "Grow a finished run"
        err.print(
            f"note: this model is decayed; {pre} holds the run before its decay. Growing that instead "
            f"(growtool expand {pre} -o NEW, then growtool train <its checkpoint> --data ... --out NEW --resume "
            '--tokens <the whole run\'s>) ends lower: docs/training.md, "Grow a finished run"',
            soft_wrap=True,
        )
    if job.loss is not None:
        c = job.loss
        err.print(
            f"measured loss of function at gate 0: max |dlogit| {c.max_dlogit:.3g} "
            f"({c.rel:.2%} of the logit scale), mean KL {c.kl:.3g}"
        )
    err.print(grew_line(job.ck.config, job.plan.cfg))
