"""bench/budget_curves.py on a hand-made cache: the final-loss gap per seed against scratch at its best
LR, the gap at equal FLOPs through the run, one study minus another run for run, and runs of another
study (another decay) never mixed in."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import budget_curves  # noqa: E402
from budget import spec_key, study, with_sizes  # noqa: E402

EVALS = 4


def _study(data, out, *extra):
    argv = [str(data), "--out", str(out), "--evals", str(EVALS), "--families", "llama", *extra]
    return argv, study(budget_curves.parser().parse_args(argv))


def _cache(P, out, kind, lr, seed, losses, flops=100.0, variant=None):
    """One cached run: its curve at EVALS + 1 evaluations (losses), FLOPs spread evenly."""
    spec = {"kind": kind, "family": "llama", "target": 64, "budget": 10.0, "lr": lr, "seed": seed}
    if variant:
        spec["variant"] = variant
    spec = with_sizes(P, spec)
    curve = [[flops * i / EVALS, v] for i, v in enumerate(losses)]
    d = Path(out) / "budget" / "cached"
    d.mkdir(parents=True, exist_ok=True)
    result = {"val": losses[-1], "curve": curve, "flops": flops}
    (d / f"{spec_key(spec)}.json").write_text(json.dumps({"spec": spec, "result": result}))


def _rows(text: str, word: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if word in line.split()]


def test_gaps_pair_each_seed_with_scratch_at_its_best_lr_and_leave_other_studies_out(tmp_path, capsys):
    data = tmp_path / "t.txt"
    data.write_text("some text\n" * 50)
    argv, P = _study(data, tmp_path)
    _, Q = _study(data, tmp_path, "--decay", "0.3")  # another study: its scratch ends far lower
    for seed, base in ((0, 3.0), (1, 3.2)):
        _cache(P, tmp_path, "scratch", 0.003, seed, [6, 4, 3.5, 3.3, base + 0.05])
        _cache(P, tmp_path, "scratch", 0.006, seed, [6, 4, 3.5, 3.3, base])  # the better LR
        _cache(Q, tmp_path, "scratch", 0.006, seed, [6, 4, 3.5, 3.3, base - 1])
        _cache(P, tmp_path, "grown", 0.006, seed, [6, 3.9, 3.4, 3.2, base + 0.01 + 0.02 * seed], variant="width2x")
    budget_curves.main(argv)
    (row,) = _rows(capsys.readouterr().out, "width2x")
    assert row[3:6] == ["0.006", "0.006", "0,1"]  # the grown run's LR, scratch's best, the seeds paired
    assert " ".join(row[6:]) == "+0.010 / +0.030 +0.020 ± 0.014 0 of 2"

    budget_curves.main(argv + ["--curves"])
    (row,) = _rows(capsys.readouterr().out, "width2x")
    # 0.1 lower at every evaluation but the first and the last: half of it half-way to the first, at 7/8
    # half of it plus half the final gap (-0.045, -0.035), at 8/8 the final gap
    assert row[6:] == ["-0.050", "-0.100", "-0.100", "-0.100", "-0.100", "-0.100", "-0.040", "+0.020"]


def test_minus_subtracts_another_studys_runs_run_for_run(tmp_path, capsys):
    data = tmp_path / "t.txt"
    data.write_text("some text\n" * 50)
    argv, P = _study(data, tmp_path)
    _, G0 = _study(data, tmp_path, "--llama-gate", "0")
    for seed in (0, 1, 2):
        _cache(P, tmp_path, "scratch", 0.006, seed, [6, 4.0, 3.5, 3.3, 3.0])
        _cache(G0, tmp_path, "scratch", 0.006, seed, [6, 4.2, 3.6, 3.3, 3.0 + 0.01 * seed])
    _cache(G0, tmp_path, "scratch", 0.003, 0, [6, 4, 4, 4, 4])  # no partner in this study: left out
    budget_curves.main(argv + ["--minus=--llama-gate 0"])
    out = capsys.readouterr().out
    (row,) = _rows(out, "scratch")
    assert row[3:] == ["0.006", "0,1,2", "-0.200", "-0.100", "-0.010"]  # at evaluations 1/4 and 2/4, at the end
    assert "1/4" in out and "2/4" in out and "3/4" not in out
