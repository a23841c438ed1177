"""Memory pools backed by torch tensors, with the upstream allocation rules.

Three pools, as the serving engines have them:

* ``PagedAllocator`` -- token slots handed out in pages of ``page_size`` slots.  Page 0 is
  reserved (upstream uses slot/page 0 as padding).  ``free`` frees *whole pages*: every page
  touched by the ids given goes back to the free list, exactly like SGLang's
  ``PagedTokenToKVPoolAllocator.free`` (``unique(idx // page_size)``).  Like upstream it does
  not detect double frees -- that is the invariants' job (a page twice in the free list).
* ``TokenSlotAllocator`` -- the ``page_size == 1`` case.
* ``StatePool`` -- fixed-size state slots (mamba states, big-page buffers, ...); slot 0
  reserved, one id per slot.

Every pool owns a ``data`` tensor on the device asked for.  The harness writes a fingerprint
of what a slot holds when it is filled and reads it back on every cache hit, so a slot freed
while still in use and then reused shows up as corrupted data on the real device memory.

The free lists are Python lists (a mirror of upstream's free-page tensors): a scalar torch op
costs microseconds, a list op tens of nanoseconds, and the checks read the free list every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from collections.abc import Iterable, Mapping, Sequence

import torch

from invariants.conservation import consistent_lists, ids_1_to
from invariants.views import PoolView


def default_device() -> str:
    return "cuda" if _cuda_available() else "cpu"


@lru_cache(maxsize=1)
def _cuda_available() -> bool:
    """``torch.cuda.is_available()``, asked once per process (every subject's pools ask,
    a native walk builds a subject, and each answer costs microseconds)."""
    return torch.cuda.is_available()


def resolve_device(device: str | None) -> torch.device:
    """The torch device for ``--device`` (None -> cuda if available, else cpu)."""
    name = device or default_device()
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ValueError(f"unknown device {name!r}: {exc}") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":  # mps, xpu, meta, ...: the pools and fingerprints are cpu/cuda only
        raise ValueError(f"device {name!r} is not supported: use cpu or cuda[:N]")
    if not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but torch sees no CUDA device")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: torch sees {torch.cuda.device_count()} CUDA "
                         "device(s)")
    return dev


WHOLE_READ = 4096  # pools up to this many slots are read back whole (``_DataTensor.read``)


class _DataTensor:
    """A device tensor of fingerprints, one int64 per slot.

    On the CPU the writes and reads go through a numpy array over the tensor's own memory
    (``Tensor.numpy()`` shares it): the same slots of the same tensor, without a torch op
    per call (a scalar torch write costs ~6 us, the numpy one under 1).  On CUDA they are
    torch ops on the device."""

    def __init__(self, size: int, device: torch.device):
        self.device = device
        self.data = torch.zeros(size, dtype=torch.int64, device=device)
        self._host = _host_view(self.data)

    def write(self, ids: Sequence[int], values: Sequence[int]) -> None:
        n = len(ids)
        if n == 0:
            return
        host = self._host
        a = ids[0]
        if type(a) is int and 0 <= a and a + n <= self.data.shape[0] and len(values) == n \
                and list(ids) == list(range(a, a + n)):
            # a run of consecutive slots (what an allocation mostly hands out): one slice
            # copy instead of an index tensor and a scatter -- the same slots get the same
            # values
            if host is not None:
                host[a:a + n] = values
            else:
                self.data[a:a + n] = torch.tensor(list(values), dtype=torch.int64,
                                                  device=self.device)
            return
        if host is not None:
            host[list(ids)] = list(values)
            return
        idx = torch.tensor(list(ids), dtype=torch.int64, device=self.device)
        self.data[idx] = torch.tensor(list(values), dtype=torch.int64, device=self.device)

    def read(self, ids: Sequence[int]) -> list[int]:
        if len(ids) == 0:
            return []
        n = self.data.shape[0]
        if n <= WHOLE_READ and min(ids) >= 0 and max(ids) < n:
            # a small pool: one copy of the whole tensor back, indexed on the host, costs a
            # fraction of a host-to-device index tensor, a gather and a copy back
            data = self.snapshot()
            return [data[i] for i in ids]
        if self._host is not None:
            return self._host[list(ids)].tolist()
        idx = torch.tensor(list(ids), dtype=torch.int64, device=self.device)
        return self.data[idx].tolist()

    def snapshot(self) -> list[int]:
        """Every slot's value, as a list (one copy back from the device)."""
        host = self._host
        return host.tolist() if host is not None else self.data.tolist()


def _host_view(t: torch.Tensor):
    """A numpy array over ``t``'s memory when ``t`` is on the CPU (else None)."""
    if t.device.type != "cpu":
        return None
    try:
        return t.numpy()
    except (RuntimeError, TypeError):  # a torch built without numpy: torch ops then
        return None


class _IdLedger:
    """A pool's conservation test on its own ids (what the fast verdicts ask)."""

    def free_and_capacity(self) -> tuple:
        """(free ids, capacity) of the pool (ids ``1..capacity``; id 0 reserved)."""
        raise NotImplementedError

    def consistent(self, owners, borrowed=None, held_once: int = 0) -> bool:
        """``_consistent(self.view(), owners, borrowed)`` without building the view (the
        fast verdicts' conservation test); owners and readers as lists of id lists, or as
        mappings of their names to id lists (the names say nothing to the verdict).  With
        ``held_once`` the first that many owners (the tree's) together list no id twice too
        (``check_held_once``; ``consistent_lists``)."""
        if type(owners) is not list and isinstance(owners, Mapping):
            owners = list(owners.values())
        if borrowed and type(borrowed) is not list and isinstance(borrowed, Mapping):
            borrowed = list(borrowed.values())
        free, cap = self.free_and_capacity()
        return consistent_lists(free, cap, (0,), owners, borrowed,
                                ids_1_to(cap) if cap > 0 else None, held_once)


