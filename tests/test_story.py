"""The whole-story plot (training/story.py) on synthetic metrics records: its title, one labelled
line per growth (between runs and inside one), the x axis summed over the runs; and the loss plot
of one run names a depth growth too."""

import numpy as np
import pytest

from growtool.nn.errors import GrowError
from growtool.training.run_folder import figure
from growtool.training.story import stages, story_figure, write_story


def run(steps: int, width: int, layers: int, loss0: float, grow_at: dict | None = None) -> list[dict]:
    """A run's records as train writes them: step 0 (val only), then one per step, val every 5."""
    recs = [{"step": 0, "tokens": 0, "val_loss": loss0, "width": width, "layers": layers, "stage": 0}]
    for s in range(1, steps + 1):
        w, n, g = width, layers, 0
        if grow_at and s > grow_at["step"]:
            w, n, g = grow_at.get("width", width), grow_at.get("layers", layers), 1
        r = {"step": s, "tokens": 64 * s, "loss": loss0 - s / 100, "lr": 1e-3 * min(1, s / 4)}
        r.update(width=w, layers=n, stage=g, flops=6e3 * w * s)
        if s % 5 == 0:
            r["val_loss"] = loss0 - s / 100 + 0.05
        recs.append(r)
    return recs


def growth_lines(ax):
    return [line for line in ax.get_lines() if line.get_linestyle() == ":"]


def test_story_names_each_stage_and_growth_on_one_axis():
    runs = [run(20, 64, 2, 5.0), run(10, 96, 2, 4.75), run(10, 128, 4, 4.6)]
    fig = story_figure(runs)
    ax = fig.axes[0]
    assert ax.get_title() == (
        "Loss as the model grew from d64 × 2 layers to d128 × 4 layers: 2 growths, 3 stages, 2,560 tokens in all"
    )
    lines = growth_lines(ax)
    assert [line.get_xdata()[0] for line in lines] == [1280, 1920]  # at the end of each run
    texts = [t.get_text().strip() for t in ax.texts]
    assert texts == ["d64 × 2 layers", "d96 × 2 layers", "d64 → d96", "d128 × 4 layers", "d96 → d128, 2 → 4 layers"]
    train_x = np.asarray(ax.get_lines()[0].get_xdata())
    assert (np.diff(train_x) > 0).all() and train_x[-1] == 2560  # increasing across the stages
    val_x = np.asarray(ax.get_lines()[1].get_xdata())
    assert (np.diff(val_x) >= 0).all()  # a run's step 0 sits where the previous run ended
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "train loss",
        "validation loss",
        "growth",
        "learning rate (right)",
    ]
    fig.canvas.draw()
    box, axes_box = legend.get_window_extent(), ax.get_window_extent()
    assert box.y1 <= axes_box.y0 and box.y0 >= 0  # under the axes: no line covered
    assert fig.axes[1].get_ylabel() == "learning rate"


def test_growths_inside_a_run_and_a_carried_on_run_folder():
    a = run(20, 64, 2, 5.0, grow_at={"step": 10, "width": 96})
    # a run folder grown by expand RUN_DIR carries its source's records: it replaces the source's run
    b = a[:11] + run(20, 96, 4, 5.0)[11:]
    parts = stages([a, b], "flops")
    assert [p["size"] for p in parts] == ["d64 × 2 layers", "d96 × 4 layers"]
    ax = story_figure([a, b], title="one run, grown once", x="flops").axes[0]
    assert ax.get_title() == "one run, grown once" and ax.get_xlabel().startswith("training FLOPs")
    assert [t.get_text().strip() for t in ax.texts][1:] == ["d96 × 4 layers", "d64 → d96, 2 → 4 layers"]
    assert [line.get_xdata()[0] for line in growth_lines(ax)] == [6e3 * 64 * 10]
    assert len(stages([run(10, 64, 2, 5.0), run(10, 64, 2, 4.9)])) == 1  # no growth between: one stage
    with pytest.raises(GrowError, match="no metrics records"):
        story_figure([[], []])


def test_a_runs_loss_plot_labels_a_depth_growth():
    recs = run(20, 64, 2, 5.0, grow_at={"step": 8, "layers": 4})
    ax = figure(recs, "llama").axes[0]
    assert [t.get_text().strip() for t in ax.texts] == ["2 → 4 layers"]
    assert [line.get_xdata()[0] for line in growth_lines(ax)] == [64 * 8]


def test_write_story_writes_a_png(tmp_path):
    path = write_story([run(10, 32, 1, 5.0), run(10, 48, 1, 4.9)], tmp_path / "story.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and [p.name for p in tmp_path.iterdir()] == ["story.png"]
