"""The attention gate through a width growth: how open each block's gates are, old heads and new.

Gated attention multiplies each head's output by sigmoid(x W_g + b). For one run of budget.py's study
(the first of ``--variants``, a width growth, at the first of ``--grow-lrs``; scratch at the first of
``--lrs``; seed ``--first-seed``) this trains the grown run to its growth, one step past it and to its
end (one run, resumed at each stop), and scratch to its end, and reports per block the mean gate and the
share of gates under 0.1, over the study's text (its last ``TAIL`` characters), for the heads the narrow
model had (old) and the heads the growth added (new; scratch: the same index ranges):

    python bench/attn_gates.py ../shared/data/docs.jsonl --width 64 --layers 4 --head-dim 8 --schedule wsd \\
        --vocab 512 --data-mb 16 --paired 1 --decay-shape sqrt --families llama --budgets 10 --lrs 0.0045 \\
        --grow-lrs 0.006 --variants width2x@0.15/paper

Writes ``<out>/attn_gates/gates.csv`` and ``gates.json``. Runs are not cached: this keeps checkpoints.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

import torch
from budget import grown_run, option_kw, options, plan_runs, run_settings, scratch_run, study, text_file, with_sizes
from budget import tokenizer as bpe
from common import parse_args, table, train_phase, write_csv, write_json
from growth_pays import _config

TAIL = 200_000  # characters of the study's text the gates are read on
WINDOWS = 64  # sequences of --seq tokens drawn from them (seed 0)


def token_windows(P, n: int = WINDOWS) -> torch.Tensor:
    """``n`` sequences of ``P["seq"]`` ids from the end of the study's text (BPE ids, or bytes)."""
    text = Path(P["data"]).read_text(encoding="utf-8", errors="replace")[-TAIL:]
    if P.get("tokenizer"):
        from tokenizers import Tokenizer

        ids = torch.tensor(Tokenizer.from_file(P["tokenizer"]).encode(text).ids)
    else:
        ids = torch.tensor(list(text.encode("utf-8")))
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, len(ids) - P["seq"], (n,), generator=g)
    return torch.stack([ids[s : s + P["seq"]] for s in starts.tolist()])


def _stat(gates: torch.Tensor) -> tuple[float | None, float | None]:
    """(mean, share under 0.1) of ``gates``, or (None, None) when there are none."""
    if not gates.numel():
        return None, None
    return round(gates.mean().item(), 4), round((gates < 0.1).float().mean().item(), 4)


def openness(path, ids: torch.Tensor, old: int) -> list[dict]:
    """Per block of the checkpoint at ``path``: the mean gate sigmoid(x W_g + b) and the share under 0.1,
    over every token of ``ids``, for heads below index ``old`` and for the rest (None where there is none)."""
    from growtool.io import checkpoint

    model = checkpoint.load(path).model()
    logits = []
    hooks = [b.slot["g"].register_forward_hook(lambda m, i, o: logits.append(o.detach())) for b in model.blocks]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    rows = []
    for layer, z in enumerate(logits):
        s = torch.sigmoid(z.float()).reshape(-1, z.shape[-1])
        (om, oc), (nm, nc) = _stat(s[:, :old]), _stat(s[:, old:])
        rows.append({"block": layer, "old_mean": om, "old_closed": oc, "new_mean": nm, "new_closed": nc})
    return rows


def main():
    args = parse_args("attn_gates", __doc__.splitlines()[0], options)
    P = study(args)
    P["data"] = text_file(args.data, args.dir / "cache", P["data_mb"])
    if P["vocab"]:
        P["tokenizer"] = bpe(P["data"], P["vocab"], args.dir / "cache")
    P["seeds"], P["sweep"], P["scratch_budgets"] = P["first_seed"] + 1, "", ""
    P["lrs"], P["grow_lrs"] = P["lrs"].split(",")[0], P["grow_lrs"].split(",")[0]
    P["variants"], P["budgets"] = P["variants"].split(",")[0], P["budgets"].split(",")[0]
    specs = [with_sizes(P, s) for s in plan_runs(P)]
    grown = next(s for s in specs if s["kind"] == "grown")
    scratch = next(s for s in specs if s["kind"] == "scratch")
    if "base" in grown and grown["base"][1] != grown["growths"][-1][2] or len(grown["growths"]) != 1:
        raise SystemExit(f"{grown['variant']}: one width growth is what this follows")
    fam = grown["family"]
    if not _config(P, fam, grown["target"]).attn_gate:
        raise SystemExit(f"{fam}: this target has no gated attention (--llama-gate 1, or --gpt2-gate 1)")
    work = args.dir / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    torch.set_num_threads(1)
    t0 = time.time()
    base, grow_at, tokens = grown_run(P, grown, work)
    Q, out = run_settings(P, grown, work), work / "grown"
    kw = option_kw(grown, work, tokens)
    k = round(grown["growths"][0][0] * math.ceil(tokens / (P["batch"] * P["seq"])))  # train's growth step
    points = []
    for stop, label in ((k, "at the growth (narrow)"), (k + 1, "just grown"), (None, "grown, end")):
        stop_kw = {"stop_at": stop} if stop else {}
        s, _ = train_phase(Q, base, str(out), tokens, grown["seed"], grow_at=grow_at, resume=stop != k, **kw, **stop_kw)
        keep = work / f"{len(points)}.safetensors"
        shutil.copy(out / "last.safetensors", keep)
        points.append((label, keep, s.get("val_loss")))
    s, _ = train_phase(run_settings(P, scratch, work), *scratch_run(P, scratch, work))
    points.append(("scratch, end", work / "out" / "last.safetensors", s.get("val_loss")))
    ids = token_windows(P)
    old = grown["base"][0] // P["head_dim"] if "base" in grown else P["width"] // P["head_dim"]
    rows = [
        {"model": label, "val": round(val, 4) if val is not None else None, **r}
        for label, path, val in points
        for r in openness(path, ids, old)
    ]
    d = args.dir
    write_csv(d / "gates.csv", rows)
    settings = {k: v for k, v in P.items() if k not in ("data", "tokenizer")}
    write_json(d / "gates.json", {"settings": settings, "family": fam, "grown": grown, "rows": rows})
    print(table(rows))
    print(f"attn_gates: {time.time() - t0:.0f} s; wrote {d / 'gates.csv'}, gates.json")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
