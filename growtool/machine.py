"""Process tuning: threads for tensor surgery, the idle check, resident memory, libc calls.

Imports no torch at module level (``surgery_threading`` imports it when it runs), so both the
library (``growtool.grow``, ``growtool.io``) and the command line can use it."""

from __future__ import annotations

import contextlib
import functools
import os
import sys


@functools.cache
def linux_call(name: str, *argtypes: str):
    """libc's function ``name`` with ctypes argument types ``argtypes`` (names such as "c_int"),
    looked up once; None off Linux or where libc lacks it (callers then do without)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = [getattr(ctypes, a) for a in argtypes]
    return fn


def surgery_threads() -> int:
    """Threads for tensor surgery: every core, up to 8 (``GROWTOOL_THREADS`` to choose)."""
    if os.environ.get("GROWTOOL_THREADS", "").isdigit():
        return max(1, int(os.environ["GROWTOOL_THREADS"]))
    return min(os.cpu_count() or 1, 8)


def machine_is_idle() -> bool:
    """No other job holds a core (1-minute load average below cores - 0.5)."""
    try:
        return os.getloadavg()[0] < (os.cpu_count() or 1) - 0.5
    except OSError:
        return True


def resident_bytes() -> int:
    """This process's resident memory now (Linux; 256 MB where it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 256 << 20


def one_malloc_arena() -> None:
    """Have glibc serve every thread from one arena of memory. By default each thread that
    allocates gets its own (up to 8 per core), and each keeps the blocks of up to 32 MB freed in
    it for reuse: with 8 producing threads the 1 GB float32 expand peaked at 1.0 GB instead of
    0.78-0.87 (bench/README, section 3), at the same speed. (Mapping blocks over 4 MB on their own
    instead, ``M_MMAP_THRESHOLD``, saved as much but cost the 4 GB folder 3 s of page faults.)
    Call before the threads start; elsewhere than glibc, nothing."""
    mallopt = linux_call("mallopt", "c_int", "c_int")
    if mallopt is not None:
        mallopt(-8, 1)  # M_ARENA_MAX (malloc.h)


@contextlib.contextmanager
def surgery_threading(streaming: bool = False):
    """Run tensor surgery on ``surgery_threads()`` threads; yields that count.

    A streaming expand / fold produces that many tensors at once, one Python thread each, with
    torch on one thread: most operations take about a millisecond, where OpenMP's start and wait
    cost as much as they save; threads of our own simply share the cores with any other job.
    In-memory surgery gives the threads to torch instead, and only on an idle machine: OpenMP's
    threads wait for each other whenever another job holds a core (the 120 MB grow took 0.9 s on
    one thread and 11 s on two on a 2-core machine shared with another job)."""
    import torch

    n, before = surgery_threads(), torch.get_num_threads()
    if streaming:
        one_malloc_arena()
    torch.set_num_threads(1 if streaming else (n if "GROWTOOL_THREADS" in os.environ or machine_is_idle() else 1))
    try:
        yield n
    finally:
        torch.set_num_threads(before)
