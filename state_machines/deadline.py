"""A per-op wall-clock deadline: an op (or the invariant check after it) that does not return
within it is a ``hang`` finding, not a run that never ends.

How the op is interrupted, in the same process (no subprocess per op: a step costs ~250 us):

- in the main thread (the CLI, ``pytest``, and pytest-xdist workers, which run tests in their
  main thread): ``signal.setitimer(ITIMER_REAL)`` + a ``SIGALRM`` handler that raises
  ``Hang``.  A signal also breaks a blocking ``sleep``/``select``/lock wait (the handler raises,
  so PEP 475 does not retry the call).  Another user of ``SIGALRM``/``ITIMER_REAL`` (e.g.
  pytest-timeout) gets its handler and the rest of its timer back after every op.
- in any other thread (signals only reach the main thread): a watchdog ``threading.Timer``
  that schedules ``Hang`` in the op's thread with ``PyThreadState_SetAsyncExc``.  That
  interrupts Python code at the next bytecode; a call blocked in C (a lock, a long torch
  kernel) is interrupted only when it returns.  A watchdog that fires as the op finishes has
  its pending exception absorbed before it can land elsewhere.

Many ops in a row (a native walk, a shrink) share one ``Ticker`` instead: one periodic
``SIGALRM`` for the whole batch, every ``tick`` seconds, whose handler raises ``Hang`` once the
current op's expiry time has passed; each op only stamps that time (``Ticker.guard``), so the
deadline costs no system call per op.  An overrun is caught within ``seconds + tick``.

``Hang`` derives from ``BaseException``, so a cache's ``except Exception`` cannot swallow it.
The deadline: ``--op-deadline SECONDS`` (the CLI sets ``$KVCHECK_OP_DEADLINE``, so nightly
workers inherit it), default ``DEFAULT_SECONDS``; 0 switches it off.
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import threading
import time
from contextlib import contextmanager

# Shrinking a hang costs a full per-op deadline per attempt that still hangs: after this many
# deadlines' worth (Hypothesis's shrink: hanging runs; kvcheck's shrinker: seconds), stop with
# the shortest hanging trace seen so far.
HANG_SHRINK_LIMIT = 5

ENV = "KVCHECK_OP_DEADLINE"
DEFAULT_SECONDS = 10.0


class Hang(BaseException):
    """An op overran its deadline (raised inside it, to unwind it)."""

    def __init__(self, seconds: float):
        super().__init__(f"did not return within {seconds:g}s")
        self.seconds = seconds


def parse_seconds(text: str) -> float:
    """``--op-deadline`` / ``$KVCHECK_OP_DEADLINE``: finite seconds >= 0 (0: off)."""
    v = float(text)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"the op deadline must be a finite number of seconds >= 0, got {text!r}")
    return v


def op_deadline() -> float:
    """The per-op deadline in seconds (0: none)."""
    raw = os.environ.get(ENV)
    if raw is None or raw == "":
        return DEFAULT_SECONDS
    try:
        return parse_seconds(raw)
    except ValueError:
        return DEFAULT_SECONDS


@contextmanager
def deadline(seconds: float | None):
    """Raise ``Hang`` inside the body if it runs longer than ``seconds`` (None/0: no limit)."""
    if not seconds:
        yield
        return
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        with _alarm(seconds):
            yield
    else:
        with _watchdog(seconds):
            yield


@contextmanager
def _alarm(seconds: float):
    def on_alarm(signum, frame):
        raise Hang(seconds)

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield
    finally:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, old_handler)
            if old_delay > 0:  # someone else's timer: re-arm what is left of it
                left = old_delay - (time.monotonic() - started)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), old_interval)


_ticking: "Ticker | None" = None  # the Ticker in force (main thread only)


def ticking(seconds: float) -> "Ticker | None":
    """The Ticker in force for ops with a ``seconds`` deadline, if any (else use ``deadline``)."""
    t = _ticking
    return t if t is not None and t.seconds == seconds else None


class Ticker:
    """A coarse per-op deadline for a batch of ops in the main thread (see the module doc):
    ``with Ticker(seconds):`` around the batch, ``Ticker.guard()``/``Ticker.clear()`` around
    each op.  Elsewhere (another thread, no ``setitimer``, a ticker already in force, no
    deadline) it does nothing and ops fall back to ``deadline``."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.expires = math.inf
        self._installed = False

    def guard(self) -> None:
        self.expires = time.monotonic() + self.seconds

    def clear(self) -> None:
        self.expires = math.inf

    def _on_alarm(self, signum, frame):
        if time.monotonic() > self.expires:
            self.expires = math.inf
            raise Hang(self.seconds)

    def __enter__(self) -> "Ticker":
        global _ticking
        if (not self.seconds or _ticking is not None or not hasattr(signal, "setitimer")
                or threading.current_thread() is not threading.main_thread()):
            return self
        tick = min(0.25, self.seconds / 4)
        self._old_handler = signal.signal(signal.SIGALRM, self._on_alarm)
        self._old_timer = signal.setitimer(signal.ITIMER_REAL, tick, tick)
        self._started = time.monotonic()
        self._installed, _ticking = True, self
        return self

    def __exit__(self, *exc) -> None:
        global _ticking
        if not self._installed:
            return
        self._installed, _ticking = False, None
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, self._old_handler)
            old_delay, old_interval = self._old_timer
            if old_delay > 0:  # someone else's timer: re-arm what is left of it
                left = old_delay - (time.monotonic() - self._started)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), old_interval)


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)


@contextmanager
def _watchdog(seconds: float):
    tid = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "fired": False}

    class _ThreadHang(Hang):  # SetAsyncExc takes a class: bake the seconds in
        def __init__(self):
            super().__init__(seconds)

    def fire():
        with lock:
            if not state["done"]:
                state["fired"] = True
                _set_async_exc(tid, _ThreadHang)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    landed = False
    try:
        yield
    except _ThreadHang:
        landed = True
        raise
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
        if state["fired"] and not landed:
            # the watchdog fired as the body finished: its exception is pending and lands
            # at the next bytecode check -- absorb it here, not in the caller.  (Clearing it
            # with SetAsyncExc(tid, NULL) instead leaves CPython 3.11's eval breaker set for
            # good, which made later ops spin.)
            try:
                for _ in range(10_000_000):
                    pass
            except _ThreadHang:
                pass
