"""Where a run starts in the data stream: after the batches its input's training already used.

Training batch ``k`` of a run is drawn from ``default_rng([seed, k])`` (data.Dataset.train_batch),
so a second run with the same seed sees the very batches the first one saw. A grown checkpoint
trained with the defaults (``expand`` then ``train GROWN``) used to do exactly that: replay its
source's batches (bench/README, the plain path). Each ``train`` lineage entry now records the seed
and ``data_end``, the stream position after its last update (``data_start + steps``), and a run
starts, by default, at the latest recorded position in its input's lineage (``--data-start``
overrides it; 0 restarts the stream). Update ``s`` of a run uses batch ``data_start + s``.
A lineage from before ``data_end`` was recorded starts at 0, as before.
"""

from __future__ import annotations


def start(lineage: list) -> int:
    """The data-stream position after the latest ``train`` entry of ``lineage`` that records one (0: none)."""
    from growtool.nn import args

    for entry in reversed(lineage or []):
        if isinstance(entry, dict) and entry.get("op") == "train" and entry.get("data_end") is not None:
            return args.integer("the lineage's data_end", entry["data_end"], 0)
    return 0


def position(s: dict, step: int) -> int:
    """The stream position of update ``step`` (0-based) of a run with saved settings ``s``."""
    return int(s.get("data_start") or 0) + step


__all__ = ["start", "position"]
