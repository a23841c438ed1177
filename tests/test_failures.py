"""Distinct failures of one run: signatures, the ledger, labels, and both engines searching on
after a failure (``state_machines/failures.py``)."""

from __future__ import annotations

from pathlib import Path

from state_machines.failures import (Ledger, Signature, finding_id, known_by_signature, label,
                                     mask)
from state_machines.ops import Op
from state_machines.trace import Trace, load_trace
from state_machines.variants import get_variant

RADIX = get_variant("radix")
P1 = RADIX.check_params({"page_size": 1, "pool_pages": 16})
CORPUS = Path(__file__).resolve().parent / "upstream_findings"


def test_mask_hides_numbers_ids_and_token_lists():
    a = mask("pool kv: slot 10 is free but request r2 still reads it [0 0 1]")
    b = mask("pool kv: slot 3 is free but request r17 still reads it [5]")
    assert a == b == "pool kv: slot # is free but request r# still reads it [..]"
    assert mask("evictable -1 + protected 2") == "evictable # + protected #"


def _trace(ops, prop, message, step=None):
    return Trace("radix", P1, ops, None, "reference",
                 {"property": prop, "message": message, "step": step or len(ops)})


def test_signature_names_property_failing_op_and_masked_message():
    t = _trace([Op("insert", {"tokens": [0]}), Op("stray_unlock", {"tokens": [0]})],
               "ref-balance", "node 1: lock ref is -1 < 0")
    assert Signature.of_trace(t) == Signature("ref-balance", "stray_unlock",
                                              "node #: lock ref is # < #")


def test_ledger_keeps_one_trace_per_signature_and_counts_repeats():
    ledger = Ledger()
    long = _trace([Op("insert", {"tokens": [0]})] * 3, "ref-balance", "node 4: ref -1")
    short = _trace([Op("insert", {"tokens": [1]})], "ref-balance", "node 2: ref -1")
    other = _trace([Op("insert", {"tokens": [1]})], "conservation", "slot 1 twice")
    first = ledger.record(long, 1.0)
    assert ledger.record(short, 2.0) is first and first.count == 2 and first.trace is long
    ledger.record(other, 3.0)
    assert len(ledger) == 2
    more = Ledger()
    more.record(short, 0.5)
    ledger.merge(more)
    assert first.count == 3 and first.trace is short and first.first_seen == 0.5


def test_a_corpus_trace_is_labelled_by_its_signature():
    path = CORPUS / "sglang-radix-F1-unmatched-unlock.json"
    trace = load_trace(path)
    assert known_by_signature(trace, CORPUS) == "F1"
    moved = Trace(trace.variant, trace.params, trace.ops, None, trace.target,
                  {**trace.violation, "message": trace.violation["message"] + " (more)"})
    assert known_by_signature(moved, CORPUS) is None


def test_a_release_copy_of_a_finding_is_labelled_by_its_id_not_its_release():
    # sglang-0.5.10-himamba-F5-...: the id is F5, not the release the copy was recorded on
    path = CORPUS / "sglang-0.5.10-himamba-F5-backup-below-unbacked-parent.json"
    trace = load_trace(path)
    assert finding_id(trace, path) == "F5"
    assert known_by_signature(trace, CORPUS) == "F5"


def test_hypothesis_searches_on_and_counts_a_tolerated_failure_again():
    from state_machines.fuzz import fuzz

    out = fuzz(RADIX, P1, fault="R2", max_examples=300, seed=0, stop_on_first=False)
    assert out.failures and all(f.count >= 1 for f in out.failures)
    sigs = [f.signature for f in out.failures]
    assert len(set(sigs)) == len(sigs)  # one trace per signature
    assert sum(f.count for f in out.failures) > len(out.failures)  # repeats only counted


def test_searching_on_ends_at_the_first_failure_on_a_stop_on_property():
    """``stop_on``: a search that goes on past failures ends once one breaks a property it
    names (``kvcheck faults`` looks for a fault's own property this way); without it the same
    search goes on."""
    from state_machines.fuzz import fuzz

    # D1 (a slot freed twice): conservation, in several forms, and a crash
    kw = dict(fault="D1", max_examples=60, seed=0, stop_on_first=False)
    on = fuzz(RADIX, P1, **kw)
    props = [f.signature.prop for f in on.failures]
    assert props[:2] == ["conservation", "conservation"] and "crash" in props
    stop = fuzz(RADIX, P1, stop_on={"conservation"}, **kw)
    assert [f.signature.prop for f in stop.failures] == ["conservation"]
    assert stop.examples < on.examples


def test_native_walks_on_after_a_failure():
    from state_machines.native import native_fuzz

    stop = native_fuzz(RADIX, P1, fault="R2", max_walks=200, seed=1, shrink_budget=5)
    on = native_fuzz(RADIX, P1, fault="R2", max_walks=200, seed=1, shrink_budget=5,
                     stop_on_first=False)
    assert stop.failed and on.failed
    assert on.examples == 200 > stop.examples
    assert sum(f.count for f in on.failures) > 1
    assert all(label(f).known is None for f in on.failures)  # the reference has no findings


def test_failures_of_one_known_finding_are_one_row_and_one_printout():
    """Failures a known finding's fix model removes share its root cause: one row, each
    signature listed inside it, and its shortest trace printed once; a new failure is its own
    row."""
    from state_machines.commands.common import failure_groups, failure_table, failures_to_print
    from state_machines.failures import Failure

    def failure(n_ops, message, known, count=1):
        t = _trace([Op("insert", {"tokens": [0]})] * n_ops, "conservation", message)
        return Failure(Signature.of_trace(t), float(n_ops), count, t, None, known,
                       driven=known is not None)

    long_f1 = failure(5, "pool kv: slot 1 is free but request r1 still reads it", "F1", 2)
    short_f1 = failure(3, "pool kv: slot 1 is both free and held by tree", "F1", 4)
    new = failure(4, "pool kv: slot(s) [1] are held at two positions by the tree", None)
    table = failure_table([long_f1, new, short_f1])
    lines = table.splitlines()
    assert lines[0] == "distinct failures: 3, in 2 rows (one per root cause)"
    rows = [line for line in lines[3:] if line[:1].isdigit()]
    assert len(rows) == 2 and "known F1 (asked for)" in rows[0] and "new" in rows[1]
    assert " 6 " in rows[0]  # the finding's count: 2 + 4
    also = [line for line in lines if "also" in line]
    assert len(also) == 1 and "slot # is free but request r#" in also[0]
    assert "both free and held by tree" in rows[0]  # the row shows the shortest trace's
    assert failures_to_print([long_f1, new, short_f1]) == [short_f1, new]
    # a new failure met at another op with the same message: the same row
    t = _trace([Op("admit", {"rid": 1, "tokens": [0]})], "conservation",
               "pool kv: slot(s) [2] are held at two positions by the tree")
    again = Failure(Signature.of_trace(t), 9.0, 1, t)
    other = failure(2, "pool kv: slot 3 is held by both tree and request r1", None)
    assert [len(g) for g in failure_groups([new, again, other])] == [2, 1]
