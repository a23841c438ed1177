"""Shared helpers for the harness's own tests: run a fault once per session, list regimes,
let a child see Ctrl-C, wait for a condition."""

from __future__ import annotations

import functools
import signal

from caches.faults import all_faults
from state_machines.commands.faults import search
from state_machines.variants import all_variants, get_variant

# a caught fault's shrunk trace is at most this long.  12 held until the radix and himamba
# alphabets gained the lifecycle ops (decode, retract, batch admission): the policy faults P3
# and P5 now shrink to 15-16 steps in the ci profile (an enqueue/schedule burst the shrinker
# does not take apart), so the bound is 20 -- still far below an unshrunk run's hundreds.
MAX_SHRUNK_STEPS = 20
# the per-op deadline of the tests that run the hang fault T1: each hanging attempt (finding
# it, and every shrink step that still hangs) waits this long, and a legitimate op here takes
# milliseconds (the rest of the suite runs under 2 s: tests/conftest.py)
HANG_DEADLINE = "0.5"


def all_regimes():
    """(variant, params) for every regime of every landed variant."""
    return [(spec.name, spec.check_params(r)) for spec in all_variants().values()
            for r in spec.regimes]


def landed_faults():
    variants = all_variants()
    return sorted((f for f in all_faults().values() if f.variant in variants),
                  key=lambda f: (f.variant, len(f.id), f.id))


@functools.lru_cache(maxsize=None)
def fault_outcome(fid: str):
    """Fuzz with fault ``fid`` on (derandomised, ci profile) as ``kvcheck faults`` does:
    Hypothesis to the first failure (up to its ``FAULT_EXAMPLES``), shrunk by kvcheck's own
    shrinker; cached within a process."""
    f = all_faults()[fid]
    spec = get_variant(f.variant)
    params = spec.check_params({**spec.regimes[0], **f.params})
    return search("hypothesis")(spec, params, fault=fid)


def assert_caught_on_upstream(spec, params: dict, fid: str, out_dir, target: str = "sglang"):
    """Fault ``fid`` patched into ``target``'s real class: the fuzzer catches it on one of the
    catalogue's properties for it, shrunk to at most ``MAX_SHRUNK_STEPS``; the saved trace
    replays to the same violation at the same step, and its ops pass on the unpatched class."""
    from state_machines.replay import replay
    from state_machines.trace import load_trace

    f = all_faults()[fid]
    # as ``kvcheck faults`` searches: on past a failure on another property, for the fault's own
    out = search("hypothesis")(spec, params, fault=fid, target=target, out_dir=out_dir)
    assert out.error is None, out.error
    assert out.failed, f"{fid} was not caught on the {target} target of {spec.name}"
    assert out.prop in f.properties, out.trace.violation
    assert len(out.trace.ops) <= MAX_SHRUNK_STEPS
    trace = load_trace(out.trace_path)
    again = replay(trace)
    assert again.violation is not None and again.violation.prop == out.prop
    assert again.failed_step == trace.violation["step"]
    trace.fault = None  # the same ops pass on the unpatched class
    assert replay(trace).ok
    return out


def default_sigint() -> None:
    """A ``preexec_fn`` for a child a test will Ctrl-C: SIGINT's default disposition, whatever
    the suite was started with (a shell starts a background job with SIGINT ignored, and a
    child inherits that: it would never see the test's Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until(condition, what: str, timeout: float = 300.0, proc=None):
    """Block until ``condition()`` holds -- a state the test needs, never a length of time:
    a loaded machine only makes the wait longer.  Fails saying ``what`` did not happen (or
    that ``proc`` ended first) after ``timeout`` seconds, a bound for a hung child only."""
    import time

    end = time.monotonic() + timeout
    while not condition():
        assert proc is None or proc.poll() is None, f"the child ended before {what}"
        assert time.monotonic() < end, f"{what}: not within {timeout:.0f}s"
        time.sleep(0.05)


def seen_eviction_passes(monkeypatch, subject_cls) -> set:
    """The kinds of eviction pass (``evict``, ``evict_mamba``, ``evict_host``) whose victims
    ``subject_cls``'s policy checks were handed, filled in as the run goes: a test that the
    checks watch the real tree, rather than pass by seeing nothing."""
    seen = set()
    check = subject_cls.check_policy

    def recording(self):
        seen.update(ev[0] for ev in self._policy_events
                    if ev[0].startswith("evict") and ev[3])
        return check(self)

    monkeypatch.setattr(subject_cls, "check_policy", recording)
    return seen


def logged_evict_for_alloc(tree) -> list:
    """SGLang 0.5.23's ``tree.evict_for_alloc`` (the scheduler's eviction before an
    allocation) wrapped on this instance: the list it returns gains ``(tokens asked, tokens
    evicted)`` per call."""
    log, evict_for_alloc = [], tree.evict_for_alloc

    def logged(params, *args, **kwargs):
        out = evict_for_alloc(params, *args, **kwargs)
        log.append((params.num_tokens, int(out.num_tokens_evicted)))
        return out

    tree.evict_for_alloc = logged
    return log


# runs a generated report script with kvcheck made unimportable (python -c NO_KVCHECK SCRIPT):
# the script must reproduce the finding with the engine alone
NO_KVCHECK = """import runpy, sys
class NoKvcheck:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("caches", "state_machines", "invariants", "tests"):
            raise ImportError("the script imported kvcheck: " + name)
sys.meta_path.insert(0, NoKvcheck())
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
