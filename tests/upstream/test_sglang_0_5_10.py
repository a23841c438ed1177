"""SGLang 0.5.10.post1 (``bash ci/upstream/setup.sh 0.5.10.post1``): the seeds' own defects on
the release that had them, each a known finding declined one by one, and that release's abort
rule declared instead of reported.

``tests/upstream/test_findings.py`` replays every finding recorded on this release through the
gate and ``kvcheck replay``; here each one's decline is checked: the subject declines the op
that re-finds it only while that finding's id is declined, and the rest of the trace runs.
"""

from pathlib import Path

import pytest

from caches.adapters.sglang import loader

REASON = loader.unavailable_reason() or loader.release_reason("0.5.10.post1")
if REASON:
    pytest.skip(REASON, allow_module_level=True)

from caches.adapters.sglang import versions  # noqa: E402
from invariants import Violation  # noqa: E402
from state_machines.ops import Op  # noqa: E402
from state_machines.trace import load_trace  # noqa: E402
from state_machines.variants import get_variant  # noqa: E402

FINDINGS = Path(__file__).resolve().parents[1] / "upstream_findings"
RELEASE = "0.5.10.post1"
# finding id -> its trace (recorded on 0.5.10.post1 by `kvcheck fuzz ... --known-findings find`)
TRACES = {
    ("himamba", "H1"): "sglang-0.5.10-himamba-H1-tombstone-cascade-ignores-host-ref.json",
    ("himamba", "H3"): "sglang-0.5.10-himamba-H3-unfinished-drops-chunked.json",
    ("streaming-session", "S1"): "sglang-0.5.10-streaming-session-S1-spec-tail-leak.json",
    ("streaming-session", "S4"): "sglang-0.5.10-streaming-session-S4-prefix-double-reserve.json",
    ("streaming-session", "F2"): "sglang-0.5.10-streaming-session-F2-aborted-turn-tail-leak.json",
}


def _subject(trace, declined):
    if trace.variant == "himamba":
        from caches.adapters.sglang.himamba import make_subject
    else:
        from caches.adapters.sglang.streaming_session import make_subject
    return make_subject(trace.params, skip_known_findings=sorted(declined))


def _run(trace, declined) -> tuple[list[str], Violation | None]:
    """Apply the trace's ops to a fresh subject declining ``declined``; (results, violation)."""
    spec = get_variant(trace.variant)
    subject, out = _subject(trace, declined), []
    try:
        for op in trace.ops:
            out.append(spec.ops.apply(subject, Op(op.name, op.args)))
            subject.check()
    except Violation as v:
        return out, v
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
    _, v = _run(trace, declined=set())
    assert v is not None and v.prop == trace.violation["property"], v


@pytest.mark.parametrize("key", list(TRACES), ids=[f"{v}-{f}" for v, f in TRACES])
def test_finding_is_declined_by_its_own_id(key):
    variant, fid = key
    trace = load_trace(FINDINGS / TRACES[key])
    others = set(versions.known_findings(RELEASE, variant)) - {fid}
    out, v = _run(trace, declined=others)  # every other finding declined: still found
    assert v is not None and v.prop == trace.violation["property"], v
    out, v = _run(trace, declined={fid})  # its own id declined: the op is a no-op
    assert v is None, v
    assert any(r.startswith("skipped:") and "known upstream finding" in r for r in out), out


def test_the_abort_rule_is_the_release_s_not_a_violation():
    """0.5.10.post1 saves an aborted streaming turn as the session's slot (SGLang PR #22790
    changed it); the subject expects that, so an abort followed by the next turn breaks
    nothing but the declined tail leak."""
    assert versions.session_abort_saves_turn(RELEASE)
    assert not versions.session_abort_saves_turn("0.5.12.post1")
    from caches.adapters.sglang.streaming_session import make_subject
    from state_machines.streaming_session import SPEC

    s = make_subject(SPEC.check_params(SPEC.regimes[0]))
    do = lambda name, **args: SPEC.ops.apply(s, Op(name, args))  # noqa: E731
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
    the ones ``fuzz`` accepts (0.5.10.post1: all three on ``sglang``; none on the 0.5.23-only
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
    assert state["sglang"].endswith("; usable here")
    for name in ("sglang-rust", "sglang-radixcache"):
        assert "not usable here" in state[name]
    for variant in ("radix", "himamba", "streaming-session"):
        assert target_named(get_variant(variant), "sglang") == "sglang"
    with pytest.raises(UsageError):
        target_named(get_variant("radix"), "sglang-rust")
