"""Cache groups for the continuation-state variant: the per-group page pools and request tables.

Upstream (lightseekorg/tokenspeed @754c3405, ``tokenspeed-scheduler/csrc/resource/``):
``allocator/paged_cache_group.{h,cpp}`` (``PagedCacheGroupTable``) and
``allocator/page_allocator.cpp`` (``PageAllocator``).

* A *group* has a family (History: full retention, or State: a sliding window of ``window``
  raw tokens) and ``page_tokens`` raw tokens per page.
* Each group has its own page pool.  Upstream's free list is a LIFO stack (``pop_back`` /
  ``push_back``): a page freed now is the next page handed out, so a reuse-after-free shows up
  at once.  ``PagePool`` is a ``StatePool`` (ids 1..n, id 0 reserved, a torch data tensor of
  fingerprints) handing ids out LIFO.
* A request keeps one ``GroupTable`` per group: ``base`` (the logical page of column 0), the
  ``borrowed`` ids (physically owned by some tree snapshot; dropping one is index-only) followed
  by the ``owned`` ids (the request's; dropping one frees it), ``cursor`` (raw tokens reserved)
  and ``committed`` (raw tokens committed to snapshots).  There are no refcounts.
"""

from __future__ import annotations

from dataclasses import dataclass

from caches.pools import StatePool

HISTORY, STATE = "History", "State"


@dataclass(frozen=True)
class CacheGroup:
    gid: str
    family: str  # HISTORY | STATE
    page_tokens: int
    window: int = 0  # raw tokens kept by a State (sliding-window) group

    @property
    def sliding(self) -> bool:
        return self.family == STATE


@dataclass
class Segment:
    """A snapshot's pages of one group: ``pages[j]`` holds logical page ``base + j``."""

    pages: list
    base: int

    @property
    def end(self) -> int:
        return self.base + len(self.pages)


class AcquireFailed(RuntimeError):
    """``PagedCacheGroupTable::Acquire: failed to allocate pages`` (the #460 crash)."""


