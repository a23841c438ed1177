"""Op generators (state_machines/gen.py): one definition read as Hypothesis rules, as the
exhaustive alphabet, and by a plain ``random.Random`` (seeded random walks)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from state_machines.gen import (Bools, Drawn, Fresh, Gen, Ints, Live, Lists, Sampled, Seq,
                                Shared, Tuples, rule_generators, walk)
from state_machines.ops import INT, TOKENS, OpSpec, OpTable
from state_machines.variants import all_variants, get_variant

VARIANTS = list(all_variants().values())


def test_draws_sample_within_their_bounds_and_reproducibly():
    draws = [Ints(2, 5), Bools(), Sampled((4, 2, 8)), Lists(Ints(0, 1), 1, 3),
             Tuples((Ints(0, 3), Bools())), Ints(0, 7).map(lambda k: 8 - k)]
    a = [[d.sample(rnd) for d in draws] for rnd in [random.Random(7)] for _ in range(50)]
    b = [[d.sample(rnd) for d in draws] for rnd in [random.Random(7)] for _ in range(50)]
    assert a == b
    for i, l, s, xs, (t0, t1), m in a:
        assert 2 <= i <= 5 and isinstance(l, bool) and s in (4, 2, 8)
        assert 1 <= len(xs) <= 3 and set(xs) <= {0, 1}
        assert 0 <= t0 <= 3 and isinstance(t1, bool) and 1 <= m <= 8


def test_a_generator_must_give_exactly_the_ops_arguments():
    with pytest.raises(ValueError, match="gives"):
        OpTable(OpSpec("evict", {"n": INT}, "evict {n}", gen=Gen(k=Drawn(Ints(1, 2)))))


def test_the_alphabet_is_every_combination_of_small_values_without_repeats():
    table = OpTable(
        OpSpec("admit", {"rid": INT, "tokens": TOKENS}, "admit r{rid} {tokens}",
               gen=(Gen(rid=Fresh(), tokens=Seq(Lists(Ints(0, 1)), small=([0], [1]))),
                    Gen("admit_sharing", rid=Fresh(), tokens=Shared(Ints(0, 3),
                                                                    small=([0], [0, 0]))))),
        OpSpec("finish", {"rid": INT}, "finish r{rid}", gen=Gen(rid=Live())),
        OpSpec("evict", {"n": INT}, "evict {n}",
               gen=Gen(n=Drawn(Ints(1, 8), small=lambda p: (1, p["whole"])),
                       regime=lambda p: p["evicts"])))
    ops = [op.to_json() for op in table.alphabet({"whole": 64, "evicts": True})]
    assert ops == [{"op": "admit", "rid": r, "tokens": t} for r in (1, 2)
                   for t in ([0], [1])] + [{"op": "admit", "rid": r, "tokens": [0, 0]}
                                           for r in (1, 2)] + [
        {"op": "finish", "rid": 1}, {"op": "finish", "rid": 2},
        {"op": "evict", "n": 1}, {"op": "evict", "n": 64}]
    assert all(op.name != "evict" for op in table.alphabet({"whole": 64, "evicts": False}))


@pytest.mark.parametrize("spec", VARIANTS, ids=[s.name for s in VARIANTS])
def test_every_op_of_the_table_has_a_generator(spec):
    for name, op in spec.ops.specs.items():
        assert op.gens or name == "quiesce", f"{spec.name}: op {name!r} has no generator"
    # the machine's rules are exactly the rule generators, under their names
    rules = {r.function.__name__ for r in spec.machine.setup_state().rules}
    assert rules == {g.name for g in rule_generators(spec.ops)}


@pytest.mark.parametrize("spec", VARIANTS, ids=[s.name for s in VARIANTS])
def test_seeded_random_walks_generate_every_op_reproducibly_and_pass_clean(spec):
    """The same generators read with ``random.Random``: a walk is a function of its seed,
    the clean cache passes every step, and over a few walks every op of the table (over the
    regimes) is generated -- the native engine's seeded random walks."""
    counts: Counter = Counter()
    for params in spec.regimes:
        for seed in range(12):
            w = walk(spec, params, seed, 40)
            assert w.run.violation is None, (seed, w.run.trace().violation)
            counts.update(op.name for op in w.run.ops)
        again = walk(spec, params, 11, 40)
        assert [op.to_json() for op in again.run.ops] == [op.to_json() for op in w.run.ops]
    assert set(spec.ops.names()) - set(counts) == set(), counts


def test_a_random_walk_catches_a_fault_and_its_trace_replays():
    from state_machines.replay import replay

    spec = get_variant("radix")
    for seed in range(200):  # R1 needs an insert over an unlocked leaf: ~1 walk in 12
        w = walk(spec, {}, seed, 40, fault="R1")
        if w.run.violation is not None:
            break
    assert w.run.violation is not None and w.run.violation.prop == "size-accounting"
    again = replay(w.run.trace())
    assert again.violation is not None and again.violation.prop == "size-accounting"


def test_draws_sample_what_randint_and_choice_would():
    """The draws' fast sampling (``Random._randbelow``) gives the numbers ``randint`` and
    ``choice`` give from the same stream (so a seed's walks stay what they were), and an empty
    range or choice still raises instead of spinning."""
    import random

    from state_machines.gen import Ints, Lists, Sampled

    for seed in range(50):
        a, b = random.Random(seed), random.Random(seed)
        for lo, hi in ((0, 7), (1, 16), (5, 5), (0, 1000)):
            assert Ints(lo, hi).sample(a) == b.randint(lo, hi)
        assert Sampled((4, 2, 8)).sample(a) == b.choice((4, 2, 8))
        assert Lists(Ints(0, 9), 1, 8).sample(a) == [b.randint(0, 9)
                                                     for _ in range(b.randint(1, 8))]
    rnd = random.Random(0)
    for empty in (lambda: Ints(3, 1).sample(rnd), lambda: Sampled(()).sample(rnd),
                  lambda: Lists(Ints(0, 1), 3, 1).sample(rnd)):
        with pytest.raises((ValueError, IndexError)):
            empty()
