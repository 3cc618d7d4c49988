"""Memory per rank of the bundled trainer under torchrun, FSDP2 (``--fsdp``) against DDP.

A grown Llama (d768 -> d1024, 8 layers, ~100M parameters, ~400 MB in float32) is trained for a
few steps by two CPU processes (gloo), once with DDP and once with FSDP2, through the trainer's
own pieces (prepare, restore, parallel, one_step, save_state). Each rank reports:

* ``params_mb`` / ``optim_mb``: bytes of the parameters and of the AdamW state this rank holds
  (counted from the tensors: a DTensor counts its local shard);
* ``rss_*``: resident memory (RSS) of the process: at start (torch imported, process group up),
  the peak while loading the checkpoint (and sharding it), the peak during the training steps,
  the RSS after them (between steps), the peak while writing the resumable state, and the kernel's
  high-water mark for the whole process (ru_maxrss). Phase peaks are sampled every 2 ms from
  /proc/self/statm; ``*_above_start`` subtract the start (torch's own libraries, the data). Freed
  heap memory is handed back to the OS (malloc_trim) after loading and after the steps, so one
  phase's garbage is not counted in the next (glibc keeps freed blocks of a few MB otherwise).

    python bench/fsdp_memory.py            # full (~400 MB model); bench/results/fsdp_memory/
    python bench/fsdp_memory.py --quick    # a small model, seconds
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MB, machine, parse_args, table, write_csv, write_json  # noqa: E402

DATA = str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt")  # ../shared/data
SIZES = {
    "full": dict(width=768, grow_to=1024, layers=8, heads=12, grow_heads=16, ffn=2048, grow_ffn=2816, seq=128),
    "quick": dict(width=64, grow_to=96, layers=2, heads=4, grow_heads=6, ffn=128, grow_ffn=192, seq=32),
}
STEPS, BATCH = 3, 4  # global batch: 2 sequences per rank


def trim() -> None:
    """Hand freed heap memory back to the OS (glibc keeps freed blocks under its mmap threshold)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Sampler(threading.Thread):
    """Peak RSS per phase, sampled every 2 ms in the background."""

    def __init__(self):
        super().__init__(daemon=True)
        self.phase, self.peaks, self.stop = "start", {}, False

    def sample(self):
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss())

    def enter(self, phase: str):
        """End the current phase and begin ``phase``, sampling at both edges."""
        self.sample()
        self.phase = phase
        self.sample()

    def run(self):
        while not self.stop:
            self.sample()
            time.sleep(0.002)


