"""A stop the user asked for (Ctrl-C, SIGTERM) that always ends the run.

The signal handler raises ``KeyboardInterrupt`` where the signal lands, as Python's own does.
That exception can be lost on its way out: raised inside a garbage-collector callback or a
``__del__`` it is printed and dropped, and inside CPython's AST constructor (Hypothesis compiles
code as it runs) it comes out as a ``SystemError`` that Hypothesis's shrinker takes for a test
failure and goes on shrinking.  So the handler also *records* the stop: the machines look at
``stop_requested()`` before every example and every native walk and end the run from there.
A second signal, or a first one that has not ended the run within ``GRACE`` seconds, ends the
process at once with exit 3 (the traces already saved stay on disk).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

EXIT_INTERRUPTED = 3
GRACE = 20.0  # seconds a stop may take to unwind before the process is ended

_requested: list = []  # the signals received while a handler of ours was installed
_timer: list = []  # the GRACE timer of the first one
_depth = [0]  # stop_on_signals blocks open (a fresh outermost one forgets an earlier stop)


def stop_requested() -> bool:
    """A stop came while a ``stop_on_signals`` block is open (outside one, a stop left from an
    earlier run is not this one's)."""
    return bool(_requested) and _depth[0] > 0


def reset() -> None:
    """Forget an earlier stop (a long-lived caller starting a new run), and its timer."""
    _requested.clear()
    while _timer:
        _timer.pop().cancel()


def _force_exit(why: str) -> None:
    try:
        sys.stderr.write(f"kvcheck: interrupted ({why}); the traces saved so far are kept\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_INTERRUPTED)


# where an exception is printed and dropped: there the stop is only recorded
SWALLOWING = ("gc_callback", "__del__")


def _handler(signum, frame):
    if _requested:  # the second one: no more waiting
        _force_exit("a second signal")
    _requested.append(signum)
    timer = threading.Timer(GRACE, _force_exit, args=(f"it did not stop within {GRACE:g}s",))
    timer.daemon = True
    timer.start()
    _timer.append(timer)
    if frame is not None and frame.f_code.co_name in SWALLOWING:
        return  # (Python would print "Exception ignored in ..." and go on)
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def stop_on_signals(signals=(signal.SIGINT, signal.SIGTERM)):
    """Install the handler for ``signals`` while the body runs (main thread only; elsewhere a
    no-op), then put the earlier handlers back.  The outermost block starts with no stop
    recorded and, as it ends, cancels the GRACE timer (the stop did end the run)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth[0] == 0:
        reset()
    old = {s: signal.signal(s, _handler) for s in signals}
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        for s, h in old.items():
            signal.signal(s, h)
        if _depth[0] == 0:
            while _timer:
                _timer.pop().cancel()