class PagePool(StatePool):
    """A group's page pool: ids 1..size (0 reserved), LIFO free list like ``PageAllocator``."""

    unit = "page"

    def __init__(self, size: int, device=None, name: str = "pages"):
        super().__init__(size, device, name)
        self.free_slots.reverse()  # the top of the stack is the end: hands out 1, 2, ... first

    def alloc(self, n: int = 1):
        if n > len(self.free_slots):
            return None
        if n <= 0:
            return []
        got = self.free_slots[-n:][::-1]
        del self.free_slots[-n:]
        return got


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class GroupTable:
    """``PagedCacheGroupTable``: borrowed ids first, then owned ids, from logical page ``base``."""

    def __init__(self, group: CacheGroup, pool: PagePool):
        self.group, self.pool = group, pool
        self.base = 0
        self.borrowed: list[int] = []
        self.owned: list[int] = []
        self.cursor = 0
        self.committed = 0

    # -- reading ------------------------------------------------------------------------
    @property
    def P(self) -> int:
        return self.group.page_tokens

    @property
    def end(self) -> int:
        """One past the last logical page the table holds."""
        return self.base + len(self.borrowed) + len(self.owned)

    def entries(self):
        """(logical page, id, borrowed?) for every column."""
        out = [(self.base + j, i, True) for j, i in enumerate(self.borrowed)]
        nb = len(self.borrowed)
        out += [(self.base + nb + j, i, False) for j, i in enumerate(self.owned)]
        return out

    def __repr__(self) -> str:
        return (f"{self.group.gid}[base={self.base} borrowed={self.borrowed} owned={self.owned} "
                f"cursor={self.cursor} committed={self.committed}]")

    # -- planning (pure: what release_skipped + acquire would do) --------------------------
    def plan(self, first: int, target: int) -> tuple[int, int]:
        """(owned pages the slide would free, pages ``acquire(target)`` would allocate)."""
        base, nb, no = self.base, len(self.borrowed), len(self.owned)
        freed = 0
        if self.group.sliding:
            k = max(0, first - self.group.window + 1) // self.P
            if k > base:
                if nb + no == 0:
                    base = k
                else:
                    n = min(k - base, nb + no)
                    freed = max(0, n - nb)
                    base, nb, no = base + n, max(0, nb - n), no - freed
        return freed, max(0, _ceil(target, self.P) - (base + nb + no))

    # -- the table's operations ------------------------------------------------------------
    def acquire(self, t: int) -> None:
        need = _ceil(t, self.P) - self.end
        if need > 0:
            got = self.pool.alloc(need)
            if got is None:
                raise AcquireFailed(f"PagedCacheGroupTable::Acquire: failed to allocate {need} "
                                    f"page(s) for group {self.group.gid}")
            self.owned += got
        self.cursor = max(self.cursor, t)

    def release_skipped(self, lo: int) -> None:
        """Sliding groups: drop the columns below raw token ``lo`` (borrowed first, index only;
        then owned, back to the pool)."""
        k = lo // self.P
        if k <= self.base:
            return
        if not self.borrowed and not self.owned:
            self.base = k
            return
        n = min(k - self.base, len(self.borrowed) + len(self.owned))
        nb = min(n, len(self.borrowed))
        del self.borrowed[:nb]
        drop = self.owned[: n - nb]
        del self.owned[: n - nb]
        self.pool.free(drop)
        self.base += n

    def commit_history(self, t: int) -> Segment:
        n = (t - self.committed) // self.P
        seg = Segment(self.owned[:n], self.committed // self.P)
        del self.owned[:n]
        self.borrowed += seg.pages
        self.committed = t
        return seg

    def adopt_history(self, ids, t: int) -> None:
        """Another request committed these tokens first: free ours, borrow the snapshot's."""
        n = (t - self.committed) // self.P
        self.pool.free(self.owned[:n])
        del self.owned[:n]
        self.borrowed += list(ids)
        self.committed = t

    def checkpoint_state(self, t: int) -> Segment | None:
        """Move the owned delta of the window ending at ``t`` into a segment (None = EMPTY)."""
        if t <= self.committed:
            return None
        lp = max(0, t - self.group.window) // self.P
        while self.base < lp and self.borrowed:
            self.borrowed.pop(0)
            self.base += 1
        while self.base < lp and self.owned:
            self.pool.free([self.owned.pop(0)])
            self.base += 1
        n = min(len(self.owned), max(0, t // self.P - (self.base + len(self.borrowed))))
        seg = Segment(self.owned[:n], self.base + len(self.borrowed))
        del self.owned[:n]
        self.borrowed += seg.pages
        self.committed = t
        return seg if seg.pages else None

    def adopt_state(self, ids, seg_base: int, t: int) -> None:
        """Borrow a snapshot's State segment in place of the same logical pages.

        Upstream first drops every column before ``seg_base``; we replace just the segment's
        range (docs/variants/continuation-state.md, "modelled differently")."""
        cols = [[i, True] for i in self.borrowed] + [[i, False] for i in self.owned]
        for j, pid in enumerate(ids):
            pos = seg_base + j - self.base
            if pos < 0:
                continue  # already slid out of this table
            if pos >= len(cols):
                raise AssertionError(f"adopt_state past the table's end: {self!r}")
            if not cols[pos][1]:
                self.pool.free([cols[pos][0]])
            cols[pos] = [pid, True]
        nb = 0
        while nb < len(cols) and cols[nb][1]:
            nb += 1
        if any(b for _, b in cols[nb:]):
            raise AssertionError(f"adopt_state left an owned column before a borrowed one: "
                                 f"{cols}")
        self.borrowed = [i for i, _ in cols[:nb]]
        self.owned = [i for i, _ in cols[nb:]]
        self.committed = t

    def import_borrowed(self, ids, base: int, t: int) -> None:
        """A fresh table starts from a cache hit: borrow the hit's pages."""
        self.borrowed, self.base = list(ids), base
        self.cursor = self.committed = t

    def release_all(self) -> None:
        self.borrowed.clear()
        self.pool.free(self.owned)
        self.owned = []
        self.base = self.cursor = self.committed = 0
