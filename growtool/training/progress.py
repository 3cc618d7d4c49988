"""The trainer's progress on stderr, for a person at a terminal and for a log file.

* On a terminal: a rich bar. The step count and the ETA come first and are never cut; the text
  after the bar (tok/s, loss, val, lr, gate) is cut with an ellipsis when the terminal is narrow
  (80 columns keep "train 12/60 0:00:45", the bar and the start of the text).
* Off a terminal (nohup, Slurm, a CI log): one plain line, flushed, after each validation, every
  ``max(1, total // LINES)``-th step, ``SECONDS`` seconds after the last line, and at the
  last step: step/total, tokens, loss, val, lr, gate, tok/s (this invocation's mean) and ETA.
"""

from __future__ import annotations

import sys
import time

LINES = 20  # off a terminal: a line at least every 1/20 of the run
SECONDS = 30.0  # ... and at least every 30 s
BAR = 16  # the bar's width on a terminal


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-:--:--"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """``Progress(enabled, total, done)``; ``update(step, rec)`` after each update; ``close()``.
    ``terminal``: draw the bar (default: stderr is a terminal); ``console`` / ``stream``: where to
    (default: stderr)."""

    def __init__(self, enabled: bool, total: int, done: int, terminal=None, console=None, stream=None):
        from growtool.console import stderr_is_terminal

        self.total, self.done, self.t0 = total, done, time.monotonic()
        self.bar, self.lines, self.last_val, self.tokens0 = None, None, None, None
        self.last_line = self.t0  # when the last plain line was written
        if not enabled:
            return
        if not (stderr_is_terminal() if terminal is None else terminal):
            self.lines = stream or sys.stderr
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as P
        from rich.table import Column

        fixed = lambda: Column(no_wrap=True)  # noqa: E731  (never wrapped or collapsed by rich)
        self.bar = P(
            TextColumn("train", table_column=fixed()),
            MofNCompleteColumn(table_column=fixed()),
            TimeRemainingColumn(table_column=fixed()),
            BarColumn(bar_width=BAR, table_column=fixed()),
            TextColumn("{task.fields[info]}", table_column=fixed()),
            console=console or Console(stderr=True),
        )
        # what the info text may take: the width less "train", "12/2000", the ETA, the bar and the gaps
        self.room = self.bar.console.width - (5 + 2 * len(str(total)) + 1 + 8 + BAR + 5)
        self.task = self.bar.add_task("train", total=total, completed=done, info="")
        self.bar.start()

    def update(self, step: int, rec: dict) -> None:
        if "val_loss" in rec:
            self.last_val = rec["val_loss"]
        if self.tokens0 is None:
            self.tokens0 = rec["tokens"] * self.done // max(step, 1)  # tokens before this invocation
        if self.bar is not None:
            info = f"{rec['tok_s']:,.0f} tok/s  loss {rec['loss']:.4f}"
            info += f"  val {self.last_val:.4f}" if self.last_val is not None else ""
            info += f"  lr {rec['lr']:.2e}" + (f"  gate {rec['gate']:.2f}" if rec.get("gate") is not None else "")
            info = info if len(info) <= self.room else info[: max(0, self.room - 1)] + "…"
            self.bar.update(self.task, completed=step, info=info)
        elif self.lines is not None and self.line_due(step, "val_loss" in rec):
            self.lines.write(self.line(step, rec) + "\n")
            self.lines.flush()
            self.last_line = time.monotonic()

    def line_due(self, step: int, evaluated: bool) -> bool:
        every = max(1, self.total // LINES)
        return evaluated or step == self.total or step % every == 0 or time.monotonic() - self.last_line >= SECONDS

    def line(self, step: int, rec: dict) -> str:
        """``train step 12/60 (20%)  tokens 6,144  loss 4.1234  val 4.2000  lr 3.00e-03  gate 0.50
        1,234 tok/s  ETA 0:00:45``."""
        elapsed = time.monotonic() - self.t0
        done = step - self.done
        eta = elapsed / done * (self.total - step) if done > 0 else None
        rate = (rec["tokens"] - self.tokens0) / elapsed if elapsed > 0 else 0.0
        parts = [f"train step {step}/{self.total} ({100 * step / self.total:.0f}%)", f"tokens {rec['tokens']:,}"]
        parts.append(f"loss {rec['loss']:.4f}")
        if self.last_val is not None:
            parts.append(f"val {self.last_val:.4f}")
        parts.append(f"lr {rec['lr']:.2e}")
        if rec.get("gate") is not None:
            parts.append(f"gate {rec['gate']:.2f}")
        parts += [f"{rate:,.0f} tok/s", f"ETA {duration(eta)}"]
        return "  ".join(parts)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
