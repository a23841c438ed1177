"""What a target's subject provides, per variant: the seam every engine plugs into.

A *subject* is what a machine drives: a cache, the pools it owns (or was given), and the
serving layer that calls it the way the engine's scheduler does.  A target's builder
(``caches/target.py``) returns one.  The machines only ever:

* call the **op entry points** -- one method per op of the variant's table
  (``state_machines/<variant>.py``), keyword arguments as in the table, returning a short
  result in words (what a caller sees: hit length, tokens allocated/evicted, out of memory);
  an op whose precondition does not hold raises ``caches.subjects.base.Skip`` (a no-op, so a
  trace stays valid), and one that would only re-find a recorded upstream defect raises
  ``caches.adapters.KnownUpstreamFinding`` unless the target was built with
  ``known_findings="find"``;
* call ``check()`` after every op: it builds the **plain views** (``invariants/views.py``:
  ``TreeView``/``NodeView``, ``PoolView``, per-request holdings) from the cache's readable
  state and runs the pure invariants over them, raising ``invariants.Violation`` naming the
  property;
* call ``quiesce()`` at the end of every example (drain: finish or abort every live request,
  release every lock, evict everything; then the leak detector);
* read the **ledger** (``live()``, ``requests``, ``locks``) to pick ids, ``counters()`` for
  diff mode and reports, ``outline()``/``tree_view()`` for humans, and ``reached_counts``
  for coverage ("sometimes" transitions the subject counts with ``reached(name)``, usually by
  wrapping cache methods on the instance with ``caches.subjects.base.watch``).

Optional: ``canonical()`` (exhaustive search, ``kvcheck check``), ``prepare_for_diff()``
(``kvcheck diff`` with the reference's allocation policy), ``abstract_state()`` (what
``kvcheck diff`` compares instead of result words; ``RadixSubject`` has one, and its
``policy.differences`` the accepted ones: ``caches/seam.py``), ``partial_pages`` (True when the
engine's tree keeps partial last pages: the structure and match checks then work at token
granularity instead of demanding page multiples).

The subjects in ``caches/subjects/`` drive kvcheck's reference caches; each also drives any
cache object with the same method names (that is how faults and the SGLang adapters plug in),
and the docstring of each subject module lists those names.  ``tests/test_targets.py`` keeps
the protocols and the op tables equal and checks every registered target's subject against
its variant's protocol.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol, runtime_checkable


@runtime_checkable
class SubjectProtocol(Protocol):
    """What every variant's subject provides (beside its ops)."""

    variant: str
    checking: bool  # False: no read-backs or contract checks (the bench's bare ops)
    requests: dict  # live requests (or sessions) by id
    locks: dict  # bare lock holders by id
    reached_counts: Counter

    def live(self) -> list[int]: ...

    def check(self) -> None: ...

    def quiesce(self) -> str: ...

    def counters(self) -> dict: ...

    def outline(self) -> str: ...

    def tree_view(self): ...


@runtime_checkable
class BatchAdmissionProtocol(Protocol):
    """Batch admission (``caches/subjects/lifecycle.py``): ``enqueue`` into the waiting queue,
    ``schedule`` one step against the engine's budget.  A target that cannot take one of them
    declares why (``lifecycle_declined``)."""

    def enqueue(self, rid: int, tokens: list[int], max_new: int) -> str: ...

    def schedule(self, n: int) -> str: ...


@runtime_checkable
class DecodeScheduleProtocol(BatchAdmissionProtocol, Protocol):
    """Past the prefill: decode, and batch admission (``BatchAdmissionProtocol``)."""

    def decode(self, rid: int, n: int) -> str: ...


@runtime_checkable
class LifecycleProtocol(DecodeScheduleProtocol, Protocol):
    """A request's whole life: ``DecodeScheduleProtocol`` and retract (release without
    insert, re-queued)."""

    def retract(self, rid: int) -> str: ...


class RadixProtocol(LifecycleProtocol, SubjectProtocol, Protocol):
    """``radix``: SGLang/pymllm-style radix prefix cache with lock refs."""

    def admit(self, rid: int, tokens: list[int]) -> str: ...

    def prefill(self, rid: int, n: int) -> str: ...

    def finish(self, rid: int) -> str: ...

    def abort(self, rid: int) -> str: ...

    def evict(self, n: int) -> str: ...

    def insert(self, tokens: list[int]) -> str: ...

    def match(self, tokens: list[int]) -> str: ...

    def lock(self, hid: int, tokens: list[int]) -> str: ...

    def unlock(self, hid: int) -> str: ...

    def stray_unlock(self, tokens: list[int]) -> str: ...

    def spec_decode(self, rid: int, draft: int, accepted: int) -> str: ...

    def dllm_step(self, rid: int, resolve: int) -> str: ...


@runtime_checkable
class PagedBigPageProtocol(DecodeScheduleProtocol, SubjectProtocol, Protocol):
    """``paged-bigpage``: LightLLM's linear-attention paged radix cache (small and big pages,
    state buffers); of the lifecycle ops, decode, enqueue and schedule (``retract`` declined:
    LightLLM retracts by pause / resume)."""

    def admit(self, rid: int, tokens: list[int]) -> str: ...

    def prefill(self, rid: int, n: int) -> str: ...

    def finish(self, rid: int) -> str: ...

    def abort(self, rid: int) -> str: ...

    def pause(self, rid: int) -> str: ...

    def resume(self, rid: int) -> str: ...

    def match(self, tokens: list[int]) -> str: ...

    def evict(self, n: int) -> str: ...

    def evict_small_buffer(self) -> str: ...