def local_bytes(t) -> int:
    from torch.distributed.tensor import DTensor

    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def worker(mode: str, ckpt: str, text: str, out: str, result: str) -> None:
    """One rank: load, train STEPS steps, save the resumable state; write this rank's numbers."""
    import torch

    from growtool.training import loop as T
    from growtool.training.settings import Settings

    torch.set_num_threads(1)
    sampler = Sampler()
    sampler.start()
    opts = Settings(
        steps=1000,  # the schedule of a long run; only STEPS are taken, no validation or metrics fall due
        batch=BATCH,
        seq=None,
        lr=1e-4,
        eval_every=1000,
        metrics_every=1000,
        save_every=1000,
        device="cpu",
        fsdp=mode == "fsdp",
    )
    run = T.prepare(ckpt, [text], Path(out), opts, False, None)
    T.start_group(run)
    base = rss()
    sampler.enter("load")
    T.restore(run, False)
    module, _ = T.parallel(run)
    trim()  # what loading freed (the whole model before sharding) must not count as training memory
    sampler.enter("train")
    params = [p for p in run.model.parameters() if p.requires_grad]
    run.val = run.ds.val_batches(1)
    t0 = time.perf_counter()
    for step in range(STEPS):
        T.one_step(run, module, params, step)
    step_s = (time.perf_counter() - t0) / STEPS
    trim()
    after = rss()  # between steps: parameters, optimizer state (and DDP's gradient buckets)
    sampler.enter("save")
    Path(out).mkdir(exist_ok=True)
    T.save_state(run, STEPS)
    sampler.enter("end")
    sampler.stop = True
    unique = {id(p): p for p in run.model.parameters()}.values()
    state = [t for s in run.opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    peaks = sampler.peaks
    res = {
        "mode": mode,
        "rank": run.rank,
        "world": run.world,
        "params": run.model.cfg.n_params(),
        "params_mb": sum(local_bytes(p) for p in unique) / MB,
        "optim_mb": sum(local_bytes(t) for t in state) / MB,
        "rss_start_mb": base / MB,
        "rss_load_peak_mb": peaks.get("load", 0) / MB,
        "rss_train_peak_mb": peaks.get("train", 0) / MB,
        "rss_after_train_mb": after / MB,
        "rss_save_peak_mb": peaks.get("save", 0) / MB,
        "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB,
        "s_per_step": step_s,
    }
    Path(result).write_text(json.dumps(res))
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def make_checkpoint(work: Path, sz: dict) -> str:
    """A grown (gated) Llama from an initialised smaller one."""
    from growtool.grow import recipes
    from growtool.grow.engine import grow_tensor
    from growtool.grow.plan import Units, build_plan
    from growtool.init import init_model
    from growtool.io import checkpoint
    from growtool.nn.config import ModelConfig

    cfg = ModelConfig(
        "llama",
        vocab_size=256,
        width=sz["width"],
        layers=sz["layers"],
        heads=sz["heads"],
        kv_heads=sz["heads"],
        head_dim=sz["width"] // sz["heads"],
        ffn=sz["ffn"],
        context=sz["seq"],
        norm_eps=1e-5,
        tie=False,
        attn_gate=False,
    )
    src = checkpoint.load(
        checkpoint.save_tensors(str(work / "src.safetensors"), cfg, [], init_model(cfg).tensors(), force=True)
    )
    plan = build_plan(cfg, recipes.load("srio"), sz["grow_to"], Units(sz["grow_ffn"], sz["grow_heads"]))
    tensors = {n: grow_tensor(n, plan, src.get) for n, _, _ in plan.outputs()}
    return checkpoint.save_tensors(str(work / "grown.safetensors"), plan.cfg, [], tensors, force=True)


def main():
    args = parse_args("fsdp_memory", __doc__)
    sz = SIZES["quick" if args.quick else "full"]
    work = args.dir / "work"
    work.mkdir(exist_ok=True)
    ckpt = make_checkpoint(work, sz)
    text = DATA if Path(DATA).exists() else None
    if text is None:  # memory does not depend on the text
        text = str(work / "text.txt")
        Path(text).write_text("the cat sees a hat. the dog sees the sea. " * 20000)
    rows, runs = [], []
    for mode in ("ddp", "fsdp"):
        out = work / f"run-{mode}"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        cmd += [__file__, "--worker", mode, ckpt, text, str(out), str(work / f"{mode}-rank%d.json")]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if p.returncode != 0:
            sys.exit(f"{mode} run failed:\n{p.stderr[-3000:]}")
        runs.append({"mode": mode, "wall_s": time.perf_counter() - t0})
        for r in range(2):
            rows.append(json.loads((work / f"{mode}-rank{r}.json").read_text()))
    for r in rows:
        r["params+optim_mb"] = r["params_mb"] + r["optim_mb"]
        r["train_above_start_mb"] = r["rss_train_peak_mb"] - r["rss_start_mb"]
        r["after_above_start_mb"] = r["rss_after_train_mb"] - r["rss_start_mb"]
    keys = ["mode", "rank", "params_mb", "optim_mb", "params+optim_mb", "rss_start_mb", "rss_load_peak_mb"]
    keys += ["rss_train_peak_mb", "train_above_start_mb", "after_above_start_mb", "rss_save_peak_mb", "ru_maxrss_mb"]
    keys += ["s_per_step"]
    shown = [{k: r[k] for k in keys} for r in rows]
    write_csv(args.dir / "memory.csv", shown)
    write_json(
        args.dir / "results.json",
        {
            "size": sz,
            "steps": STEPS,
            "batch": BATCH,
            "rows": rows,
            "runs": runs,
            "machine": machine(),
            "quick": args.quick,
        },
    )
    print(table(shown, f"fsdp_memory: {rows[0]['params']:,} parameters, 2 CPU processes (MB per rank)"))
    print(f"wrote {args.dir}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        mode, ckpt, text, out, result = sys.argv[2:7]
        worker(mode, ckpt, text, out, result % int(os.environ["RANK"]))
    else:
        main()
