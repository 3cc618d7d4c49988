"""The model card (README.md) written into a folder output: the model's shape, its growth lineage
(source, widths, recipe, whether the growth was exact, training stages) and its tokenizer."""

from __future__ import annotations

from pathlib import PurePath

from growtool.io.hf_remote import needs_remote

MARKDOWN = str.maketrans({c: "\\" + c for c in "\\`*_[]<|~"})  # links, code, emphasis, tags, cells


def md(value) -> str:
    """Text from a checkpoint (lineage, recorded paths) as inert Markdown: one line, every character
    that Markdown or HTML would act on escaped (no links, images, tags or table cells of its own). A
    file name that is not UTF-8 (its bytes decoded as lone surrogates) shows them as ``\\udcXX``."""
    text = str(value).encode("utf-8", "backslashreplace").decode("utf-8")
    return " ".join(text.split()).translate(MARKDOWN)


def _stage(st: dict) -> str:
    return md(_stage_text(st))


def _stage_text(st: dict) -> str:
    op = st.get("op")
    src = f"; source sha256 {st['source_sha256'][:12]}" if st.get("source_sha256") else ""
    if op == "init":
        return f"initialised at width {st.get('width')} (gamma {st.get('gamma')}, seed {st.get('seed')})"
    if op == "expand":
        exact = "exact at gate 0" if st.get("exact") else "lossy (not function-preserving)"
        parts = []
        if st.get("width_from") != st.get("width_to") or st.get("layers_from") is None:
            width = f"d{st.get('width_from')} -> d{st.get('width_to')}"
            parts.append(f"{width}, heads {st.get('heads')}, FFN {st.get('ffn')}")
        if st.get("layers_from") is not None:
            parts.append(f"{st['layers_from']} -> {st.get('layers_to')} layers ({st.get('depth_method')})")
        return f"grown {', '.join(parts)}, recipe {st.get('recipe')}, {exact}{src}"
    if op == "fold":
        return f"growth gates folded at alpha {st.get('alpha')}{src}"
    if op == "train":
        out = f"trained {st.get('steps')} steps, {st.get('tokens', 0):,} tokens"
        if isinstance(st.get("val_loss"), (int, float)):
            out += f", val loss {st['val_loss']:.4f}"
        if st.get("gates_folded_at") is not None:
            out += f", gates folded at {st['gates_folded_at']:g}"
        if st.get("complete") is False:
            out += " (run in progress)"
        return out + src
    return ", ".join(f"{k}={v}" for k, v in st.items() if k not in ("recipe_full",))


def shown(path) -> str:
    """A path as the card shows it: as given when relative, else its last two parts (a card is
    shared: it names no folder of the machine that wrote it)."""
    p = PurePath(str(path))
    return str(PurePath(*p.parts[-2:])) if p.is_absolute() else str(p)


def model_card(cfg, lineage: list, source: str, name: str, tokenizer=None) -> str:
    """Markdown text of the card for a model ``name`` made from ``source``."""
    lines = [
        "---",
        "library_name: transformers",
        "tags: [growtool, width-growth]",
        "---",
        "",
        f"# {md(name)}",
        "",
        f"A {cfg.family} model: width {cfg.width}, {cfg.layers} layers, {cfg.heads} heads "
        f"({cfg.kv_heads} key/value), FFN {cfg.ffn}, vocabulary {cfg.vocab_size:,}, context {cfg.context}, "
        f"{cfg.n_params():,} parameters. Written by growtool from {md(shown(source))}.",
        "",
    ]
    if cfg.gated:
        lines += [
            "**Growth gates present** (a grown, unfolded model): growtool computes it at any gate value; "
            "fold them (`growtool fold DIR --alpha 0 -o OUT`) for a plain model.",
            "",
        ]
    if needs_remote(cfg):
        lines += [
            "No stock transformers class computes this model: load it with "
            "`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` (growtool's forward pass "
            "is written beside it).",
            "",
        ]
    lines += ["## Lineage", ""]
    if lineage:
        lines += ["| # | stage |", "|---|---|"]
        lines += [f"| {i} | {_stage(st)} |" for i, st in enumerate(lineage)]
    else:
        lines += ["No recorded stages (a plain checkpoint)."]
    lines += ["", "## Tokenizer", ""]
    if tokenizer is not None:
        names = ", ".join(f"`{n}`" for n in sorted(tokenizer.files))
        lines += [f"Carried unchanged from {md(shown(tokenizer.origin))}: {names}."]
    elif cfg.vocab_size == 256:
        lines += ["Byte-level (token id = byte value, 0..255): growtool's `byte` tokenizer."]
    else:
        lines += ["None found; pass one with `--tokenizer PATH`."]
    lines += ["", f'Sample from it: `growtool sample {shown(name)} --prompt "..."`.', ""]
    return "\n".join(lines)