@runtime_checkable
class StreamingSessionProtocol(BatchAdmissionProtocol, SubjectProtocol, Protocol):
    """``streaming-session``: SGLang's session-aware cache for multi-turn streaming; a
    session's turn may also wait (``enqueue_turn``) and be admitted by ``schedule`` with the
    plain requests."""

    def enqueue_turn(self, sid: int, tokens: list[int], max_new: int) -> str: ...

    def open_session(self, sid: int) -> str: ...

    def turn(self, sid: int, tokens: list[int]) -> str: ...

    def rewind_turn(self, sid: int, rewind: int, tokens: list[int]) -> str: ...

    def decode(self, sid: int, n: int) -> str: ...

    def spec_decode(self, sid: int, draft: int, accepted: int) -> str: ...

    def finish_turn(self, sid: int) -> str: ...

    def retract(self, sid: int) -> str: ...

    def abort_turn(self, sid: int) -> str: ...

    def pre_abort_turn(self, sid: int) -> str: ...

    def release_session(self, sid: int) -> str: ...

    def admit(self, rid: int, tokens: list[int]) -> str: ...

    def finish(self, rid: int) -> str: ...

    def abort(self, rid: int) -> str: ...

    def evict(self, n: int) -> str: ...


@runtime_checkable
class HiMambaProtocol(LifecycleProtocol, SubjectProtocol, Protocol):
    """``himamba``: full KV + mamba state, device and host tiers, tombstones."""

    def admit(self, rid: int, tokens: list[int]) -> str: ...

    def prefill(self, rid: int, n: int) -> str: ...

    def finish(self, rid: int) -> str: ...

    def abort(self, rid: int) -> str: ...

    def insert(self, tokens: list[int]) -> str: ...

    def match(self, tokens: list[int]) -> str: ...

    def lock(self, hid: int, tokens: list[int]) -> str: ...

    def unlock(self, hid: int) -> str: ...

    def evict(self, n: int) -> str: ...

    def evict_mamba(self, n: int) -> str: ...

    def evict_host(self, n: int) -> str: ...

    def evict_mamba_host(self, n: int) -> str: ...

    def backup(self, tokens: list[int]) -> str: ...

    def write_ack(self) -> str: ...

    def storage_ack(self) -> str: ...

    def prefetch(self, hid: int, tokens: list[int]) -> str: ...

    def prefetch_done(self, hid: int) -> str: ...

    def prefetch_abort(self, hid: int) -> str: ...


@runtime_checkable
class ContinuationStateProtocol(BatchAdmissionProtocol, SubjectProtocol, Protocol):
    """``continuation-state``: TokenSpeed's History/State cache groups with continuation
    snapshots, and batch admission (``BatchAdmissionProtocol``)."""

    def admit(self, rid: int, tokens: list[int], chunk: int) -> str: ...

    def step(self, rid: int) -> str: ...

    def finish(self, rid: int) -> str: ...

    def abort(self, rid: int) -> str: ...

    def retract(self, rid: int) -> str: ...

    def recover(self, rid: int) -> str: ...

    def evict(self, n: int) -> str: ...


@runtime_checkable
class BlockHashProtocol(BatchAdmissionProtocol, SubjectProtocol, Protocol):
    """``block-hash``: vLLM v1's hash-chained block prefix cache (KV cache manager, block
    pool, LRU free queue); its decode is ``step``, its retract ``preempt``."""

    def admit(self, rid: int, tokens: list[int], chunk: int) -> str: ...

    def step(self, rid: int) -> str: ...

    def finish(self, rid: int) -> str: ...

    def abort(self, rid: int) -> str: ...

    def preempt(self, rid: int) -> str: ...

    def resume(self, rid: int) -> str: ...

    def evict(self, n: int) -> str: ...

    def reset(self) -> str: ...


@runtime_checkable
class HybridSWAProtocol(LifecycleProtocol, SubjectProtocol, Protocol):
    """``hybrid-swa``: a radix cache over a full pool and a sliding-window pool (tombstones,
    window locks, out-of-window frees)."""

    def admit(self, rid: int, tokens: list[int]) -> str: ...

    def prefill(self, rid: int, n: int) -> str: ...

    def finish(self, rid: int) -> str: ...

    def abort(self, rid: int) -> str: ...

    def evict(self, n: int) -> str: ...

    def insert(self, tokens: list[int]) -> str: ...

    def match(self, tokens: list[int]) -> str: ...

    def lock(self, hid: int, tokens: list[int]) -> str: ...

    def unlock(self, hid: int) -> str: ...

    def stray_unlock(self, tokens: list[int]) -> str: ...

    def spec_decode(self, rid: int, draft: int, accepted: int) -> str: ...

    def evict_swa(self, n: int) -> str: ...

    def release_window(self, rid: int) -> str: ...


PROTOCOLS = {
    "radix": RadixProtocol,
    "paged-bigpage": PagedBigPageProtocol,
    "streaming-session": StreamingSessionProtocol,
    "himamba": HiMambaProtocol,
    "continuation-state": ContinuationStateProtocol,
    "block-hash": BlockHashProtocol,
    "hybrid-swa": HybridSWAProtocol,
}


def protocol_ops(variant: str) -> list[str]:
    """The op entry points the variant's protocol declares (beside the common ones)."""
    proto = PROTOCOLS[variant]
    common = set(dir(SubjectProtocol))
    own = {n: v for cls in reversed(proto.__mro__) if cls.__module__ == __name__
           for n, v in vars(cls).items()}
    return [n for n, v in own.items() if callable(v) and not n.startswith("_")
            and n not in common]
