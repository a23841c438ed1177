"""The small pure arithmetic that KV-cache bugs hide in, with contracts.

Each function is a few integer operations with PEP 316 contracts (``pre:`` / ``post:`` in the
docstring) stated *independently* of the implementation, so a solver can prove the two agree:
``crosshair check --analysis_kind=PEP316 caches/arith.py`` (``ci/crosshair.sh``) searches for
inputs that satisfy the preconditions and break a postcondition.  ``tests/test_arith.py``
property-tests the same contracts with Hypothesis.  The reference caches call these helpers
where they do this arithmetic, so a proof here covers the code that runs.

Pure: no imports, no torch, nothing but ints (CrossHair gives up on torch).
"""

from __future__ import annotations


def ceil_align(n: int, page: int) -> int:
    """The smallest multiple of ``page`` that is >= ``n`` (where a partial page ends).

    pre: n >= 0
    pre: page >= 1
    post: __return__ % page == 0
    post: n <= __return__ < n + page
    """
    return -(-n // page) * page


def floor_align(n: int, page: int) -> int:
    """The largest multiple of ``page`` that is <= ``n`` (a key's page-aligned length).

    pre: n >= 0
    pre: page >= 1
    post: __return__ % page == 0
    post: __return__ <= n < __return__ + page
    """
    return n // page * page


def tail_free_range(prefix_len: int, allocated: int, page: int) -> tuple:
    """Slots ``[start, end)`` of a request's row that may go back to an allocator that frees
    whole pages, when its first ``prefix_len`` slots stay in use and ``allocated`` were
    allocated: ``[ceil_align(prefix_len), allocated)``, empty when that start is past the end.
    Starting at the un-aligned ``prefix_len`` frees the partial page that still holds
    committed tokens (docs/faults.md S3).

    pre: 0 <= prefix_len <= allocated
    pre: page >= 1
    post: __return__[0] <= __return__[1]
    post: __return__[0] % page == 0
    post: __return__[0] // page >= (prefix_len + page - 1) // page
    post: prefix_len <= __return__[0] < prefix_len + page
    post: __return__[1] == max(__return__[0], allocated)
    """
    start = ceil_align(prefix_len, page)
    return start, max(start, allocated)


def crosses_bigpage_boundary(old_len: int, new_len: int, big: int) -> bool:
    """Does growing a sequence from ``old_len`` to ``new_len`` tokens complete a big page,
    i.e. is there a multiple of ``big`` in ``(old_len, new_len]``?  (When a chunk crosses a
    boundary, the big-page state buffer for that boundary must be taken.)

    pre: 0 <= old_len <= new_len
    pre: big >= 1
    post: __return__ == (floor_align(new_len, big) > old_len)
    """
    return new_len // big > old_len // big


def window_releases_state(node_depth: int, window: int, commit_depth: int) -> bool:
    """Sliding-window release: a node ending at depth ``node_depth`` may drop its State
    pages once the committed depth has moved a whole window past it (``d + W <= commit``);
    until then some position of the trailing window ``[commit - W, commit)`` still needs it.

    pre: window >= 1
    pre: 0 <= node_depth <= commit_depth
    post: __return__ == (commit_depth - window >= node_depth)
    post: __return__ or node_depth > commit_depth - window
    """
    return node_depth + window <= commit_depth


def lock_transfer(ref_before: int, delta: int, size: int) -> tuple:
    """How a lock-ref change moves a node's ``size`` tokens between the size counters:
    ``(d_evictable, d_protected)``.  A node is protected while its ref is > 0, so only the
    0 -> 1 and 1 -> 0 steps move anything (docs/faults.md R1/R2).

    pre: delta == 1 or delta == -1
    pre: ref_before >= 0 and ref_before + delta >= 0
    pre: size >= 0
    post: __return__[0] + __return__[1] == 0
    post: __return__[1] == size * (int(ref_before + delta > 0) - int(ref_before > 0))
    """
    if ref_before == 0 and delta == 1:
        return -size, size
    if ref_before == 1 and delta == -1:
        return size, -size
    return 0, 0
