"""Run a subject in a forked child process, so that the engine aborting the process is a
``crash`` the machine reports and shrinks instead of the end of the fuzzer.

TokenSpeed's scheduler ends the process on a failed internal check (``Fatal check failed`` then
``std::abort()``): in-process, one such step would kill kvcheck with no trace.  ``Forked``
builds the real subject in a child (``os.fork``) and forwards every call over a pipe; after
each call the child sends back what the machines read between ops (``requests``,
``reached_counts``, ``quiescing``).  When the child dies, the call raises a ``crash``
``Violation`` carrying the signal and the engine's last message (the child's stdout and stderr go
to a temporary file the parent reads).  The child exits when the proxy is collected or the parent
goes away (EOF on the pipe).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import tempfile
import weakref
from multiprocessing import Pipe

from invariants import Violation

# at most this many children stay alive: a newer subject reaps the oldest (the machines drive
# one subject at a time, and Hypothesis may keep finished ones referenced long after)
MAX_CHILDREN = 4
_LIVE: list = []  # weakref.finalize of each live child, oldest first

# what the machines read directly (not through a call); mirrored after every call
MIRRORED = ("requests", "waiting", "reached_counts", "quiescing", "steps")


def _last_message(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return ""
    fatal = [ln for ln in lines if "critical" in ln or "Fatal" in ln or "terminate" in ln
             or ln.startswith("what():")]
    if len(fatal) >= 2 and fatal[-1].startswith("what():"):  # std::terminate's two lines
        return " ".join(fatal[-2:])[:400]
    return (fatal or lines or [""])[-1][:400]


def _serve(conn, factory) -> None:
    subject = None
    try:
        subject = factory()
        conn.send(("ready", None, _mirror(subject)))
    except BaseException as exc:  # noqa: BLE001  report the build failure to the parent
        conn.send(_exc_reply(exc, subject))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        kind, name, args, kwargs = msg
        try:
            if kind == "set":
                setattr(subject, name, args)
                out = None
            elif kind == "get":
                out = getattr(subject, name)
            else:
                out = getattr(subject, name)(*args, **kwargs)
            conn.send(("ok", out, _mirror(subject)))
        except BaseException as exc:  # noqa: BLE001  the parent re-raises it
            conn.send(_exc_reply(exc, subject))


def _mirror(subject) -> dict:
    return {k: getattr(subject, k) for k in MIRRORED if hasattr(subject, k)}


def _exc_reply(exc, subject):
    mirror = _mirror(subject) if subject is not None else {}
    if isinstance(exc, Violation):
        return ("violation", (exc.prop, exc.message, exc.details), mirror)
    return ("exc", (type(exc).__module__, type(exc).__qualname__, str(exc), exc), mirror)


def _reap(pid, conn, errpath):
    try:
        conn.send(None)
    except (OSError, ValueError):
        pass
    try:
        conn.close()
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except OSError:
        pass
    try:
        os.unlink(errpath)
    except OSError:
        pass


class Forked:
    """A proxy for ``factory()`` (an instance of ``cls``) built and driven in a forked child:
    ``cls``'s methods run in the child, other attributes are read from it."""

    def __init__(self, factory, cls, label: str = "engine"):
        d = self.__dict__
        d["_cls"] = cls
        d["_label"] = label
        d["_dead"] = None
        fd, errpath = tempfile.mkstemp(prefix="kvcheck-child-", suffix=".err")
        parent, child = Pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 0
            try:
                parent.close()
                faulthandler.disable()  # an abort is reported by the parent, not dumped
                os.dup2(fd, 1)  # the engine logs to stdout and stderr
                os.dup2(fd, 2)
                _serve(child, factory)
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        os.close(fd)
        child.close()
        d["_pid"], d["_conn"], d["_errpath"] = pid, parent, errpath
        d["_finalizer"] = weakref.finalize(self, _reap, pid, parent, errpath)
        _LIVE[:] = [f for f in _LIVE if f.alive]
        _LIVE.append(self._finalizer)
        while len(_LIVE) > MAX_CHILDREN:
            _LIVE.pop(0)()
        self._receive("building the subject")

    # -- the wire ------------------------------------------------------------------------
    def _receive(self, what: str):
        try:
            status, payload, mirror = self._conn.recv()
        except (EOFError, OSError):
            self._died(what)
        self.__dict__.update(mirror)
        if status in ("ok", "ready"):
            return payload
        if status == "violation":
            prop, message, details = payload
            raise Violation(prop, message, **details)
        module, qualname, text, exc = payload
        raise exc

    def _died(self, what: str):
        if self._dead is None:
            _, status = os.waitpid(self._pid, 0)
            if os.WIFSIGNALED(status):
                how = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
            else:
                how = f"exited with status {os.WEXITSTATUS(status)}"
            self.__dict__["_dead"] = (how, _last_message(self._errpath))
        how, msg = self._dead
        raise Violation("crash", f"the {self._label} process was {how} during {what}"
                        + (f": {msg}" if msg else ""), exit=how, engine_message=msg) from None

    def _call(self, name, *args, **kwargs):
        if not self._finalizer.alive:
            raise RuntimeError(f"this {self._label} subject was superseded by newer ones "
                               f"(at most {MAX_CHILDREN} run at once) and its process reaped")
        if self._dead is not None:
            self._died(name)
        try:
            self._conn.send(("call", name, args, kwargs))
        except (OSError, ValueError):
            self._died(name)
        return self._receive(name)

    # -- attribute access ------------------------------------------------------------------
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if callable(getattr(self._cls, name, None)):  # a method: call it in the child
            return lambda *a, **k: self._call(name, *a, **k)
        if not self._finalizer.alive:
            raise RuntimeError(f"this {self._label} subject was superseded and reaped")
        if self._dead is not None:
            self._died(f"reading {name}")
        self._conn.send(("get", name, None, None))
        return self._receive(f"reading {name}")

    def __setattr__(self, name, value):
        if name in MIRRORED:
            self.__dict__[name] = value
        self._conn.send(("set", name, value, None))
        self._receive(f"setting {name}")

    def close(self) -> None:
        self._finalizer()

