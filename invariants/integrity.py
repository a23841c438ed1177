"""Data integrity: a cache hit reads back the fingerprints written when the KV was computed."""

from __future__ import annotations

from typing import Sequence

from .violation import fail


def check_fingerprints(pool: str, ids: Sequence[int], got: Sequence[int],
                       want: Sequence[int], *, what: str = "") -> None:
    """``got[i]`` (read from ``ids[i]``) must equal ``want[i]``; names the first bad position."""
    for pos, (sid, g, w) in enumerate(zip(ids, got, want)):
        if g != w:
            bad = sum(1 for a, b in zip(got, want) if a != b)
            fail("data-integrity", f"pool {pool}: {what}position {pos} reads {g} from id {sid},"
                 f" expected {w} ({bad} of {len(want)} positions wrong: the slot holds KV "
                 "written for another sequence -- freed and reused while in use, or filed "
                 "under a prefix it was not computed for)", pool=pool, position=pos, id=sid,
                 got=g, expected=w, wrong=bad)
