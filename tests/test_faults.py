"""Every catalogued fault of every landed variant is caught on the property FAULTS.md names,
shrunk to a short trace that replays to the same violation at the same step."""

import pytest

from state_machines.replay import replay
from state_machines.trace import load_trace
from tests.harness import MAX_SHRUNK_STEPS, fault_outcome, landed_faults

FAULTS = landed_faults()


@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_fault_caught_on_its_property(fault):
    out = fault_outcome(fault.id)
    assert out.error is None, out.error
    assert out.failed, f"{fault.id} was not caught"
    assert out.prop in fault.properties, (
        f"{fault.id} caught on {out.prop!r} ({out.trace.violation['message']}), "
        f"expected one of {fault.properties}")
    assert out.trace.meta["shrunk"], "the failure was not shrunk"
    assert len(out.trace.ops) <= MAX_SHRUNK_STEPS, [o.to_json() for o in out.trace.ops]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_saved_trace_replays_to_the_same_violation(fault, tmp_path):
    out = fault_outcome(fault.id)
    assert out.failed
    path = out.trace.save(tmp_path)
    trace = load_trace(path)
    result = replay(trace)
    assert result.violation is not None, "the saved trace no longer fails"
    assert result.violation.prop == trace.violation["property"]
    assert result.failed_step == trace.violation["step"] == len(trace.ops)
    # and on the clean cache the same ops pass (the failure is the fault's, not the ops')
    trace.fault = None
    assert replay(trace).ok
