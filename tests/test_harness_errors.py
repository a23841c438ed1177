"""Red means the engine broke, never kvcheck: a programming error raised in kvcheck's own code
during an op or its checks is a harness error (``HarnessError``; the CLI exits 4), while the
same error raised in an engine's code is that engine's ``crash``."""

from __future__ import annotations

import pytest

import caches.subjects.hybrid_swa as hybrid_subject
from invariants import Violation
from invariants.window import WindowNode
from state_machines.fuzz import fuzz
from state_machines.ops import Op
from state_machines.run import HarnessError, Run, harness_bug
from state_machines.variants import get_variant

SPEC = get_variant("hybrid-swa")
ADMIT = Op("admit", {"rid": 1, "tokens": [0, 1, 2]})


def engine_function(exc_type):
    """A function whose frames are an engine's file, not kvcheck's."""
    ns: dict = {}
    exec(compile(f"def boom(*a, **k):\n    raise {exc_type}('the engine failed')\n",
                 "/opt/engine/mem_cache/cache.py", "exec"), ns)
    return ns["boom"]


def test_a_type_error_in_kvcheck_code_is_a_harness_error(monkeypatch):
    # the wrong record class: the TypeError is raised in the subject's own frame
    monkeypatch.setattr(hybrid_subject, "WindowState", WindowNode)
    run = Run(SPEC, SPEC.regimes[0])
    with pytest.raises(HarnessError, match=r"kvcheck's own code failed at "
                                           r"subjects/hybrid_swa\.py:\d+ .*TypeError"):
        run.apply(ADMIT)
    assert run.violation is None  # no verdict was recorded


def test_the_same_error_raised_by_the_engine_is_its_crash(monkeypatch):
    run = Run(SPEC, SPEC.regimes[0])
    monkeypatch.setattr(run.subject.cache, "inc_lock_ref", engine_function("TypeError"))
    with pytest.raises(Violation) as err:
        run.apply(ADMIT)
    assert err.value.prop == "crash" and "TypeError" in err.value.message


def test_the_reference_models_own_assertions_stay_crashes():
    from caches.radix import LockUnderflow

    try:
        raise LockUnderflow("window lock of node 3 is already 0")
    except LockUnderflow as exc:
        assert harness_bug(exc) is None
    try:
        raise AttributeError("x")  # raised here, in the tests: not kvcheck's packages
    except AttributeError as exc:
        assert harness_bug(exc) is None


def test_fuzz_reports_a_harness_error_not_a_failure(monkeypatch):
    monkeypatch.setattr(hybrid_subject, "WindowState", WindowNode)
    out = fuzz(SPEC, SPEC.regimes[0], max_examples=5)
    assert not out.failed and out.trace is None
    assert out.error and "HarnessError" in out.error and "TypeError" in out.error
