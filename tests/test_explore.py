"""Exhaustive bounded search (state_machines/explore.py, ``kvcheck check``)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from caches.faults import get_fault
from state_machines.cli import main
from state_machines.explore import NotOptedIn, explore, fault_params, small_regimes
from state_machines.replay import replay
from state_machines.trace import load_trace
from state_machines.variants import all_variants, get_variant
from tests.harness import landed_faults

RADIX = get_variant("radix")
# the depth CI verifies each opted-in variant's clean cache to (docs/model-checking.md)
CLEAN_DEPTH = {"radix": 3, "streaming-session": 5, "himamba": 3, "paged-bigpage": 5,
               "continuation-state": 6}
DEFAULT_CLEAN_DEPTH = 3
# every catalogued fault is found at or below this depth (override per fault id if needed)
FAULT_DEPTH = {"S1": 5}  # streaming-session: open, turn, spec step, finish, turn
FAULT_DEPTH.update({"H2": 3, "H3": 2, "H4": 2, "H5": 3})  # himamba (H1: the default 4)
FAULT_DEPTH.update({"C3": 5, "C4": 6})  # continuation-state: admit, step, admit, retract, step
# P8: two snapshots of different ages, then an admission short of pages prunes the newer one
# (admit, step, step, finish, admit, step, finish, admit: 8 ops, ~5 s)
FAULT_DEPTH.update({"P8": 8})
# L7: admit a prompt, prefill it in two chunks (hashed pages, then the last token), a request
# arrives, schedule: the estimate without the running batch admits what cannot allocate
FAULT_DEPTH.update({"L7": 5})
# SW3: admit, prefill in a chunk the tree caches, decode out of the window; SW6: admit,
# prefill, two decode steps (the second's release keeps the first's stale entries)
FAULT_DEPTH.update({"SW3": 5, "SW6": 5})
DEFAULT_FAULT_DEPTH = 4
# faults whose shortest counterexample in the small alphabet is beyond a CI depth (the fuzzer
# catches them: tests/test_faults.py)
TOO_DEEP = {"P5": "two finished requests on branching prefixes, one tail buffer stolen by "
                  "the other, then an eviction: about 7 ops in the small alphabet",
            "S6": "a slot holding KV outside the tree takes two turns (open, turn, finish, "
                  "turn, finish), then an arrival and a schedule: 7 ops in the small alphabet",
            "SW2": "a lock's window segment split by an insert inside it, then the unlock: "
                   "beyond depth 6 in the small alphabet",
            "SW7": "a request decoded out of its window inserting over another's tombstone "
                   "below its evicted length: beyond depth 6 in the small alphabet",
            "SW1": "a tombstone made by a decode past the window, locked, recovered by "
                   "another request's insert: beyond depth 6 in the small alphabet",
            "SW9": "a lock on a window-long prefix, a request decoding a window past it, the "
                   "early release, then the unlock: beyond depth 6 in the small alphabet",
            "SW10": "as SW1 with a running request reading the tombstone: beyond depth 6"}

OPTED_IN = [s for s in all_variants().values() if s.alphabet is not None]
SMALL = [(s, p) for s in OPTED_IN for p in small_regimes(s)]
FAULTS = landed_faults()


@pytest.mark.parametrize("spec, params", SMALL, ids=[
    f"{s.name}-" + "-".join(f"{k}{v}" for k, v in p.items()) for s, p in SMALL])
@pytest.mark.slow  # exhaustive search to depth
def test_clean_variant_verifies_to_the_stated_depth(spec, params):
    depth = CLEAN_DEPTH.get(spec.name, DEFAULT_CLEAN_DEPTH)
    # verify_skips: every skip the search takes as a no-op (an op declared pure_skips) is
    # checked to have changed nothing -- the contract the other searches rely on
    res = explore(spec, params, depth=depth, verify_skips=True)
    assert not res.failed, res.trace and res.trace.violation
    assert res.depth_reached == depth or res.exhausted
    assert res.distinct > 10 and res.transitions > res.distinct  # it did search, and merged


def test_a_skip_that_changes_the_state_must_be_declared(monkeypatch):
    """stray_unlock matches (touching access times, splitting a node) before it finds the node
    held and skips: declared pure_skips, the verifying search names it."""
    specs = dict(RADIX.ops.specs)
    specs["stray_unlock"] = dataclasses.replace(specs["stray_unlock"], pure_skips=True)
    monkeypatch.setattr(RADIX.ops, "specs", specs)
    with pytest.raises(AssertionError, match="unlock the match of .* declare its OpSpec "
                                             "pure_skips=False"):
        explore(RADIX, {"page_size": 1, "pool_pages": 3}, depth=3, verify_skips=True)


def test_tiny_radix_model_is_verified_completely():
    """With two pool slots the reachable state space is finite and small: the search runs
    out of new states (every reachable state checked, with quiescence from each)."""
    res = explore(RADIX, {"page_size": 1, "pool_pages": 2}, depth=30)
    assert not res.failed and res.exhausted
    assert res.depth_reached < 30 and res.levels[-1].new == 0


@pytest.mark.slow  # exhaustive search to depth
@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_every_fault_found_on_its_property_and_replays(fault, tmp_path):
    spec = get_variant(fault.variant)
    if spec.alphabet is None:
        pytest.skip(f"{spec.name} has not opted in to exhaustive search")
    if fault.id in TOO_DEEP:
        pytest.skip(f"{fault.id} is beyond the CI depth: {TOO_DEEP[fault.id]}")
    params = fault_params(spec, small_regimes(spec)[0], fault.id)
    depth = FAULT_DEPTH.get(fault.id, DEFAULT_FAULT_DEPTH)
    res = explore(spec, params, depth=depth, fault=fault.id, out_dir=tmp_path)
    assert res.failed, f"{fault.id} not found up to depth {depth}"
    assert res.prop in fault.properties, res.trace.violation
    # the saved counterexample is a normal trace: it replays to the same violation, same step
    trace = load_trace(res.trace_path)
    assert trace.fault == fault.id and trace.meta["found_by"] == "explore"
    again = replay(trace)
    assert again.violation is not None and again.violation.prop == res.prop
    assert again.failed_step == len(trace.ops) == trace.violation["step"]
    trace.fault = None  # the same ops pass on the clean cache
    assert replay(trace).ok


# per variant, faults the search finds within a few ops (S2: 3; L5 and H3 and C5: 2, L5 on
# quiescence after them), so the search without merging stays cheap
UNMERGED = ("R1", "R2", "R4", "R5", "R6", "L2", "L5", "S2", "H3", "H4", "C5")


@pytest.mark.parametrize("fid", UNMERGED)
def test_breadth_first_is_shortest_and_merging_states_loses_no_violation(fid):
    """Without merging states (every path its own state), nothing fails one level earlier,
    and a violation of the same length and property is found: merging equivalent states by
    the shared canonicaliser skipped no shorter failure (one fault per variant at least)."""
    spec = get_variant(get_fault(fid).variant)
    params = fault_params(spec, small_regimes(spec)[0], fid)
    found = explore(spec, params, depth=FAULT_DEPTH.get(fid, DEFAULT_FAULT_DEPTH), fault=fid)
    level, n = found.depth_reached, len(found.trace.ops)  # n = level + 1 on quiescence
    raw = explore(spec, params, depth=level, fault=fid, dedup=False)
    assert raw.failed and len(raw.trace.ops) == n and raw.prop == found.prop
    if level > 1:
        assert not explore(spec, params, depth=level - 1, fault=fid, dedup=False).failed


@pytest.mark.parametrize("spec, params", SMALL, ids=[
    f"{s.name}-" + "-".join(f"{k}{v}" for k, v in p.items()) for s, p in SMALL])
def test_merging_and_unmerged_search_agree_on_clean_caches(spec, params):
    merged = explore(spec, params, depth=2)
    raw = explore(spec, params, depth=2, dedup=False)
    assert not merged.failed and not raw.failed
    assert raw.distinct > merged.distinct  # it did merge


def _subject(*ops):
    s = RADIX.make_subject({"page_size": 1, "pool_pages": 4})
    for name, kw in ops:
        getattr(s, name)(**kw)
    return s


def test_canonical_merges_states_that_differ_only_in_ids():
    # page ids and the logical clock differ, the behaviour does not
    a = _subject(("admit", {"rid": 1, "tokens": [0]}), ("abort", {"rid": 1}),
                 ("insert", {"tokens": [1]}))
    b = _subject(("insert", {"tokens": [1]}))
    assert [n.value for n in a.cache.root_node.children.values()] != \
        [n.value for n in b.cache.root_node.children.values()]
    assert a.canonical() == b.canonical()


def test_canonical_separates_states_that_behave_differently():
    a = _subject(("insert", {"tokens": [0]}), ("insert", {"tokens": [1]}))
    b = _subject(("insert", {"tokens": [1]}), ("insert", {"tokens": [0]}))
    assert a.canonical() != b.canonical()  # LRU order differs: eviction would differ
    c = _subject(("insert", {"tokens": [0]}))
    d = _subject(("insert", {"tokens": [0]}))
    d.cache.evictable_size_ += 1  # a counter drift must never be merged away
    assert c.canonical() != d.canonical()


def test_variant_without_alphabet_is_refused_with_a_message():
    bare = dataclasses.replace(RADIX, alphabet=None, small_params=None)
    with pytest.raises(NotOptedIn, match="has not opted in"):
        explore(bare, {}, depth=1)


def test_check_command(capsys, tmp_path):
    code = main(["check", "radix", "--depth", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and out.count("no violation up to depth 2") == 2, out
    code = main(["check", "radix", "--fault", "R2", "--depth", "3", "--out", str(tmp_path),
                 "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 1 and rows[-1]["violation"]["property"] == "ref-balance"
    assert rows[-1]["trace_steps"] == 2 and load_trace(rows[-1]["trace_path"]).fault == "R2"
