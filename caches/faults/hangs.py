"""Fault T1: an op that never returns -- caught by the per-op deadline as ``hang``.

It loops in the match path of the radix reference cache, far from ``evict`` (so no
"evict freed nothing" progress check can see it).  The loop gives up after ``GIVE_UP_S``
seconds with an error, so a deadline that failed to fire cannot hang a CI job forever.
"""

from __future__ import annotations

import time

from caches.faults import fault
from caches.radix import RadixCache

GIVE_UP_S = 60.0


@fault("T1", "match-waits-for-split", variant="radix", upstream="kvcheck (hang detection)",
       properties=("hang",),
       summary="a match that ends inside a node's key waits for someone else to split the node "
               "instead of splitting it itself, so it spins forever (outside evict)")
class MatchWaitsForSplit(RadixCache):
    def _match_prefix_helper(self, node, key: tuple):
        self._touch(node)
        value: list[int] = []
        started = time.monotonic()
        while len(key) > 0 and self._child_key(key) in node.children:
            child = node.children[self._child_key(key)]
            n = self._key_match(child.key, key)
            if n < len(child.key):  # the defect: wait for a split nobody else will do
                if time.monotonic() - started > GIVE_UP_S:
                    raise RuntimeError(f"T1 gave up after {GIVE_UP_S:.0f}s (the per-op "
                                       "deadline should have stopped it)")
                time.sleep(0.001)
                continue
            self._touch(child)
            value.extend(child.value)
            node, key = child, key[n:]
        return value, node
