"""The historical release SGLang 0.5.10.post1, driven by the 0.5.12.post1 adapters unpatched
(the differences are ``caches/adapters/sglang/versions.py`` declarations): what kvcheck finds
there -- the seeds' own defects on the release that had them, each a known finding declined one
by one -- and that release's abort rule, declared instead of reported.

Runs only in ``.venv-upstream-0.5.10.post1`` (``bash ci/upstream/setup.sh 0.5.10.post1``; .ci/run
builds it): ``.venv-upstream-0.5.10.post1/bin/python -m pytest -q
tests/upstream/test_sglang_historical_0_5_10.py``.  Elsewhere the module skips, saying why.
``tests/upstream/test_findings.py`` replays every finding recorded on this release through the
gate and ``kvcheck replay``.
"""

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.10.post1")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from pathlib import Path  # noqa: E402

from caches.adapters.sglang import versions  # noqa: E402
from caches.adapters.sglang.streaming_session import make_subject  # noqa: E402
from invariants import Violation  # noqa: E402
from state_machines import radix, streaming_session  # noqa: E402
from state_machines.fuzz import fuzz  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.targets import get_target  # noqa: E402
from state_machines.trace import load_trace  # noqa: E402
from state_machines.variants import get_variant  # noqa: E402

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
    assert get_target("sglang").variant_unavailable("himamba", None) is None  # host=1 and 0


@pytest.mark.parametrize("params", radix.SPEC.regimes, ids=["ps1", "ps4"])
def test_radix_is_clean(params):
    out = fuzz(radix.SPEC, radix.SPEC.check_params(params), target="sglang", max_examples=40,
               seed=0)
    assert out.error is None, out.error
    assert not out.failed, out.trace.violation
    assert out.steps > 500


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


@pytest.mark.parametrize("params", [PARAMS, {**PARAMS, "page_size": 4, "pool_pages": 10}],
                         ids=["ps1", "ps4"])
def test_a_pre_aborted_turn_is_lent_the_slot(params):
    """SGLang #22273 (finding S7): ``set_finish_with_abort`` makes a 1-token stub that keeps
    its session, and ``SessionAwareCache.match_prefix`` (SA:172-197) restores the slot into it
    (``restore_to_req``: the slot's row and lengths) at prefix 0 -- the stub's prefill would
    write position 0 of the slot's row and its finish save the stub as the slot."""
    s = make_subject(params, skip_known_findings=False)
    for name, args in (("open_session", {"sid": 1}), ("turn", {"sid": 1, "tokens": [0]}),
                       ("finish_turn", {"sid": 1})):
        SS.ops.apply(s, Op(name, args))
    row = s.cache.session.slots[1].req_pool_idx
    with pytest.raises(Violation) as exc:
        SS.ops.apply(s, Op("pre_abort_turn", {"sid": 1}))
    assert exc.value.prop == "session-prefix" and "the match returned the slot" in exc.value.message
    stub = s.cache._turns[1]  # the mechanism, on SGLang's own objects
    assert stub.to_finish is not None and list(stub.origin_input_ids) == [0]
    assert stub.session is not None and stub.req_pool_idx == row  # restored, not detached


def test_a_plain_multi_turn_session_is_clean():
    """The checks do not fire where 0.5.10.post1 behaves: turns, decode steps and finishes."""
    assert _run([("open_session", {"sid": 1}), ("turn", {"sid": 1, "tokens": [0, 1]}),
                 ("decode", {"sid": 1, "n": 2}), ("finish_turn", {"sid": 1}),
                 ("turn", {"sid": 1, "tokens": [2]}), ("finish_turn", {"sid": 1}),
                 ("admit", {"rid": 1, "tokens": [0, 1, 2]}), ("finish", {"rid": 1}),
                 ("release_session", {"sid": 1})]) is None


