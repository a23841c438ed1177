"""Shared by the fast-verdict tests of the subjects whose ``check`` is "fast verdict, else the
view-based checks; then the policy checks" (``test_radix_fast``, ``test_paged_bigpage_fast``,
``test_continuation_state_fast``, ``test_streaming_session_fast``): both verdicts after every
step, compared -- ``SideBySide`` runs and compares, ``FastVerdictSuite`` is the tests each of
those modules gets from it.

The full verdict is the subject's own ``check`` with the fast path off and no policy events to
check (those subjects run the policy checks in the middle of, or after, the state checks), so
it is exactly the state checks the fast verdict restates."""

from __future__ import annotations

import pytest

from invariants import Violation
from state_machines.native import run_walk

# walks per regime in a corrupted-state test; each ends at its one corruption, so a kind is
# judged on up to this many states per regime -- every kind breaks the state check within it
# (the walks are seeded: the same states every run)
CORRUPTED_WALKS = 50


def tree_nodes(root) -> list:
    """Every node below ``root`` (``children`` dicts), ``root`` first, depth first."""
    out, stack = [], [root]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out


class SideBySide:
    """``cls``: the subject class; ``fast_ok``: its fast verdict; ``spec``: the variant."""

    def __init__(self, cls, fast_ok, spec):
        self.cls, self.fast_ok, self.spec = cls, fast_ok, spec
        self.full_check = cls.check  # the subject's own check, before any test patches it

    def state_check(self, subject) -> None:
        """The view-based state checks alone."""
        events, subject._policy_events = subject._policy_events, []
        subject.fast_check = False
        try:
            self.full_check(subject)
        finally:
            subject._policy_events = events
            del subject.fast_check

    def judge(self, subject, seen) -> None:
        """Both verdicts on the subject's state, recorded as (fast ok, property the full check
        broke or None); then fails as the full check did (a tree the view cannot even be built
        from, or checked, is recorded by its exception's name)."""
        fast = self.fast_ok(subject)
        try:
            self.state_check(subject)
        except Violation as v:
            seen.append((fast, v.prop))
            raise
        except Exception as exc:  # noqa: BLE001
            seen.append((fast, type(exc).__name__))
            raise Violation("crash", str(exc)) from exc
        seen.append((fast, None))

    def patch(self, monkeypatch) -> list:
        """Every ``check`` computes both verdicts, records them, fails as the full one did,
        then runs the policy checks as the subject does; returns the record."""
        seen, judge = [], self.judge

        def check(subject):
            judge(subject, seen)
            if subject.checking:
                subject.check_policy()

        monkeypatch.setattr(self.cls, "check", check)
        return seen

    def assert_clean_regime(self, regime: int, seen) -> None:
        """Clean walks in regime ``regime``: nothing breaks, both verdicts agree on every step
        (``seen``: the record ``patch`` returned), and the fast one passed every step."""
        params = self.spec.check_params(self.spec.regimes[regime])
        assert self.walks(params, None, seen) == []
        assert len(seen) > 500  # the walks did run
        assert all(fast for fast, _ in seen)

    def assert_fault_breaks(self, fault, regime: int, seen) -> list:
        """Walks with ``fault`` on in regime ``regime`` until they break its property (at most
        1000), both verdicts agreeing on every step; returns what the walks broke."""
        params = self.spec.check_params({**self.spec.regimes[regime], **fault.params})
        broke = self.walks(params, fault.id, seen, walks=1000, until=set(fault.properties),
                           until_walks=True)
        assert set(fault.properties) & set(broke), \
            f"{fault.id}: the walks never broke {fault.properties} (broke {sorted(set(broke))})"
        return broke

    def assert_check_takes_fast_path(self, monkeypatch, subject, corrupt, prop,
                                     view="tree_view") -> None:
        """The subject's own ``check`` takes the fast path on ``subject``'s sound state and
        builds no view (its method ``view`` is not called); once ``corrupt(subject)`` breaks
        the state, the view is built and the check reports ``prop``."""
        calls, real = [], getattr(self.cls, view)
        monkeypatch.setattr(self.cls, view,
                            lambda s, *a, **k: (calls.append(1), real(s, *a, **k))[1])
        subject.check()
        assert calls == []
        corrupt(subject)
        with pytest.raises(Violation) as exc:
            subject.check()
        assert exc.value.prop == prop and calls == [1]

    def walks(self, params, fault, seen, walks=300, until=None, seed=11,
              until_walks=False) -> list:
        """Run walks (at most ``walks``; with ``until``, stop once the state checks after 3
        steps broke one of those properties -- a walk whose fault shows only when the quiesce
        at its end drains it does not count -- or, with ``until_walks``, once 3 walks ended
        on one of them: a property a policy check or the op itself reports never reaches the
        state checks), then require the same verdict from both checks on every step.  Returns
        the properties the walks broke (state checks, policy checks or the ops
        themselves)."""
        broke = []
        for index in range(walks):
            result = run_walk(self.spec, params, seed=seed, index=index, fault=fault)
            if result.violation:
                broke.append(result.violation["property"])
            if until and (sum(1 for _, prop in seen if prop in until) >= 3
                          or until_walks and sum(1 for prop in broke if prop in until) >= 3):
                break
        disagree = [(fast, prop) for fast, prop in seen if fast != (prop is None)]
        assert not disagree, f"fast and full verdicts differ on {len(disagree)} of " \
                             f"{len(seen)} steps, e.g. {disagree[:5]}"
        return broke

    def corrupted(self, monkeypatch, corrupt, rnd, nonempty, walks=CORRUPTED_WALKS) -> list:
        """Walks in every regime; at a random step (while ``nonempty(subject)``) the state is
        corrupted by ``corrupt(subject, rnd)``, both checks judge it and the walk ends.
        Returns the record, after requiring the same verdict on every corrupted state."""
        seen, judge, full = [], self.judge, self.full_check

        def check(subject):
            if nonempty(subject) and rnd.random() < 0.3:
                corrupt(subject, rnd)
                judge(subject, seen)
                raise Violation("done", "corrupted once: end the walk")
            full(subject)

        monkeypatch.setattr(self.cls, "check", check)
        for regime in self.spec.regimes:
            params = self.spec.check_params(regime)
            for index in range(walks):
                run_walk(self.spec, params, seed=5, index=index)
        disagree = [(fast, prop) for fast, prop in seen if fast != (prop is None)]
        assert not disagree, f"fast and full verdicts differ on {len(disagree)} of " \
                             f"{len(seen)} corrupted states, e.g. {disagree[:5]}"
        return seen


