"""The historical release SGLang 0.5.10.post1, driven by the 0.5.12.post1 adapters unpatched
(the differences are ``caches/adapters/sglang/versions.py`` shims): what kvcheck finds there.

Runs only in ``.venv-upstream-0.5.10.post1`` (``bash ci/upstream/setup.sh 0.5.10.post1``; CI does
not build it): ``.venv-upstream-0.5.10.post1/bin/python -m pytest -q
tests/upstream/test_sglang_historical_0_5_10.py``.  Elsewhere the module skips, saying why.
"""

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.10.post1")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from caches.adapters.sglang.streaming_session import make_subject  # noqa: E402
from invariants import Violation  # noqa: E402
from state_machines import radix, streaming_session  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.targets import get_target  # noqa: E402

SS = streaming_session.SPEC
PARAMS = {"page_size": 1, "pool_pages": 40, "req_rows": 6}


def _run(ops, params=PARAMS):
    """Drive ``ops`` on a fresh 0.5.10.post1 subject with every check; the violation, if any."""
    s = make_subject(params, skip_known_findings=False)
    try:
        for name, args in ops:
            SS.ops.apply(s, Op(name, args))
            s.check()
        s.quiesce()
    except Violation as v:
        return v
    return None


def test_the_release_and_its_classes_load():
    assert loader.load().version == "0.5.10.post1"
    s = get_target("sglang").build("streaming-session", SS.check_params(PARAMS))
    assert type(s.cache.session).__name__ == "SessionAwareCache"
    assert s.cache.req_to_token_pool.free_slots[0] == 0  # rows from 0 on this release
    reason = get_target("sglang").variant_unavailable("himamba", None)
    assert "0.5.12.post1" in reason


@pytest.mark.parametrize("params", radix.SPEC.regimes, ids=["ps1", "ps4"])
def test_radix_is_clean(params):
    out = fuzz(radix.SPEC, radix.SPEC.check_params(params), target="sglang", max_examples=40,
               seed=0)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 500


def test_abort_keeps_the_slot():
    """``SessionAwareCache.cache_finished_req`` has no abort branch: an aborted turn is saved as
    the session's slot (fixed by PR #22790, "Refactor streaming session abort handling")."""
    v = _run([("open_session", {"sid": 1}), ("turn", {"sid": 1, "tokens": [0]}),
              ("abort_turn", {"sid": 1})])
    assert v is not None and v.prop == "conservation"
    assert "slot holds request-pool row 0, the session's row is None" in v.message


def test_retract_retry_takes_the_logit_reserve_twice():
    """``match_prefix``: ``prefix_len = min(kv_committed_len, len(token_ids) - 1)`` -- catalogue
    fault S4 is this release's code (PR #22862 removed the extra ``- 1``)."""
    v = _run([("open_session", {"sid": 1}), ("turn", {"sid": 1, "tokens": [0]}),
              ("retract", {"sid": 1})])
    assert v is not None and v.prop == "session-prefix"
    assert "reuses 0 positions, expected min(kv_committed_len 2" in v.message


def test_spec_tail_leaks_as_conservation_not_a_driver_crash():
    """No ``_free_tail`` (PR #22862): the next turn's allocation overwrites the speculative
    over-allocation ``[C, A)`` without freeing it.  The driver drops the row's stale tail as
    the scheduler's write does and conservation reports the lost pages (it used to crash in the
    driver with a shape mismatch when A > the new turn's length)."""
    v = _run([("open_session", {"sid": 1}), ("turn", {"sid": 1, "tokens": [0]}),
              ("spec_decode", {"sid": 1, "draft": 3, "accepted": 0}),
              ("finish_turn", {"sid": 1}), ("turn", {"sid": 1, "tokens": [0]})])
    assert v is not None and v.prop == "conservation"
    assert "lost page(s) [3, 4, 5]" in v.message


def test_a_plain_multi_turn_session_is_clean():
    """The checks do not fire where 0.5.10.post1 behaves: turns, decode steps and finishes."""
    assert _run([("open_session", {"sid": 1}), ("turn", {"sid": 1, "tokens": [0, 1]}),
                 ("decode", {"sid": 1, "n": 2}), ("finish_turn", {"sid": 1}),
                 ("turn", {"sid": 1, "tokens": [2]}), ("finish_turn", {"sid": 1}),
                 ("admit", {"rid": 1, "tokens": [0, 1, 2]}), ("finish", {"rid": 1}),
                 ("release_session", {"sid": 1})]) is None
