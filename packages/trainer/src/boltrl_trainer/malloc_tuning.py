"""glibc malloc settings for a training process, switched by phase.

An update allocates and frees hundreds of MB of activations per micro-batch. glibc's
default mmap threshold is dynamic: after the first large block is freed it rises (up to
32 MiB on 64-bit), so later activations come from the heap, where freed memory stays
resident and fragments — a CPU demo step then peaks at several times its live memory.
During an update a static threshold of 128 KiB keeps every large block in its own
mapping, unmapped on free.

Generation is the opposite case: every decoded token allocates and frees blocks of a few
hundred KiB (logits, attention scratch, the growing cache), and a 128 KiB threshold
turns each into an mmap, a page-faulting first touch and an munmap. That halved
generation speed on CPU (60 calc_agent validation tasks: 71-77 s plain, 116-120 s with
the static threshold). So the low threshold holds only inside :func:`update_phase`;
outside it the thresholds are the ceiling of glibc's dynamic rule (32 MiB mmap, 64 MiB
trim), and entering an update first hands the heap's free pages back to the OS
(``malloc_trim``). An update may still reuse a free heap chunk that generation left (its
pages fault in again and stay resident until the next trim), so its peak can exceed the
update's own by at most generation's heap: in the calc_agent RL run that measured this,
the whole process peaked at 4.84 GB against 5.04 GB with a static 128 KiB threshold
throughout, and ran 4 min 16 s instead of 7 min 3 s (the "Malloc by phase" section of
benchmarks/README.md). Many agent and server threads would each get an arena of their
own; capping the arenas bounds that too.

Only glibc has ``mallopt`` with these parameters; elsewhere (musl, macOS, Windows) this
does nothing. ``BOLTRL_MALLOC_TUNING=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["tune_malloc", "update_phase"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 128 * 1024
"""During an update, blocks of at least this many bytes are mapped on their own and
unmapped on free."""
TRIM_THRESHOLD = 128 * 1024
"""During an update, free memory above this at a heap's top goes back to the OS (glibc's
initial value)."""
GENERATE_MMAP_THRESHOLD = 32 * 1024 * 1024
"""Outside updates: glibc's dynamic ceiling (``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit),
where its own rule would settle after freeing a few large blocks."""
GENERATE_TRIM_THRESHOLD = 2 * GENERATE_MMAP_THRESHOLD
"""Outside updates: twice the mmap threshold, as glibc's dynamic rule sets it, so the
heap's top is not shrunk and regrown on every decoded token."""
ARENA_MAX = 4
"""Upper bound on malloc arenas (glibc's default is 8 per core)."""

_libc: Any = None  # set once tune_malloc() has applied the settings
_lock = threading.Lock()
_updates = 0  # update phases in progress (async training overlaps them with generation)


def _off_by_env() -> bool:
    return os.environ.get("BOLTRL_MALLOC_TUNING", "1").strip().lower() in (
        "0",
        "false",
        "no",
        "off",
    )


def _set(libc: Any, mmap_threshold: int, trim_threshold: int) -> bool:
    ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1)
    return bool(libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1) and ok


def tune_malloc() -> bool:
    """Apply the settings once per process; True when they are in effect.

    Caps the arenas and sets the generation thresholds; :func:`update_phase` switches to
    the update's for its duration. Never raises: a libc without ``mallopt`` (or a
    refusal) is logged at debug level and leaves the allocator as it was. Call it from
    the main thread at start-up, before the runner threads exist (arenas already
    created stay).
    """
    global _libc
    if _libc is not None:
        return True
    if _off_by_env():
        log.debug("malloc tuning off (BOLTRL_MALLOC_TUNING)")
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError) as e:
        log.debug("malloc tuning unavailable: %s", e)
        return False
    with _lock:
        ok = bool(libc.mallopt(_M_ARENA_MAX, ARENA_MAX) == 1)
        if _updates:
            ok = _set(libc, MMAP_THRESHOLD, TRIM_THRESHOLD) and ok
        else:
            ok = _set(libc, GENERATE_MMAP_THRESHOLD, GENERATE_TRIM_THRESHOLD) and ok
        if ok:
            _libc = libc
    log.debug("malloc tuning %s", "applied" if ok else "refused by libc")
    return ok


@contextmanager
def update_phase() -> Iterator[None]:
    """Hold the update's settings while the block runs (re-entrant, thread-safe).

    The first phase to enter trims the heaps and lowers the thresholds; the last to
    leave restores the generation settings. Without :func:`tune_malloc` in effect (not
    glibc, turned off, or never called) it does nothing.
    """
    global _updates
    with _lock:
        _updates += 1
        if _updates == 1 and _libc is not None:
            _libc.malloc_trim(0)  # generation's freed pages, before the update's peak
            _set(_libc, MMAP_THRESHOLD, TRIM_THRESHOLD)
    try:
        yield
    finally:
        with _lock:
            _updates -= 1
            if _updates == 0 and _libc is not None:
                _set(_libc, GENERATE_MMAP_THRESHOLD, GENERATE_TRIM_THRESHOLD)
