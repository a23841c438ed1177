"""An interrupt inside a cache op is an interrupt, never a violation: the half-updated cache is
not drained and checked afterwards, and the run reports 'interrupted' without a trace."""

import pytest

from caches.radix import RadixCache
from state_machines.fuzz import fuzz
from state_machines.variants import get_variant


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit], ids=lambda e: e.__name__)
def test_an_interrupt_inside_a_cache_op_is_not_recorded(monkeypatch, tmp_path, exc):
    real = RadixCache.insert
    calls = []

    def insert(self, key, value):
        calls.append(1)
        if len(calls) == 30:  # mid-op: the tree is half updated when the signal lands
            real(self, key, value)
            self.evictable_size_ += 1000
            raise exc()
        return real(self, key, value)

    monkeypatch.setattr(RadixCache, "insert", insert)
    spec = get_variant("radix")
    try:
        out = fuzz(spec, spec.regimes[0], max_examples=100, out_dir=tmp_path)
    except SystemExit:  # it may go on up: the process is exiting
        out = None
    assert len(calls) >= 30  # it did run into the interrupt
    if exc is KeyboardInterrupt:
        assert out.interrupted
    # Hypothesis treats SystemExit as a test failure; either way no violation is recorded
    assert out is None or (not out.failed and out.trace is None)
    assert not list(tmp_path.iterdir())  # no trace saved for it


def test_a_ctrl_c_that_surfaces_as_another_exception_is_still_an_interrupt(monkeypatch):
    """CPython turns a KeyboardInterrupt inside its AST constructor (Hypothesis compiles code
    while it runs) into a SystemError: the run is interrupted, never a harness error."""
    import os
    import signal

    from state_machines import fuzz as fuzz_mod
    from state_machines.variants import get_variant

    def compile_interrupted(*a, **kw):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs between two bytecodes
                pass
        except KeyboardInterrupt:
            raise SystemError("AST constructor recursion depth mismatch") from None
        raise AssertionError("SIGINT was not delivered")

    monkeypatch.setattr(fuzz_mod, "run_state_machine_as_test", compile_interrupted)
    spec = get_variant("radix")
    out = fuzz_mod.fuzz(spec, spec.regimes[0], max_examples=5)
    assert out.interrupted and out.error is None, (out.interrupted, out.error)
