"""Stored prefix keys (HiCache's L3 tier): each page a storage backup writes is filed under the
hash chain of its own prefix, and no key names two prefixes.

A storage backend is a flat key -> page store; the tree finds a prefix there again only by
recomputing the same chain (the prefetch's hit query hashes the tokens past its anchor from the
anchor's last hash).  A key that is not the chain of the page's own prefix is a page no
prefetch will ever find (or, worse, one a different prefix finds: another prefix's KV read as
this one's); a key filed for two prefixes is exactly that second case.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from .violation import fail


def check_storage_keys(writes: Iterable[tuple], chain: Callable[[Sequence[int]], list],
                       page_size: int = 1) -> None:
    """``writes``: one ``(label, path_tokens, kv_keys, state_keys)`` per storage backup
    written -- ``path_tokens`` the backed-up node's whole prefix (root to its last token),
    ``kv_keys`` the keys its KV pages were stored under (the node's own pages, in order),
    ``state_keys`` those of its trailing state (the last page's key, one per sidecar write).
    ``chain(tokens)`` is the engine's key scheme: one key per whole page of ``tokens``, each
    folding in the one before it.

    Each KV key is the chain key of its own page (the node's pages are the last
    ``len(kv_keys)`` pages of its prefix), each state key is the last page's, no key appears
    twice in one write, and no key is filed for two different prefixes over all ``writes``."""
    owner: dict = {}  # key -> (prefix, label) it was first filed for
    for label, path, kv_keys, state_keys in writes:
        path = list(path)
        pages = len(path) // page_size
        want = list(chain(path[:pages * page_size]))
        if len(want) != pages:
            fail("storage-keys", f"{label}: the key scheme gave {len(want)} keys for "
                 f"{pages} pages", write=label, pages=pages, keys=len(want))
        kv_keys, state_keys = list(kv_keys), list(state_keys)
        if len(kv_keys) > pages:
            fail("storage-keys", f"{label}: {len(kv_keys)} KV pages stored for a prefix of "
                 f"{pages} pages", write=label, pages=pages, stored=len(kv_keys))
        first = pages - len(kv_keys)
        for i, key in enumerate(kv_keys):
            if key != want[first + i]:
                fail("storage-keys", f"{label}: KV page {first + i} of prefix {path} was "
                     f"stored under {key[:16]}..., not its chain key {want[first + i][:16]}...",
                     write=label, page=first + i, key=key, expected=want[first + i])
        for key in state_keys:
            if not want or key != want[-1]:
                fail("storage-keys", f"{label}: the state at the end of prefix {path} was "
                     f"stored under {key[:16]}..., not its last page's chain key",
                     write=label, key=key, expected=want[-1] if want else None)
        if len(set(kv_keys)) != len(kv_keys):
            twice = sorted({k for k in kv_keys if kv_keys.count(k) > 1})
            fail("storage-keys", f"{label}: key(s) {[k[:16] for k in twice]} stored twice in "
                 f"one write of prefix {path}", write=label, keys=twice)
        for i, key in enumerate(kv_keys):
            prefix = tuple(path[:(first + i + 1) * page_size])
            seen = owner.setdefault(key, (prefix, label))
            if seen[0] != prefix:
                fail("storage-keys", f"key {key[:16]}... is filed for two prefixes: "
                     f"{list(seen[0])} ({seen[1]}) and {list(prefix)} ({label})", key=key,
                     first=list(seen[0]), second=list(prefix))
