"""Every catalogued fault of every landed variant is caught on the property FAULTS.md names,
shrunk to a short trace that replays to the same violation at the same step.

One test per fault does all of it, so pytest-xdist never fuzzes the same fault twice.
"""

import pytest

from state_machines.replay import replay
from state_machines.trace import load_trace
from tests.harness import HANG_DEADLINE, MAX_SHRUNK_STEPS, fault_outcome, landed_faults

pytestmark = pytest.mark.slow  # every fault fuzzed until caught, shrunk and replayed

FAULTS = landed_faults()


@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_fault_caught_shrunk_and_replayable(fault, tmp_path, monkeypatch):
    if "hang" in fault.properties:  # each hanging attempt costs a deadline: the hang tests'
        monkeypatch.setenv("KVCHECK_OP_DEADLINE", HANG_DEADLINE)
    out = fault_outcome(fault.id)
    assert out.error is None, out.error
    assert out.failed, f"{fault.id} was not caught"
    assert out.prop in fault.properties, (
        f"{fault.id} caught on {out.prop!r} ({out.trace.violation['message']}), "
        f"expected one of {fault.properties}")
    # a hang is shrunk only as far as HANG_SHRINK_LIMIT deadlines allow (deadline.py; each
    # hanging attempt costs a whole per-op deadline): the shortest hanging run seen
    assert out.trace.meta["shrunk"] or (out.prop == "hang" and "note" in out.trace.meta), \
        "the failure was not shrunk"
    assert len(out.trace.ops) <= MAX_SHRUNK_STEPS, [o.to_json() for o in out.trace.ops]

    # the saved trace replays, on a fresh subject, to the same violation at the same step
    trace = load_trace(out.trace.save(tmp_path))
    result = replay(trace)
    assert result.violation is not None, "the saved trace no longer fails"
    assert result.violation.prop == trace.violation["property"]
    assert result.failed_step == trace.violation["step"] == len(trace.ops)
    # and on the clean cache the same ops pass (the failure is the fault's, not the ops')
    trace.fault = None
    assert replay(trace).ok