class PagedAllocator(_DataTensor, _IdLedger):
    """Token slots in pages; page 0 reserved; ``free`` releases whole pages."""

    unit = "page"

    def __init__(self, num_pages: int, page_size: int = 1, device: str | None = None,
                 name: str = "kv"):
        if num_pages < 1:
            raise ValueError(f"a pool needs at least one page, got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        super().__init__((num_pages + 1) * page_size, resolve_device(device))
        self.name = name
        self.page_size = page_size
        self.num_pages = num_pages
        self.free_pages: list[int] = list(range(1, num_pages + 1))

    # -- allocation -------------------------------------------------------------------
    def available_size(self) -> int:
        """Free token slots (whole free pages)."""
        return len(self.free_pages) * self.page_size

    def alloc(self, num_tokens: int) -> list[int] | None:
        """Slot ids for ``num_tokens`` tokens on fresh pages, or None if short.

        The request owns every slot of the pages it is given, also the unused tail of the last.
        """
        need = -(-num_tokens // self.page_size)
        if need > len(self.free_pages):
            return None
        pages, self.free_pages = self.free_pages[:need], self.free_pages[need:]
        ps = self.page_size
        return [p * ps + i for p in pages for i in range(ps)][:num_tokens]

    def free(self, slot_ids: Iterable[int]) -> None:
        """Free every page touched by ``slot_ids`` (no double-free detection, like upstream)."""
        pages = sorted({s // self.page_size for s in slot_ids})
        self.free_pages.extend(pages)

    def pages_of(self, slot_ids: Iterable[int]) -> list[int]:
        """Distinct pages covering these slots, in first-seen order."""
        ps = self.page_size
        if ps == 1:
            return list(dict.fromkeys(slot_ids))
        return list(dict.fromkeys([s // ps for s in slot_ids]))  # (dedup in C, same order)

    def consistent_slots(self, owners: list, borrowed: list | None = None) -> bool:
        """``consistent`` over the pages of each owner's and reader's slot lists
        (``consistent([pages_of(o) for o in owners], ...)``), without the page lists: with
        pages of several slots each owner's pages are a set (an owner holds a page once, as
        many of its slots as it has), and the sets must be disjoint from the free list and
        each other and add up to the pool."""
        ps = self.page_size
        if ps == 1:
            return self.consistent(owners, borrowed)
        free = self.free_pages
        fs = set(free)
        total = len(fs)
        if total != len(free):  # a page freed twice
            return False
        seen = set(fs)
        for slots in owners:
            pages = {s // ps for s in slots}
            total += len(pages)
            seen |= pages
        if total != len(seen) or seen != ids_1_to(self.num_pages):
            return False
        return not borrowed or all(fs.isdisjoint({s // ps for s in slots})
                                   for slots in borrowed)

    def view(self) -> PoolView:
        return PoolView(name=self.name, unit=self.unit, capacity=self.num_pages,
                        free=tuple(self.free_pages), reserved=(0,))

    def free_and_capacity(self) -> tuple:
        return self.free_pages, self.num_pages


class TokenSlotAllocator(PagedAllocator):
    """One slot per token (``page_size == 1``); slot 0 reserved."""

    unit = "slot"

    def __init__(self, size: int, device: str | None = None, name: str = "kv"):
        super().__init__(size, 1, device, name)


class StatePool(_DataTensor, _IdLedger):
    """Fixed-size state slots (one id per state); slot 0 reserved; no double-free detection."""

    unit = "slot"

    def __init__(self, size: int, device: str | None = None, name: str = "state"):
        if size < 1:
            raise ValueError(f"a state pool needs at least one slot, got {size}")
        super().__init__(size + 1, resolve_device(device))
        self.name = name
        self.size = size
        self.free_slots: list[int] = list(range(1, size + 1))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, n: int = 1) -> list[int] | None:
        if n > len(self.free_slots):
            return None
        got, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return got

    def free(self, ids: Iterable[int]) -> None:
        self.free_slots.extend(ids)

    def view(self) -> PoolView:
        return PoolView(name=self.name, unit=self.unit, capacity=self.size,
                        free=tuple(self.free_slots), reserved=(0,))

    def free_and_capacity(self) -> tuple:
        return self.free_slots, self.size


@dataclass(frozen=True)
class Fingerprint:
    """What the harness writes into a slot: a hash of the token prefix ending at a position.

    KV at position i depends on every token up to i, so two requests that share a prefix must
    read the same fingerprints there; a slot that was freed and refilled reads back wrong.
    """

    @staticmethod
    def of_prefix(tokens: Sequence[int]) -> list[int]:
        out, h = [], 17
        for pos, tok in enumerate(tokens):
            h = (h * 1_000_003 + (tok + 1) * 7919 + pos) & 0x7FFF_FFFF
            out.append(h)
        return out


# the public name: an adapter's pool keeps the fingerprints checked on every hit in one
# (docs/adapters.md, "The radix cache interface")
DataTensor = _DataTensor
