"""What every subject shares: the live-request ledger, the op skeleton and progress guards.

A *subject* is what a state machine drives: a cache plus its pools plus the serving layer
that calls it the way a scheduler does.  Its public methods are the serving operations (one
per op name in the variant's op table) and return a short, human-readable result; ``check``
runs every invariant on the current state; ``drain`` finishes/aborts everything and evicts
everything; ``check_quiescent`` is the leak detector after a drain.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import Callable

from caches.pools import Fingerprint
from caches.request import Req
from invariants import check_fingerprints, fail



def watch(obj, name: str, before: Callable | None = None,
          after: Callable | None = None) -> bool:
    """Wrap method ``name`` on the instance ``obj`` for coverage ("sometimes") counting:
    ``note = before(*args)`` runs first, ``after(result, note, *args)`` last.  The class and
    its code are untouched (faults, being subclasses, are wrapped the same way); an object
    without the method is left alone (False) -- it just reports fewer transitions."""
    orig = getattr(obj, name, None)
    if orig is None:
        return False

    def wrapped(*args, **kwargs):
        note = before(*args) if before is not None else None
        out = orig(*args, **kwargs)
        if after is not None:
            after(out, note, *args)
        return out

    setattr(obj, name, wrapped)
    return True

@lru_cache(maxsize=4096)
def _prefix_fingerprints(tokens: tuple) -> tuple:
    """``Fingerprint.of_prefix``, once per distinct token sequence: the ops write and read back
    the same requests' fingerprints over and over (a pure function of the tokens)."""
    return tuple(Fingerprint.of_prefix(tokens))


def node_objects(root) -> list:
    """Every node object reachable from ``root`` through ``children``, once each, in the order
    of first visits (depth first): a node listed twice -- by two parents, or under its own
    subtree, a cycle -- is walked once, so the checks on a corrupted tree end and the
    structure check says which link is wrong."""
    seen, stack, out = set(), [root], []
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        out.append(n)
        stack.extend(n.children.values())
    return out


class Skip(Exception):
    """An op whose precondition does not hold here (it is a no-op; replays stay valid)."""


class NotDriven(Skip):
    """An op this target's engine cannot take at all (its scheduler path is not driven here):
    a no-op on this target in every state, so a side-by-side diff does not run it on the other
    side either."""


class NoFixModel(LookupError):
    """A known finding whose subject declares no model of its fix (``Subject.fix_models``)."""


