"""glibc malloc settings for a training process: give freed activations back to the OS.

An update allocates and frees hundreds of MB of activations per micro-batch. glibc's
default mmap threshold is dynamic: after the first large block is freed it rises (up to
32 MiB on 64-bit), so later activations come from the heap, where freed memory stays
resident and fragments — a CPU demo step then peaks at several times its live memory.
A static threshold keeps every block of 128 KiB or more in its own mapping, unmapped on
free. Many agent and server threads would each get an arena of their own; capping the
arenas bounds that too. Measured in benchmarks/README.md (Training).

Only glibc has ``mallopt`` with these parameters; elsewhere (musl, macOS, Windows) this
does nothing. ``BOLTRL_MALLOC_TUNING=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

log = logging.getLogger(__name__)

__all__ = ["tune_malloc"]

_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 128 * 1024
"""Blocks of at least this many bytes are mapped on their own and unmapped on free."""
ARENA_MAX = 4
"""Upper bound on malloc arenas (glibc's default is 8 per core)."""

_done = False


def tune_malloc() -> bool:
    """Apply the settings once per process; True when they are in effect.

    Never raises: a libc without ``mallopt`` (or a refusal) is logged at debug level and
    leaves the allocator as it was. Thread-safe enough to call from the main thread at
    start-up, before the runner threads exist (arenas already created stay).
    """
    global _done
    if _done:
        return True
    if os.environ.get("BOLTRL_MALLOC_TUNING", "1").strip().lower() in ("0", "false", "no", "off"):
        log.debug("malloc tuning off (BOLTRL_MALLOC_TUNING)")
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as e:
        log.debug("malloc tuning unavailable: %s", e)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1)
    ok = bool(mallopt(_M_ARENA_MAX, ARENA_MAX) == 1) and ok
    _done = ok
    log.debug("malloc tuning %s", "applied" if ok else "refused by libc")
    return ok
