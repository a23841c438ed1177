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


def test_a_ctrl_c_swallowed_inside_the_cache_still_ends_the_run(monkeypatch, tmp_path):
    """A KeyboardInterrupt can be lost on its way out (raised in a gc callback or ``__del__``
    it is only printed): the stop is recorded as well, and the next example ends the run."""
    import os
    import signal

    real = RadixCache.insert
    calls = []

    def insert(self, key, value):
        calls.append(1)
        if len(calls) == 30:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):  # the handler runs between two bytecodes
                    pass
            except KeyboardInterrupt:
                pass  # swallowed, as a gc callback would
        return real(self, key, value)

    monkeypatch.setattr(RadixCache, "insert", insert)
    spec = get_variant("radix")
    out = fuzz(spec, spec.regimes[0], max_examples=100_000, out_dir=tmp_path)
    assert len(calls) >= 30 and out.interrupted and out.error is None
    assert out.examples < 100  # it ended at the next example, not after the whole budget


@pytest.mark.slow  # a kvcheck process
def test_sigterm_swallowed_by_the_cache_still_ends_the_command_with_exit_3(tmp_path):
    """The CLI's SIGTERM handler: a swallowed first signal ends the run at the next example
    (exit 3), within the grace period at the latest."""
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import sys\n"
        "from caches.radix import RadixCache\n"
        "real = RadixCache.insert\n"
        "def insert(self, key, value):\n"
        "    try:\n"
        "        return real(self, key, value)\n"
        "    except KeyboardInterrupt:\n"
        "        return real(self, key, value)  # swallowed\n"
        "RadixCache.insert = insert\n"
        "from state_machines.cli import main\n"
        "print('started', flush=True)\n"
        "sys.exit(main(['fuzz', 'radix', '--engine', 'hypothesis', '--budget', '120',\n"
        f"               '--out', {str(tmp_path)!r}]))\n")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "started"
    time.sleep(4)
    sent = time.monotonic()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    took = time.monotonic() - sent
    assert p.returncode == 3, (p.returncode, out, err)
    assert "Traceback" not in err, err
    from state_machines.stopping import GRACE

    assert took < GRACE + 5, took