FINDINGS = Path(__file__).resolve().parents[1] / "upstream_findings"
RELEASE = "0.5.10.post1"
# finding id -> its trace (recorded on 0.5.10.post1 by `kvcheck fuzz ... --known-findings find`)
TRACES = {
    ("himamba", "H1"): "sglang-0.5.10-himamba-H1-tombstone-cascade-ignores-host-ref.json",
    ("himamba", "H3"): "sglang-0.5.10-himamba-H3-unfinished-drops-chunked.json",
    ("himamba", "F5"): "sglang-0.5.10-himamba-F5-backup-below-unbacked-parent.json",
    ("himamba", "F6"): "sglang-0.5.10-himamba-F6-cascade-hides-ancestor-from-evict.json",
    ("streaming-session", "S1"): "sglang-0.5.10-streaming-session-S1-spec-tail-leak.json",
    ("streaming-session", "S4"): "sglang-0.5.10-streaming-session-S4-prefix-double-reserve.json",
    ("streaming-session", "F2"): "sglang-0.5.10-streaming-session-F2-aborted-turn-tail-leak.json",
    ("streaming-session", "S7"): "sglang-0.5.10-streaming-session-S7-pre-abort-restores-slot.json",
}


def _subject(trace, declined):
    if trace.variant == "himamba":
        from caches.adapters.sglang.himamba import make_subject as himamba_subject

        return himamba_subject(trace.params, skip_known_findings=sorted(declined))
    return make_subject(trace.params, skip_known_findings=sorted(declined))


def _run_trace(trace, declined) -> tuple[list[str], Violation | None]:
    """Apply the trace's ops to a fresh subject declining ``declined``; (results, violation)."""
    spec = get_variant(trace.variant)
    subject, out = _subject(trace, declined), []
    try:
        for op in trace.ops:
            out.append(spec.ops.apply(subject, Op(op.name, op.args)))
            subject.check()
    except Violation as v:
        return out, v
    except Exception as exc:  # the cache's own assert: what a run reports as "crash"
        return out, Violation("crash", f"{type(exc).__name__}: {exc}")
    return out, None


def test_every_finding_of_the_release_is_declared():
    for (variant, fid), name in TRACES.items():
        assert fid in versions.known_findings(RELEASE, variant), (variant, fid)
        assert (FINDINGS / name).is_file()
        trace = load_trace(FINDINGS / name)
        assert trace.identity is not None and trace.identity.version == RELEASE


@pytest.mark.parametrize("key", list(TRACES), ids=[f"{v}-{f}" for v, f in TRACES])
def test_finding_breaks_its_property_when_driven(key):
    trace = load_trace(FINDINGS / TRACES[key])
    _, v = _run_trace(trace, declined=set())
    assert v is not None and v.prop == trace.violation["property"], v


@pytest.mark.parametrize("key", list(TRACES), ids=[f"{v}-{f}" for v, f in TRACES])
def test_finding_is_declined_by_its_own_id(key):
    variant, fid = key
    trace = load_trace(FINDINGS / TRACES[key])
    others = set(versions.known_findings(RELEASE, variant)) - {fid}
    out, v = _run_trace(trace, declined=others)  # every other finding declined: still found
    assert v is not None and v.prop == trace.violation["property"], v
    out, v = _run_trace(trace, declined={fid})  # its own id declined: the op is a no-op
    assert v is None, v
    assert any(r.startswith("skipped:") and "known upstream finding" in r for r in out), out


def test_F5_is_the_missing_parent_guard_and_its_non_leaf_assert():
    """F5 (SGLang PR #22062): the second ``insert [1 0]`` backs up node [0] below the split
    [1] that is not backed up -- 0.5.12.post1's ``write_backup`` refuses that -- and the
    eviction then demotes [0] to host and takes its parent, now an evictable device leaf, to
    ``_evict_regular``, which asserts on it."""
    trace = load_trace(FINDINGS / TRACES[("himamba", "F5")])
    out, v = _run_trace(trace, declined=set())
    assert v is not None and v.prop == "crash" and "non-leaf" in v.message, v
    assert "tree already had 2 tokens" in out[8]  # the insert that backs up below the gap
    subject = _subject(trace, declined=set())
    spec = get_variant(trace.variant)
    for op in trace.ops[:9]:
        spec.ops.apply(subject, Op(op.name, op.args))
    root = subject.cache.root_node.id
    gaps = [n.id for n in subject._walk() if n.id != root and n.backuped
            and n.parent.id != root and not n.parent.backuped]
    assert len(gaps) == 1, gaps  # a backed-up node whose parent is not backed up


