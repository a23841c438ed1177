"""A full KV pool paired with a sliding-window pool (SGLang's ``SWATokenToKVPoolAllocator``).

Upstream (sglang 0.5.23 ``srt/mem_cache/allocator/swa.py``): one allocation hands out full KV
slots and, for each, a slot of the smaller sliding-window (SWA) pool; the full -> window
index map (``full_to_swa_index_mapping``) says which.  ``free(full)`` gives both back;
``free_swa(full)`` gives back only the window slots (the full KV stays: a *tombstone* in the
tree, or the out-of-window part of a running request) and clears their map entries.  A full
slot without a window slot maps to 0: window page 0 is the padding sink, reserved, never
handed out and never freed -- freeing the map entry of an unmapped slot would free it
(SGLang's ``free_swa`` skips entries that map to 0).

``SWAPagedAllocator`` *is* the full pool (a ``PagedAllocator``: the radix cache and its
subject see the pool they always saw) with ``window``, the second pool, beside it.  Pages are
allocated in pairs -- a full page gets a window page, slot ``i`` of the one maps to slot ``i``
of the other -- so page-granular frees of either pool stay aligned.  ``available_size`` is the
smaller of the two pools' (as upstream).
"""

from __future__ import annotations

from typing import Iterable

from caches.pools import PagedAllocator

SENTINEL = 0  # the window pool's padding page (and what an unmapped full slot maps to)


class SWAPagedAllocator(PagedAllocator):
    def __init__(self, num_pages: int, window_pages: int, page_size: int = 1,
                 device: str | None = None, name: str = "kv"):
        super().__init__(num_pages, page_size, device, name=name)
        self.window = PagedAllocator(window_pages, page_size, device, name="window")
        self.mapping: dict[int, int] = {}  # full slot -> window slot (absent: 0, the sentinel)

    def available_size(self) -> int:
        return min(super().available_size(), self.window.available_size())

    def full_available_size(self) -> int:
        return super().available_size()

    def alloc(self, num_tokens: int) -> list[int] | None:
        need = -(-num_tokens // self.page_size)
        if need > len(self.free_pages) or need > len(self.window.free_pages):
            return None
        ps = self.page_size
        full = super().alloc(need * ps)
        window = self.window.alloc(need * ps)
        for f, w in zip(full, window):
            self.mapping[f] = w
        return full[:num_tokens]

    def translate(self, slots: Iterable[int]) -> list[int]:
        """The window slots of these full slots (0 where there is none)."""
        return [self.mapping.get(s, SENTINEL) for s in slots]

    def free(self, slot_ids: Iterable[int]) -> None:
        slot_ids = list(slot_ids)
        self.free_swa(slot_ids)
        super().free(slot_ids)

    def free_swa(self, slot_ids: Iterable[int]) -> None:
        """Give back the window pages of these full slots' pages; their full KV stays.  An
        unmapped slot (0) is skipped -- the sentinel is never freed."""
        ps = self.page_size
        pages = {s // ps for s in slot_ids}
        freed = []
        for p in sorted(pages):
            w = self.mapping.get(p * ps, SENTINEL)
            if w == SENTINEL:
                continue
            for i in range(ps):
                self.mapping.pop(p * ps + i, None)
            freed.append(w)
        self.window.free(freed)

    def move_window(self, kept: list[int], incoming: list[int]) -> None:
        """Hand the window pages of ``incoming``'s full pages to ``kept``'s (the same logical
        tokens, page by page): ``kept`` now maps them and ``incoming`` maps nothing (SGLang's
        ``clear_full_to_swa_mapping(incoming)`` + ``set_full_to_swa_mapping(kept, ...)``)."""
        moved = self.translate(incoming)
        for s in incoming:
            self.mapping.pop(s, None)
        for k, w in zip(kept, moved):
            if w != SENTINEL:
                self.mapping[k] = w
