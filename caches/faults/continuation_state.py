"""Faults C1-C5 of the continuation-state cache, each the smallest mutation of
``ContinuationStateCache`` (docs/faults.md, section continuation-state).

C1 is the production leak (TokenSpeed before #460); C3 is the merged #460 fix (4b3b06de);
C2, C4 and C5 are the other ways the fix could be wrong (C4 is still upstream at 754c3405:
our clean reference takes the #460 reviewer's fix there)."""

from __future__ import annotations

from caches.admission import UnsecuredPagesBudget
from caches.continuation_state import ContinuationStateCache
from caches.faults import fault

V = "continuation-state"


@fault("C1", "superseded-snapshot-pinned", variant=V,
       upstream="TokenSpeed #460 problem (4b3b06de^ L1504)",
       properties=("superseded-state", "conservation"),
       summary="a turn's terminal State window is never released when the next commit makes "
               "its node an interior ancestor (adoption re-adopts History only, the prune "
               "skips the locked path): one window of State pages leaks per turn")
class SupersededSnapshotPinned(ContinuationStateCache):
    def _release_superseded(self, terminal, D):
        return []  # the defect: no release block after the terminal commit


@fault("C2", "release-shared-snapshot", variant=V, upstream="TokenSpeed #460 (gate dropped)",
       properties=("dangling-borrow",),
       summary="the superseded-State release has no sharer gate: an interior node's State is "
               "freed while another live request still borrows its window")
class ReleaseSharedSnapshot(ContinuationStateCache):
    def _release_blocked(self, node, D):
        if node.depth + self.w_max > D:
            return "window"
        return None  # the defect: no devref == 1 check, no borrowed check


@fault("C3", "release-retracted-snapshot", variant=V,
       upstream="TokenSpeed #460 as merged (4b3b06de L1505-1544), fixed by #583",
       properties=("dangling-borrow", "data-integrity"),
       summary="the release checks only device ref == 1; a retracted request holds only a "
               "host ref but still borrows the window for recovery, so its pages are freed")
class ReleaseRetractedSnapshot(ContinuationStateCache):
    def _release_blocked(self, node, D):
        if node.depth + self.w_max > D:
            return "window"
        if node.devref != 1:
            return "shared"
        return None  # the defect: no isPagedCacheSnapshotBorrowed check (#583)


@fault("C4", "history-only-anchor", variant=V,
       upstream="TokenSpeed #460 review P2 (adoptExistingPagedCacheSnapshot L353 @754c3405)",
       properties=("commit-complete", "owned-bounded"), params={"state_required": 1},
       summary="with a required State group, adoption fails on a History-only interior "
               "snapshot left by the release: the commit stops, the terminal gets no "
               "snapshot and the request keeps its pages owned until release")
class HistoryOnlyAnchor(ContinuationStateCache):
    def _adopt_missing_state(self, tabs, x, gid, t):
        return False  # the defect: a missing required group fails the adoption


@fault("C5", "release-terminal", variant=V, upstream="TokenSpeed #460 (loop bound)",
       properties=("commit-complete",),
       summary="the release loop starts at the terminal instead of its parent (and the "
               "terminal is exempt from the gates): the fresh continuation snapshot is "
               "dropped, leaving no resume anchor")
class ReleaseTerminal(ContinuationStateCache):
    def _release_superseded(self, terminal, D):
        released = super()._release_superseded(terminal, D)
        self.detach_state(terminal)  # the defect: the loop starts at T, not T->Parent()
        return [terminal.id] + released


@fault("C6", "round-forgets-secured-pages", variant=V,
       upstream="TokenSpeed's admission securing pages per request (forward.cpp, model)",
       properties=("admission-sound",), params={"pool_pages": 4},
       summary="one scheduling round judges each waiting request against the free pages "
               "alone, forgetting what the round's earlier admissions secured: a batch is "
               "admitted whose first chunks cannot all be acquired")
class RoundForgetsSecuredPages(ContinuationStateCache):
    admission = UnsecuredPagesBudget  # the defect


# -- policy faults: each caught only by the policy property it names (invariants/policy.py) --

@fault("P8", "mru-snapshot-order", variant=V, upstream="kvcheck policy mutant",
       properties=("victim",),
       summary="the prune and KV-eviction scan order is keyed by the negated access time: the "
               "admission prune drops the most recently used snapshot and OnKVEvict the hottest "
               "leaf, so the next turn of a live conversation recomputes")
class MruSnapshotOrder(ContinuationStateCache):
    @staticmethod
    def lru_order(node):
        return -node.last_access, -node.depth, node.id  # the defect: MRU first


@fault("P9", "hit-touches-node-only", variant=V, upstream="kvcheck policy mutant",
       properties=("recency",),
       summary="a hit stamps only the matched node, not its ancestors: the shared prefix "
               "snapshots of a live conversation age and are pruned before cold ones")
class HitTouchesNodeOnly(ContinuationStateCache):
    def _touch(self, node):
        self._clock += 1
        node.last_access = self._clock  # the defect: the walk to the root is gone