def test_a_spurious_oom_met_where_F5_declines_is_labelled_F6_only_when_it_is_F6s():
    """A find=F5 run (before F6 was declared) met F6 at an insert that F5's decline happens to
    skip: the ledger's replay attribution named F5.  A trace that no longer fails as recorded
    names no finding by replay; F6's own trace, driven, is labelled F6."""
    import dataclasses

    from state_machines.failures import Failure, Signature, label

    f6 = load_trace(FINDINGS / TRACES[("himamba", "F6")])
    ops = [Op("insert", {"tokens": [0, 0, 0]}), Op("insert", {"tokens": [0]}),
           Op("admit", {"rid": 1, "tokens": [0]}), Op("lock", {"hid": 2, "tokens": [0, 0]}),
           Op("enqueue", {"rid": 3, "tokens": [0], "max_new": 1}),
           Op("admit", {"rid": 4, "tokens": [1, 0]}), Op("unlock", {"hid": 2}),
           Op("insert", {"tokens": [0, 0, 0]})]
    stale = dataclasses.replace(
        f6, params={**f6.params, "storage": 1}, ops=ops, known_findings="find=F5",
        violation={**f6.violation, "message": "allocating 3 KV slots (0 free): reported out of "
                   "memory for 3 tokens, but free 0 + evictable 3 = 3 covered it", "step": 8})
    assert label(Failure(Signature.of_trace(stale), 0.0, trace=stale)).known != "F5"
    driven = dataclasses.replace(f6, known_findings="find=F6")
    failure = label(Failure(Signature.of_trace(driven), 0.0, trace=driven))
    assert failure.known == "F6" and failure.driven


def test_the_abort_rule_is_the_release_s_not_a_violation():
    """0.5.10.post1 saves an aborted streaming turn as the session's slot (SGLang PR #22790
    changed it); the subject expects that, so an abort followed by the next turn breaks
    nothing but the declined tail leak."""
    assert versions.session_abort_saves_turn(RELEASE)
    assert not versions.session_abort_saves_turn("0.5.12.post1")
    s = make_subject(PARAMS)
    do = lambda name, **args: SS.ops.apply(s, Op(name, args))  # noqa: E731
    do("open_session", sid=1)
    do("turn", sid=1, tokens=[0])
    s.check()
    assert "saved as the session's slot" in do("abort_turn", sid=1)
    s.check()  # before: "conservation: SGLang's slot holds request-pool row 0 ..."
    assert s.cache.slots.get(1) is not None and s.sessions[1].committed is not None
    out = do("turn", sid=1, tokens=[1])
    s.check()
    assert "first turn" not in out  # the next turn resumes the slot


def test_list_says_only_what_fuzz_accepts(capsys):
    """``kvcheck list`` calls a target usable here only for the variants this release drives,
    the ones ``fuzz`` accepts (0.5.10.post1: radix, himamba and streaming-session on ``sglang``,
    not hybrid-swa, whose unified SWA component is 0.5.23's; none on the 0.5.23-only
    targets)."""
    from state_machines.cli import main
    from state_machines.commands.common import UsageError, target_named

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    state = {}
    for head, detail in zip(lines, lines[1:]):
        name = head.split()[0] if head.startswith("  ") and head.split() else None
        if name in ("sglang", "sglang-rust", "sglang-radixcache"):
            state[name] = detail
    assert "usable here for radix, himamba, streaming-session only" in state["sglang"]
    assert "'hybrid-swa' on sglang 0.5.23" in state["sglang"]
    for name in ("sglang-rust", "sglang-radixcache"):
        assert "not usable here" in state[name]
    for variant in ("radix", "himamba", "streaming-session"):
        assert target_named(get_variant(variant), "sglang") == "sglang"
    with pytest.raises(UsageError):
        target_named(get_variant("radix"), "sglang-rust")
