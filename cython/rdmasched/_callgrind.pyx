# cython: language_level=3, boundscheck=False, wraparound=False
"""Callgrind client requests, for counting the instructions of one stage of a path.

`rdmasched bench stages` runs the daemon's message path under `valgrind --tool=callgrind
--collect-atstart=no` and turns collection on around exactly one stage of every message
(`toggle()` before and after it), so the run's total is that stage's instructions. Outside
valgrind every call here is a handful of no-op instructions. Built only where valgrind's
headers are (Debian: valgrind); see setup.py.
"""

cdef extern from *:
    """
    #include <valgrind/callgrind.h>
    static void rs_cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
    static void rs_cg_zero(void) { CALLGRIND_ZERO_STATS; }
    static int rs_cg_on_valgrind(void) { return (int)RUNNING_ON_VALGRIND; }
    """
    void rs_cg_toggle() nogil
    void rs_cg_zero() nogil
    int rs_cg_on_valgrind() nogil


def toggle() -> None:
    """Turn callgrind's collection on if off, off if on."""
    rs_cg_toggle()


def zero() -> None:
    """Reset callgrind's counters."""
    rs_cg_zero()


def on_valgrind() -> bool:
    """Whether this process runs under valgrind."""
    return rs_cg_on_valgrind() != 0
