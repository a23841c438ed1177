"""Distinct failures of one run: signatures, the ledger that dedupes them, known findings.

A run keeps searching after a failure (``fuzz``, ``gate``, ``nightly``; ``--stop-on-first``
keeps the old behaviour), so it needs to tell one bug from another:

* a failure's **signature** is the broken property, the name of the op it broke at, and the
  violation's message with every number and token list masked (``slot 10 is free but request
  r2 still reads it`` -> ``slot # is free but request r# still reads it``): two failures with
  one signature are one bug met twice, only counted;
* the **ledger** keeps, per signature, when it was first seen (seconds into the run), how often
  it was met, and its (shrunk) trace -- one trace per distinct failure;
* a failure is a **known finding** when -- in a run that drives known findings
  (``--known-findings find`` / ``find=ID``) -- its shrunk trace passes with a minimal model of
  that one finding's fix installed (``Subject.fix_models``: matched by mechanism), or, for a
  finding whose subject declares no fix model, once that finding is declined again; else,
  unless fix models decided it is none of them, when its signature is the one of a trace in
  the corpus ``tests/upstream_findings/`` (same variant, same engine;
  ``regressions.UPSTREAM_FINDINGS``, found from any working directory).  It is labelled with
  the finding's id (``R1``) and does not end the search.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from caches.target import DECLINE, FIND, driven_findings
from state_machines.signature import Signature, mask  # noqa: F401  (re-exported)

_RELEASE = re.compile(r"^\d+(\.\d+)+-")


@dataclass
class Failure:
    """One distinct failure of a run."""

    signature: Signature
    first_seen: float  # seconds into the run
    count: int = 1
    trace: object = None  # Trace (shrunk)
    trace_path: Path | None = None
    known: str | None = None  # the known finding's id ("R1"), if it is one
    engine: str = "hypothesis"
    driven: bool = False  # a known finding the run was asked to find (--known-findings)

    @property
    def new(self) -> bool:
        return self.known is None

    @property
    def counts(self) -> bool:
        """Whether it makes the run fail: a new failure, or a known finding the run drives."""
        return self.known is None or self.driven

    def to_json(self) -> dict:
        return {"signature": self.signature.to_json(), "first_seen": round(self.first_seen, 2),
                "count": self.count, "known": self.known, "driven": self.driven,
                "engine": self.engine, "steps": len(self.trace.ops) if self.trace else None,
                "trace": str(self.trace_path) if self.trace_path else None}


@dataclass
class Ledger:
    """Distinct failures by signature, in the order first seen."""

    failures: dict = field(default_factory=dict)  # Signature -> Failure

    def __contains__(self, sig) -> bool:
        return sig in self.failures

    def __iter__(self):
        return iter(self.failures.values())

    def __len__(self) -> int:
        return len(self.failures)

    def seen(self, sig: Signature, at: float, n: int = 1) -> bool:
        """Count ``n`` meetings of ``sig`` (the first at ``at`` s); True if it is new."""
        f = self.failures.get(sig)
        if f is not None:
            f.count += n
            return False
        self.failures[sig] = Failure(sig, at, n)
        return True

    def record(self, trace, at: float, *, engine: str = "hypothesis",
               count: int = 1) -> Failure:
        """A (shrunk) failing trace: a new distinct failure, or one more meeting of one."""
        sig = Signature.of_trace(trace)
        if self.seen(sig, at, count):
            f = self.failures[sig]
            f.trace, f.engine = trace, engine
        return self.failures[sig]

    def merge(self, other: "Ledger") -> None:
        for sig, f in other.failures.items():
            mine = self.failures.get(sig)
            if mine is None:
                self.failures[sig] = f
            else:
                mine.count += f.count
                mine.first_seen = min(mine.first_seen, f.first_seen)
                if mine.trace is None or (f.trace is not None
                                          and len(f.trace.ops) < len(mine.trace.ops)):
                    mine.trace, mine.trace_path = f.trace, f.trace_path

    @property
    def failing(self) -> list:
        return [f for f in self if f.counts]


# -- known findings -----------------------------------------------------------------------------
@lru_cache(maxsize=4)
def _corpus(folder: str) -> tuple:
    """``(variant, engine, Signature, id)`` for every trace in the corpus (unreadable ones and
    targets not registered here are left out)."""
    from state_machines.trace import TraceError, load_trace  # deferred: loads torch and engines
    out = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            trace = load_trace(path)
        except TraceError:
            continue
        sig = Signature.of_trace(trace)
        fid = finding_id(trace, path)
        if sig is not None and fid:
            out.append((trace.variant, _engine(trace.target), sig, fid))
    return tuple(out)


def finding_id(trace, path: Path | None = None) -> str | None:
    """The short id of a corpus trace's finding: ``meta.known_finding``'s last part
    (``pymllm-radix-F1`` -> ``F1``), else the file name's (``<engine>-[<release>-]<variant>-
    <ID>-...``)."""
    name = (trace.meta or {}).get("known_finding")
    if isinstance(name, str) and name:
        return name.rsplit("-", 1)[-1]
    if path is not None:
        rest = path.stem[len(trace.target):].lstrip("-")
        rest = _RELEASE.sub("", rest)  # a release's own copy: sglang-0.5.10-himamba-F6-...
        rest = rest[len(trace.variant):].lstrip("-") if rest.startswith(trace.variant) else rest
        return rest.split("-", 1)[0] or None
    return None


def _engine(target: str) -> str:
    from state_machines.targets import UnknownTarget, get_target

    try:
        return get_target(target).engine
    except (UnknownTarget, Exception):  # noqa: BLE001  a made-up pair target
        return target


def known_by_signature(trace, corpus: Path | None = None) -> str | None:
    """The id of the corpus finding with ``trace``'s signature (same variant and engine;
    ``corpus`` defaults to the installed ``tests/upstream_findings``)."""
    if corpus is None:
        from state_machines.regressions import UPSTREAM_FINDINGS as corpus
    sig = Signature.of_trace(trace)
    engine = _engine(trace.target)
    for variant, eng, s, fid in _corpus(str(corpus)):
        if variant == trace.variant and eng == engine and s == sig:
            return fid
    return None


def known_by_replay(trace) -> tuple[str | None, bool]:
    """In a run that drives known findings: ``(id, decided)`` -- the finding whose mechanism
    ``trace`` needs, and whether fix models decided it.

    For each finding the run drove: where the subject declares a model of its fix
    (``Subject.fix_models``), the trace is that finding when it passes with that fix alone
    installed (every other finding as the recorded run had it); where it declares none, when
    it passes once that finding is declined again.  ``decided`` is True when every candidate
    had a fix model: then a trace no fix removes is new, whatever its signature (a broad
    decline, or a signature shared by two mechanisms, must not hide a new bug).  A trace that
    no longer fails as recorded (a finding declared since) names none."""
    from caches.subjects.base import NoFixModel
    from state_machines.replay import replay  # deferred: loads torch and engines
    from state_machines.targets import UnknownTarget, get_target

    if trace.target == "reference" or trace.known_findings == DECLINE:
        return None, False
    try:
        declared = tuple(get_target(trace.target).findings.get(trace.variant, ()))
    except UnknownTarget:
        return None, False
    driven = driven_findings(trace.known_findings)
    candidates = [i for i in declared if driven is None or i in driven]
    if not candidates:
        return None, False
    try:
        if replay(trace).violation is None:
            return None, False
    except Exception:  # noqa: BLE001
        return None, False
    decided = True
    for fid in candidates:
        try:
            result = replay(trace, fix=fid)
        except NoFixModel:
            decided = False
            rest = [i for i in candidates if i != fid]
            setting = FIND + "=" + ",".join(rest) if rest else DECLINE
            try:
                result = replay(trace, known_findings=setting)
            except Exception:  # noqa: BLE001  the replay itself failed: no attribution
                continue
        except Exception:  # noqa: BLE001
            decided = False
            continue
        if result.violation is None:
            return fid, True
    return None, decided


def label(failure: Failure, corpus: Path | None = None) -> Failure:
    """Label ``failure`` with its known finding's id, if it is one; ``driven`` when the run's
    ``--known-findings`` asked for that finding."""
    trace = failure.trace
    if trace is None:
        return failure
    # a driven finding can surface at another finding's op (LightLLM's L4 leaks the root ref
    # at a deref, the next admit reports it where L2's trace does): the replay, which names
    # the finding whose ops the trace needs, goes first
    fid, decided = known_by_replay(trace)
    if fid is None and not decided:
        fid = known_by_signature(trace, corpus)
    failure.known = fid
    if fid is not None:
        driven = driven_findings(trace.known_findings)
        failure.driven = trace.known_findings != DECLINE and (driven is None or fid in driven)
    return failure