class FastVerdictSuite:
    """The side-by-side tests every fast verdict gets.  A test module subclasses it
    (``class TestSideBySide(FastVerdictSuite)``) naming ``SBS`` (its ``SideBySide``), ``FAULTS``
    (the faults to walk with) and ``STATE_PROPS`` (the properties the state checks report), and
    pytest runs, per regime, clean walks that must pass with both verdicts agreeing on every
    step; per fault and regime, faulty walks that must agree and break the fault's property;
    and for every fault a state check catches (its properties within ``STATE_PROPS``), walks
    in every regime that must show the fast path itself judging a state wrong on it."""

    SBS: SideBySide
    FAULTS: list = []
    STATE_PROPS: frozenset = frozenset()

    def pytest_generate_tests(self, metafunc):
        if "regime" in metafunc.fixturenames:
            metafunc.parametrize("regime", range(len(self.SBS.spec.regimes)))
        if "fault" in metafunc.fixturenames:
            faults = self.FAULTS
            if metafunc.definition.originalname == "test_state_faults_reach_the_fast_path":
                faults = [f for f in faults if set(self.STATE_PROPS) >= set(f.properties)]
            metafunc.parametrize("fault", faults, ids=lambda f: f.id)

    @pytest.fixture
    def side_by_side(self, monkeypatch):
        return self.SBS.patch(monkeypatch)

    @pytest.mark.slow  # whole clean machine runs, both verdicts
    def test_clean_runs_agree_on_every_step(self, side_by_side, regime):
        self.SBS.assert_clean_regime(regime, side_by_side)

    def test_faulty_runs_agree_on_every_step(self, side_by_side, fault, regime):
        self.SBS.assert_fault_breaks(fault, regime, side_by_side)

    def test_state_faults_reach_the_fast_path(self, side_by_side, fault):
        """A fault a state check catches is seen by the fast path itself: some step's state
        is judged wrong by both, on the fault's property."""
        spec, props = self.SBS.spec, set(fault.properties)
        for regime in spec.regimes:
            params = spec.check_params({**regime, **fault.params})
            self.SBS.walks(params, fault.id, side_by_side, walks=1000, until=props)
        failed = {prop for fast, prop in side_by_side if prop is not None and not fast}
        assert props & failed, f"{fault.id}: no state check broke on {sorted(props)} " \
                               f"(broke {sorted(failed)})"
