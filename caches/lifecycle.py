"""A request's life past its prefill, as the engines' schedulers allocate it -- one place
for every variant and target:

* ``decode_slot``: one decode step's slot.  A position inside the request's last page takes
  the next slot of that page; one on a page boundary takes a fresh page (SGLang 0.5.23
  ``mem_cache/allocation.py`` ``alloc_for_decode_default`` (lines 625-660): ``alloc_token_slots``
  at page 1, else ``alloc_paged_token_slots_decode`` (lines 572-622), whose allocator hands
  ``last_loc + 1`` unless the new length starts a page);
* ``trim_rejected``: after a speculative verify, the row keeps its accepted positions and
  the pages wholly past them go back (SGLang's EAGLE worker frees the rejected draft slots
  after ``verify``: at page 1 each slot, paged the pages the kept length no longer touches).
"""

from __future__ import annotations

from typing import Callable


def decode_slot(kv_indices: list[int], page_size: int,
                alloc: Callable[[int], list[int] | None]) -> int | None:
    """The slot for position ``len(kv_indices)``, or None when the pool is out of memory
    (``alloc(n)`` allocates ``n`` tokens on fresh pages, evicting as the engine does)."""
    if kv_indices and len(kv_indices) % page_size:
        return kv_indices[-1] + 1
    got = alloc(1)
    return None if not got else got[0]


def trim_rejected(kv_indices: list[int], keep: int, page_size: int,
                  free: Callable[[list[int]], None]) -> None:
    """Cut the row to ``keep`` positions and free the pages only the cut part touched."""
    start = -(-keep // page_size) * page_size  # the kept part's last page stays
    gone = kv_indices[start:]
    del kv_indices[keep:]
    if gone:
        free(gone)