class Subject:
    variant = "?"
    checking = True  # False: no read-backs or contract checks (the bench's bare ops)
    quiescing = False  # True while quiesce() drains: transitions are not counted then
    #: known upstream findings' fix models: finding id -> the name of a method that installs,
    #: on this subject only, a minimal model of that finding's fix (the narrowest change that
    #: removes the finding's own mechanism).  A failing trace is that finding only if it
    #: passes with that fix alone (``state_machines/failures.py``).
    fix_models: dict = {}

    def __init__(self):
        self.requests: dict[int, Req] = {}
        self.locks: dict[int, object] = {}  # bare lock holders: id -> locked node
        self.reached_counts: Counter = Counter()  # "sometimes" transitions seen (coverage)

    def apply_fix_model(self, finding: str) -> None:
        """Install the model of known finding ``finding``'s fix on this subject, before its
        first op; ``NoFixModel`` if the subject declares none."""
        method = self.fix_models.get(finding)
        if method is None:
            raise NoFixModel(f"{type(self).__name__} declares no fix model for {finding}")
        getattr(self, method)()

    # -- the ledger ---------------------------------------------------------------------
    def live(self) -> list[int]:
        return sorted(self.requests)

    def held_locks(self) -> Counter:
        """How many live holders (requests and bare locks) lock each node id."""
        held: Counter = Counter()
        for req in self.requests.values():
            held[req.last_node.id] += 1
        for node in self.locks.values():
            held[node.id] += 1
        return held

    def release_holders(self) -> None:
        """Finish every live request that computed all its tokens, abort the rest, and drop
        every bare lock: the first half of a drain for subjects driving ``Req`` objects."""
        for rid in self.live():
            req = self.requests[rid]
            if req.filled == len(req.tokens):
                self.finish(rid)
            else:
                self.abort(rid)
        for hid in sorted(self.locks):
            self.unlock(hid)

    def req(self, rid: int) -> Req:
        if rid not in self.requests:
            raise Skip(f"r{rid} is not live")
        return self.requests[rid]

    # -- fingerprints -------------------------------------------------------------------
    @staticmethod
    def expected_data(tokens) -> list[int]:
        """``Fingerprint.of_prefix(tokens)`` (a fresh list: the cache below keeps tuples)."""
        return list(_prefix_fingerprints(tuple(tokens)))

    def verify_data(self, pool, ids, tokens, what: str) -> None:
        """Read ``ids`` back from ``pool`` and compare with the fingerprints of ``tokens``
        (``check_fingerprints``: the common length of the two).  The read-back is compared
        in one go first; the check's per-position loop runs only to name a wrong one."""
        if ids and self.checking:
            got = pool.read(ids)
            want = _prefix_fingerprints(tuple(tokens))[:len(ids)]
            if tuple(got[:len(want)]) != want:
                check_fingerprints(pool.name, ids, got, list(want), what=what)

    # -- progress -----------------------------------------------------------------------
    def bounded(self, evict: Callable, limit: int, evictable: Callable[[], int]) -> Callable:
        """Wrap a cache's ``evict`` with the progress property.

        An eviction asked to free something while ``evictable()`` says there is something
        must free something; and one allocation may call it at most ``limit`` times (between
        ``reset()`` calls) -- past that its retry loop does not terminate.
        """
        state, owner = {"calls": 0}, self

        def wrapped(num_tokens, *args, **kwargs):
            if not owner.checking:
                return evict(num_tokens, *args, **kwargs)
            state["calls"] += 1
            if state["calls"] > limit:
                fail("progress", f"evict called {state['calls']} times for one allocation "
                     f"(limit {limit}): the allocate-with-eviction loop does not terminate",
                     calls=state["calls"], limit=limit)
            before = evictable()
            freed = evict(num_tokens, *args, **kwargs)
            if num_tokens > 0 and before > 0 and not freed:
                fail("progress", f"evict({num_tokens}) freed nothing although the evictable "
                     f"counter says {before}", asked=num_tokens, evictable=before)
            return freed

        wrapped.reset = lambda: state.update(calls=0)  # type: ignore[attr-defined]
        return wrapped

    # -- reachability ("sometimes") coverage ----------------------------------------------
    def reached(self, name: str) -> None:
        """Count one occurrence of the interesting transition ``name`` (see the variant's
        ``VariantSpec.sometimes``); not counted while ``quiesce()`` drains."""
        if not self.quiescing:
            counts = self.__dict__.get("reached_counts")
            if counts is None:
                counts = self.reached_counts = Counter()
            counts[name] += 1

    # -- to be provided by each variant -------------------------------------------------
    def check(self) -> None:
        raise NotImplementedError

    def drain(self) -> None:
        raise NotImplementedError

    def check_quiescent(self) -> None:
        raise NotImplementedError

    def quiesce(self) -> str:
        """Finish or abort every live request, release every lock, evict everything; then the
        cache must be back to its initial state (the leak detector)."""
        self.quiescing = True
        try:
            self.drain()
        finally:
            self.quiescing = False
        self.check_quiescent()
        return "drained: only the root is left and every pool is full"

    # -- the exhaustive search's state (``kvcheck check``) ----------------------------------
    def state(self):
        """What this subject's state is, as a ``canon.TreeState`` (plain data with its node
        references, pool ids and clocks marked); None: not declared (no exhaustive search)."""
        return None

    def canonical(self) -> tuple:
        """This state up to renaming of node ids, pool ids and clocks (``canon.canonical``):
        the exhaustive search merges states whose canonical forms are equal."""
        from caches.subjects.canon import canonical

        state = self.state()
        if state is None:
            raise NotImplementedError(f"{type(self).__name__} declares no state()")
        return canonical(state)

    def outline(self) -> str:
        """The state drawn as text (an indented tree)."""
        return ""

    def tree_view(self):
        """The tree as a plain ``TreeView`` (for drawings); None if the variant has none."""
        return None

    def counters(self) -> dict:
        return {}
