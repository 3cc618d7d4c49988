"""The whole story of a model grown over several runs, in one picture (``story.png``).

``story_figure(runs)`` takes the metrics records of several runs in the order they were trained
(each run folder's ``metrics.jsonl``, ``run_folder.read_metrics``) and draws validation and
training loss against the tokens (or training FLOPs) trained so far, summed over the runs; each
stage named by its size (``d64 × 2 layers``); a dotted line at each growth, between runs or inside
one (``--grow-at``), labelled ``d64 → d96``; the learning rate on a second axis; the legend under
the axes. A run whose records begin as the previous run's do (a run folder grown by ``expand
RUN_DIR`` carries its source's records) replaces that run. ``growtool demo`` writes one.
"""

from __future__ import annotations

from pathlib import Path

from growtool.nn.errors import GrowError
from growtool.training.run_folder import grown, growth_label, resized, save_png, size_label

AXIS = {"tokens": "tokens trained, all stages", "flops": "training FLOPs (6 × parameters × tokens), all stages"}


def stages(runs: list[list[dict]], x: str = "tokens") -> list[dict]:
    """The runs' records cut into stages of one model size each (``{"size": label, "records": [...]}``),
    every record copied with ``x``: its tokens (or FLOPs) plus what the runs before it trained. A new
    stage begins where the model grows: inside a run, or between two runs of different sizes."""
    if x not in AXIS:
        raise GrowError(f"story: x must be one of {', '.join(AXIS)}, not {x!r}")
    kept: list[list[dict]] = []
    for recs in runs:
        recs = [r for r in recs if x in r]
        if kept and recs and kept[-1][0] == recs[0]:  # the previous run's records carried on
            kept[-1] = recs
        elif recs:
            kept.append(recs)
    out, offset = [], 0.0
    for recs in kept:
        for i, r in enumerate(recs):
            last = out[-1]["records"][-1] if out else None
            if last is None or (grown(last, r) if i else resized(last, r)):  # inside a run, or between two
                out.append({"size": size_label(r), "records": []})
            out[-1]["records"].append({**r, "x": offset + r[x]})
        offset += max(r[x] for r in recs)
    return out


def default_title(parts: list[dict], x: str) -> str:
    """The figure's title in words: from which size to which, in how many growths and stages, on how much."""
    last = parts[-1]["records"][-1]
    amount = f"{last['x']:,.0f} tokens" if x == "tokens" else f"{last['x']:.3g} FLOPs"
    growths = len(parts) - 1
    return (
        f"Loss as the model grew from {parts[0]['size']} to {parts[-1]['size']}: "
        f"{growths} growth{'s' if growths != 1 else ''}, {len(parts)} stages, {amount} in all"
    )


def mark_stages(ax, parts: list[dict]) -> None:
    """Name each stage above its span; a dotted line at each growth, labelled with the change."""
    for i, part in enumerate(parts):
        recs = part["records"]
        lo = parts[i - 1]["records"][-1]["x"] if i else recs[0]["x"]
        ax.annotate(
            part["size"],
            ((lo + recs[-1]["x"]) / 2, 0.985),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            ha="center",
            va="top",
        )
        if i:
            prev = parts[i - 1]["records"][-1]
            ax.axvline(lo, color="tab:red", lw=0.9, ls=":", label="growth" if i == 1 else "_")
            ax.annotate(
                growth_label(prev, recs[0]) + " ",
                (lo, 0.9),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                rotation=90,
                ha="right",
                va="top",
                color="tab:red",
            )


def story_figure(runs: list[list[dict]], title: str | None = None, x: str = "tokens"):
    """The whole-story plot of ``runs`` (each a run's metrics records, in training order) as a
    matplotlib figure; ``x``: ``"tokens"`` or ``"flops"``; ``title``: by default said in words from the runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    parts = stages(runs, x)
    if not parts:
        raise GrowError("story: the runs have no metrics records")
    recs = [r for p in parts for r in p["records"]]
    tr = [r for r in recs if "loss" in r]
    va = [r for r in recs if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    ax.plot([r["x"] for r in tr], [r["loss"] for r in tr], lw=0.8, alpha=0.6, label="train loss")
    ax.plot([r["x"] for r in va], [r["val_loss"] for r in va], "o-", ms=3, label="validation loss")
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + 0.12 * (hi - lo))  # room above the curves for the stages' names
    ax.set_xlabel(AXIS[x])
    ax.set_ylabel("loss (nats/token)")
    ax.xaxis.set_major_formatter(EngFormatter(sep=" "))
    ax.set_title(title or default_title(parts, x), fontsize=9)
    mark_stages(ax, parts)
    handles = ax.get_lines()
    lrs = [r for r in tr if isinstance(r.get("lr"), (int, float))]
    if lrs:
        ax2 = ax.twinx()
        xs, ys = [r["x"] for r in lrs], [r["lr"] for r in lrs]
        ax2.plot(xs, ys, color="tab:green", lw=0.8, label="learning rate (right)")
        ax2.set_ylabel("learning rate")
        ax2.set_ylim(0, 1.1 * max(ys) or 1)
        handles = handles + ax2.get_lines()
    handles = [h for h in handles if not h.get_label().startswith("_")]
    ax.legend(handles, [h.get_label() for h in handles], loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=4)
    fig.tight_layout()
    return fig


def write_story(runs: list[list[dict]], path: Path, title: str | None = None, x: str = "tokens") -> Path:
    """Write ``story_figure(runs, title, x)`` to ``path`` as a PNG (atomically); returns the path."""
    save_png(story_figure(runs, title, x), Path(path))
    return Path(path)


__all__ = ["stages", "story_figure", "write_story"]
