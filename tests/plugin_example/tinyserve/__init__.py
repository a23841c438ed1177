"""tinyserve: a toy serving engine's KV prefix cache and scheduler.

It knows nothing of kvcheck (``tinyserve_kvcheck`` plugs it in).  On purpose it is not shaped
like SGLang: its tree nodes are ``Entry(serial, tokens, slots, up, kids, pins, stamp)`` and the
root has no tokens; KV slots are ``0 .. size - 1`` with no padding slot; ``PrefixTree.evict``
returns the slots it took out of the tree and the *caller* gives them back to the pool; a
failed allocation is an empty list.  The ``Scheduler`` is the only caller of the tree in
serving: admit (match, pin, allocate with eviction), a step of prefill (``step``, then
``checkpoint`` between chunks), finish and abort.

``Scheduler(..., fast_finish=True)`` is a planted defect: a finishing sequence whose tokens
another one cached meanwhile does not give its duplicate slots back (they leak).
"""

from __future__ import annotations

import heapq
from typing import NamedTuple


class Entry:
    __slots__ = ("serial", "tokens", "slots", "up", "kids", "pins", "stamp")

    def __init__(self, serial, tokens, slots, up):
        self.serial, self.tokens, self.slots, self.up = serial, tokens, slots, up
        self.kids, self.pins, self.stamp = {}, 0, 0


class Hit(NamedTuple):
    slots: list
    entry: Entry


class SlotPool:
    """KV slots ``0 .. size - 1``; ``take`` returns ``[]`` when short."""

    def __init__(self, size):
        self.size, self.free_ids = size, list(range(size))

    def available(self):
        return len(self.free_ids)

    def take(self, n):
        if n > len(self.free_ids):
            return []
        out, self.free_ids = self.free_ids[:n], self.free_ids[n:]
        return out

    def give(self, ids):
        self.free_ids.extend(ids)


class PrefixTree:
    def __init__(self):
        self.serials, self.clock = 0, 0
        self.root = Entry(0, None, None, None)
        self.root.pins = 1
        self.cached = self.pinned = 0  # tokens in the tree / in pinned entries

    def _entry(self, tokens, slots, up):
        self.serials += 1
        return Entry(self.serials, tokens, slots, up)

    def _walk(self, tokens, now):
        """The longest cached prefix of ``tokens``: (its slots, its last entry), splitting an
        entry the prefix ends inside; each entry read is stamped ``now``."""
        node, got, i = self.root, [], 0
        while i < len(tokens) and tokens[i] in node.kids:
            child = node.kids[tokens[i]]
            n = 0
            while n < len(child.tokens) and i + n < len(tokens) and child.tokens[n] == tokens[i + n]:
                n += 1
            if n < len(child.tokens):
                child = self._split(child, n)
            child.stamp = now
            got += child.slots
            node, i = child, i + n
        return got, node

    def _split(self, e, n):
        """Cut ``e`` after ``n`` tokens; the upper part keeps its pins and stamp."""
        upper = self._entry(e.tokens[:n], e.slots[:n], e.up)
        upper.pins, upper.stamp = e.pins, e.stamp
        e.up.kids[e.tokens[0]] = upper
        e.tokens, e.slots, e.up = e.tokens[n:], e.slots[n:], upper
        upper.kids[e.tokens[0]] = e
        return upper

    def lookup(self, tokens) -> Hit:
        self.clock += 1
        self.root.stamp = self.clock
        return Hit(*self._walk(tokens, self.clock))

    def store(self, tokens, slots) -> int:
        """Cache ``tokens``; returns how many leading ones were cached already (the caller
        gives back its copies of their slots)."""
        self.clock += 1
        had, node = self._walk(tokens, self.clock)
        i = len(had)
        if i < len(tokens):
            leaf = self._entry(list(tokens[i:]), list(slots[i:]), node)
            leaf.stamp = self.clock
            node.kids[tokens[i]] = leaf
            self.cached += len(tokens) - i
        return i

    def pin(self, e):
        while e is not self.root:
            if e.pins == 0:
                self.pinned += len(e.tokens)
            e.pins += 1
            e = e.up

    def unpin(self, e):
        walk = e
        while walk is not self.root:
            if walk.pins <= 0:
                raise ValueError(f"entry {walk.serial} is not pinned")
            walk = walk.up
        while e is not self.root:
            e.pins -= 1
            if e.pins == 0:
                self.pinned -= len(e.tokens)
            e = e.up

    def leaves(self):
        out, stack = [], [self.root]
        while stack:
            e = stack.pop()
            if e is not self.root and not e.kids and e.pins == 0:
                out.append(e)
            stack.extend(e.kids.values())
        return out

    def evict(self, n) -> list:
        """Drop unpinned leaves, least recently used first, until ``n`` tokens are out;
        returns their slots (the caller gives them back)."""
        heap = [(e.stamp, e.serial, e) for e in self.leaves()]
        heapq.heapify(heap)
        freed = []
        while len(freed) < n and heap:
            e = heapq.heappop(heap)[2]
            freed += e.slots
            self._drop(e)
            up = e.up
            if up is not self.root and not up.kids and up.pins == 0:
                heapq.heappush(heap, (up.stamp, up.serial, up))
        return freed

    def _drop(self, e):
        del e.up.kids[e.tokens[0]]
        self.cached -= len(e.tokens)


class Seq:
    """A running sequence: ``slots`` for ``tokens[:len(slots)]``, ``done`` computed, the
    first ``cached`` owned by the tree (``anchor`` pinned)."""

    def __init__(self, tokens, slots, cached, anchor):
        self.tokens, self.slots, self.anchor = tokens, slots, anchor
        self.done = self.cached = cached


class Scheduler:
    def __init__(self, pool, tree, *, fast_finish=False):
        self.pool, self.tree, self.fast_finish = pool, tree, fast_finish
        self.running = []

    def _allocate(self, n):
        short = n - self.pool.available()
        if short > 0:
            self.pool.give(self.tree.evict(short))
        return self.pool.take(n)

    def admit(self, tokens):
        """Match all but the last token, pin it, allocate the rest; None when out of memory."""
        hit = self.tree.lookup(tokens[:-1])
        self.tree.pin(hit.entry)
        own = self._allocate(len(tokens) - len(hit.slots))
        if not own:
            self.tree.unpin(hit.entry)
            return None
        seq = Seq(list(tokens), hit.slots + own, len(hit.slots), hit.entry)
        self.running.append(seq)
        return seq

    def step(self, seq, n):
        """The model computed ``n`` more tokens of ``seq``."""
        seq.done = min(len(seq.tokens), seq.done + n)

    def checkpoint(self, seq):
        """Between prefill chunks: cache what is computed, move the pin to it."""
        had = self.tree.store(seq.tokens[:seq.done], seq.slots[:seq.done])
        self.pool.give(seq.slots[seq.cached:had])
        hit = self.tree.lookup(seq.tokens[:seq.done])
        seq.slots[seq.cached:len(hit.slots)] = hit.slots[seq.cached:]
        self.tree.pin(hit.entry)
        self.tree.unpin(seq.anchor)
        seq.cached, seq.anchor = len(hit.slots), hit.entry

    def finish(self, seq):
        had = self.tree.store(seq.tokens, seq.slots)
        if not self.fast_finish:
            self.pool.give(seq.slots[seq.cached:had])
        self.tree.unpin(seq.anchor)
        self.running.remove(seq)

    def abort(self, seq):
        self.pool.give(seq.slots[seq.cached:])
        self.tree.unpin(seq.anchor)
        self.running.remove(seq)
